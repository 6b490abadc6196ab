"""Checkpoints of distributed runs.

- A torch.distributed.checkpoint (DCP) folder (`.metadata` and `__<rank>_0.distcp` shards), as
  `dcp.save({"model": ..., "optimizer": ...}, checkpoint_id=folder)` writes it, with the state dicts of
  `get_state_dict(model, optimizer)`. It is loaded in place onto the model and optimizer setup() built,
  resharded as needed (an FSDP2 save loads into FSDP2 on another number of ranks, into DDP, or into a
  single process), through `torch.distributed.checkpoint.state_dict`'s get/set_state_dict. Top-level
  names: `model` | `model_state_dict` | `state_dict` and `optimizer` | `optim` | `optimizer_state_dict`,
  optionally under one Stateful entry (`app.model`, ...); an int `step` beside them is read too.
- A full state dict (any single-file layout of triage/load/checkpoint.py, as rank 0 saves it) into a model
  wrapped in DDP (loaded into its `.module` on every rank) or sharded with FSDP2 (each rank keeps its
  shard: set_model_state_dict / set_optimizer_state_dict with full_state_dict=True).

Nothing is written: DCP reads the folder, and a full state dict is read with weights_only like any other.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from triage.load.wrappers import is_sharded
from triage.errors import CheckpointError

MODEL_NAMES = ("model", "model_state_dict", "state_dict")
OPTIMIZER_NAMES = ("optimizer", "optim", "optimizer_state_dict")
METADATA = ".metadata"


def is_dcp_folder(path: Path) -> bool:
    return path.is_dir() and (path / METADATA).is_file()


@dataclasses.dataclass(frozen=True)
class DcpLayout:
    """Where a DCP folder keeps the model and optimizer: their dotted names in its metadata."""

    folder: Path
    model: str
    optimizer: Optional[str]
    step: Optional[str]


def read_dcp_layout(folder: Path) -> DcpLayout:
    from torch.distributed.checkpoint import FileSystemReader

    try:
        keys = list(FileSystemReader(str(folder)).read_metadata().state_dict_metadata)
    except Exception as exc:
        raise CheckpointError(f"Expected '{folder}' to be a torch.distributed.checkpoint folder, found its "
                              f"{METADATA} unreadable ({type(exc).__name__}: {exc}). Check the path, or whether "
                              "the save finished.") from exc
    model = _prefix(keys, MODEL_NAMES)
    if model is None:
        tops = sorted({k.split(".")[0] for k in keys})[:12]
        raise CheckpointError(f"Expected the DCP folder '{folder}' to hold the model under one of "
                              f"{', '.join(MODEL_NAMES)}, found the entries {tops}. Save with "
                              "dcp.save({'model': model_state_dict, 'optimizer': optim_state_dict}, ...).")
    outer = model.rpartition(".")[0]
    optimizer = _prefix([k for k in keys if k.startswith(outer)], OPTIMIZER_NAMES)
    step = f"{outer}.step" if outer else "step"
    return DcpLayout(folder, model, optimizer, step if step in keys else None)


def _prefix(keys: list[str], names: tuple[str, ...]) -> Optional[str]:
    """`name` or `outer.name` (one Stateful level) that begins some key, for the first name that does."""
    for name in names:
        for key in keys:
            parts = key.split(".")
            if parts[0] == name:
                return name
            if len(parts) > 2 and parts[1] == name:
                return f"{parts[0]}.{name}"
    return None


def read_dcp_step(layout: DcpLayout) -> Optional[int]:
    """The `step` saved beside the model, read on this process alone (no collective)."""
    if layout.step is None:
        return None
    import torch.distributed.checkpoint as dcp

    state: dict[str, Any] = {}
    _place(state, layout.step, 0)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore")
            dcp.load(state, checkpoint_id=str(layout.folder), no_dist=True)
    except Exception:  # a step of another kind (a tensor of another shape, ...): the step is optional
        return None
    step = _take(state, layout.step)
    return int(step) if isinstance(step, (int, float, torch.Tensor)) else None


def load_dcp(model: torch.nn.Module, optimizer: torch.optim.Optimizer, layout: DcpLayout) -> set[str]:
    """Load the folder onto `model` and `optimizer` in place; returns the parts loaded."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict

    if layout.optimizer:
        model_sd, optim_sd = get_state_dict(model, optimizer)
    else:
        model_sd, optim_sd = get_model_state_dict(model), None
    state: dict[str, Any] = {}
    _place(state, layout.model, model_sd)
    if optim_sd is not None:
        _place(state, layout.optimizer, optim_sd)
    try:
        with warnings.catch_warnings():  # a single process loading a sharded save: that is the intent
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(state, checkpoint_id=str(layout.folder))
        set_state_dict(model, optimizer, model_state_dict=_take(state, layout.model),
                       optim_state_dict=_take(state, layout.optimizer) if optim_sd is not None else {})
    except Exception as exc:
        raise CheckpointError(
            f"Expected the DCP folder '{layout.folder}' to fit the model and optimizer setup() built, found a "
            f"mismatch: {_first_line(exc)}. Check that --entry builds the same architecture and optimizer the "
            "run saved (the names are the model's own, without DDP's `module.` prefix).") from exc
    return {"model", "optimizer"} if optim_sd is not None else {"model"}


def _place(state: dict[str, Any], dotted: str, value: Any) -> None:
    *outer, last = dotted.split(".")
    for part in outer:
        state = state.setdefault(part, {})
    state[last] = value


def _take(state: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        state = state[part]
    return state


def load_full_into_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                           model_state: dict[str, torch.Tensor], optimizer_state: Optional[dict[str, Any]],
                           path: Path) -> None:
    """A full (unsharded) state dict, as rank 0 saved it, into an FSDP2 model: each rank keeps its shard."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    try:
        set_model_state_dict(model, model_state, options=options)
        if optimizer_state is not None:
            set_optimizer_state_dict(model, optimizer, _by_name(model, optimizer, optimizer_state), options=options)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"Expected the checkpoint '{path}' to fit the sharded (FSDP2) model setup() built, found a mismatch: "
            f"{_first_line(exc)}. Check the architecture, or save the run with torch.distributed.checkpoint "
            "(a DCP folder loads onto any sharding).") from exc


def _by_name(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """optimizer.state_dict() keys its states by position in param_groups; set_optimizer_state_dict wants
    the parameters' names: position i is the i-th parameter the optimizer holds (as setup() built it)."""
    groups = state.get("param_groups") or []
    if not groups or all(isinstance(p, str) for g in groups for p in g.get("params", [])):
        return state
    name_of = {id(p): n for n, p in model.named_parameters()}
    held = [name_of.get(id(p)) for g in optimizer.param_groups for p in g["params"]]
    saved = [i for g in groups for i in g["params"]]
    if len(saved) != len(held) or None in held:
        raise CheckpointError(f"Expected the checkpoint's optimizer state to hold {len(held)} parameters in the "
                              f"order setup()'s optimizer holds them, found {len(saved)}. Build the same "
                              "optimizer (parameter groups) the run saved.")
    names = dict(zip(saved, held))
    return {"state": {names[i]: s for i, s in state.get("state", {}).items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups]}


def load_distributed(setup: Any, checkpoint: Any, path: Path) -> set[str]:
    """Load the model (and optimizer) where a DCP folder or an FSDP2 model needs it; returns the parts
    loaded (none: the ordinary path applies, into DDP's `.module` for a DDP model)."""
    if checkpoint.layout == "dcp":
        return load_dcp(setup.model, setup.optimizer, read_dcp_layout(checkpoint.folder))
    if is_sharded(setup.model):
        load_full_into_sharded(setup.model, setup.optimizer, checkpoint.model_state, checkpoint.optimizer_state, path)
        return {"model", "optimizer"} if checkpoint.optimizer_state is not None else {"model"}
    return set()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
