"""Reading a checkpoint into its parts, whatever layout the run saved it in.

Layouts understood (DESIGN §1):
- a plain dict: `model` | `model_state_dict` | `state_dict` (else its one entry of tensors alone, whatever its
  name), `optimizer` | `optimizer_state_dict` (else its one entry shaped as `Optimizer.state_dict()`),
  optional `scheduler`, `scaler`, `step`, `history` (or `losses`, `loss_history`, `train_losses`,
  `train_loss_history`);
- a bare model state_dict (every value a tensor);
- a PyTorch Lightning `.ckpt` (`state_dict`, `optimizer_states`, `lr_schedulers`, `global_step`);
- a Hugging Face Trainer checkpoint folder (`pytorch_model.bin` or `model.safetensors`,
  `optimizer.pt`, `scheduler.pt`, `trainer_state.json`);
- a capture folder written by the flight recorder (`manifest.json` naming one of the above, and the
  run's `history.csv`);
- a torch.distributed.checkpoint folder (`.metadata`): loaded in place onto the model setup() built
  (triage/load/dcp.py). A path with `{rank}` in it names one file per rank.

`read_checkpoint` is the one place a layout is recognised: what comes after reads the typed Checkpoint
(a capture's manifest included) instead of recognising it again. Read later from the files: a DCP
folder's tensors (loaded in place once setup() has built the model, dcp.py) and a capture's batches
(`load_batches`, which setup() may call itself).

Files are opened read-only with `torch.load(weights_only=True)` unless the user trusts them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import torch

from triage.load.dcp import is_dcp_folder, read_dcp_layout, read_dcp_step
from triage.errors import CheckpointError
from triage.flight.manifest import HISTORY, CaptureManifest, is_capture, read_manifest
from triage.flight.places import is_report_folder
from triage.load.history import HistoryPoint, history_from_log_entries, history_from_value, read_history_file
from triage.ties import fill_tied_keys

log = logging.getLogger(__name__)

_MODEL_KEYS = ("model", "model_state_dict", "state_dict")
_OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict")


# What read_checkpoint recognised; a capture folder keeps the layout of the checkpoint inside it.
Layout = Literal["dict", "state_dict", "module", "lightning", "huggingface", "dcp"]


@dataclass(frozen=True)
class Checkpoint:
    """The parts of a checkpoint; any but `model_state` may be missing."""

    layout: Layout
    model_state: dict[str, torch.Tensor]
    optimizer_state: Optional[dict[str, Any]] = None
    scheduler_state: Optional[dict[str, Any]] = None
    scaler_state: Optional[dict[str, Any]] = None
    step: Optional[int] = None
    step_source: Optional[str] = None  # where `step` was read, in words ("the checkpoint's 'iter_num'")
    epoch: Optional[int] = None  # the run's epoch, where it saved one: the step once steps per epoch are known
    notes: tuple[tuple[str, str], ...] = ()  # (finding id, text): what reading left out (an unusable step, say)
    history: list[HistoryPoint] = field(default_factory=list)
    hyper_parameters: dict[str, Any] = field(default_factory=dict)  # a Lightning module's saved hparams
    datamodule_hyper_parameters: dict[str, Any] = field(default_factory=dict)
    capture_dir: Optional[Path] = None  # the capture folder this checkpoint came from, if any
    manifest: Optional[CaptureManifest] = None  # that capture's manifest, read here once for every reader
    folder: Optional[Path] = None  # a DCP folder: loaded in place, onto the model and optimizer setup() built

    def without_tensors(self) -> "Checkpoint":
        """The same checkpoint without its model and optimizer state: once they are loaded into the model
        and optimizer, a session keeps no second copy (the step, history and settings stay)."""
        return dataclasses.replace(self, model_state={}, optimizer_state=None)


def read_checkpoint(path: Path, trusted: bool = False) -> Checkpoint:
    path = rank_path(Path(path))
    if not path.exists():
        raise CheckpointError(
            f"Expected a checkpoint at '{path}', found no such file or folder. "
            "Pass the path of the .pt/.ckpt file (or Hugging Face checkpoint folder) your run saved."
        )
    if not path.is_dir() and not path.is_file():  # /dev/zero, a FIFO, a socket: reading it may never end
        raise CheckpointError(
            f"Expected a checkpoint at '{path}' to be a file or a folder, found {_kind_of(path)}. Pass the .pt/.ckpt "
            "file (or the checkpoint folder) your run saved, not a device or a pipe."
        )
    if is_capture(path):
        return _read_capture(path, trusted)
    if is_dcp_folder(path):
        layout = read_dcp_layout(path)
        step = read_dcp_step(layout)
        return Checkpoint(layout="dcp", model_state={}, folder=path.absolute(), step=step,
                          step_source="the distributed checkpoint's step" if step is not None else None)
    if path.is_dir():
        return _read_hf_folder(path, trusted)
    return _read_dict(_load(path, trusted), path)


def _kind_of(path: Path) -> str:
    if path.is_char_device() or path.is_block_device():
        return "a device"
    if path.is_fifo():
        return "a pipe (FIFO)"
    if path.is_socket():
        return "a socket"
    return "something that is neither"


def rank_path(path: Path) -> Path:
    """A path with `{rank}` in it (one checkpoint file per rank), for this process's rank."""
    if "{rank}" not in str(path):
        return path
    from triage.load.ranks import current

    return Path(str(path).replace("{rank}", str(current().rank)))


def _load(path: Path, trusted: bool) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as exc:
        refused = _GLOBAL.search(str(exc)) or ("unsupported" in str(exc).lower() and _looks_saved(path))
        raise CheckpointError(_refused(path, exc) if refused else _unreadable(path, exc)) from exc
    except (ImportError, AttributeError) as exc:  # unpickling (trusted) needs a class that cannot be imported
        missing = _missing_class(path, exc) if trusted else None
        raise CheckpointError(missing or _unreadable(path, exc)) from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, zipfile errors, ...
        raise CheckpointError(_unreadable(path, exc)) from exc


def _looks_saved(path: Path) -> bool:
    """Written by torch.save (a zip archive, or the legacy format's pickle), not random bytes."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as handle:
        return handle.read(1) == b"\x80"  # a binary pickle's PROTO opcode


_BLOCKED = re.compile(r"unsupported GLOBAL ([\w.]+) whose module ([\w.]+) is blocked", re.I)
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _refused(path: Path, exc: BaseException) -> str:
    """What weights_only=True refused, named: a blocked function (the file would run it), a pickled
    module (torch.save(model)), another class, or pickle content it does not accept."""
    text = str(exc)
    blocked = _BLOCKED.search(text)
    if blocked:
        return (f"Expected '{path}' to hold only tensors and plain containers (it is loaded with "
                f"weights_only=True), found a pickle that calls {blocked.group(1)}: loading it fully would run "
                f"that function. This is not a plain checkpoint; do not pass --trust-checkpoint unless you know "
                f"why it calls {blocked.group(1)}. Re-save the state dicts with torch.save({{'model': "
                "model.state_dict(), ...}}).")
    found = _GLOBAL.search(text)
    if found and found.group(1).startswith("torch.nn.modules."):
        return (f"Expected '{path}' to hold a state dict, found a whole pickled module ({found.group(1)}), as "
                "torch.save(model) writes. Re-save it with torch.save(model.state_dict(), path); or, if you "
                "trust the file, pass --trust-checkpoint: triage unpickles it and takes its state_dict().")
    if found:
        return (f"Expected '{path}' to hold only tensors and plain containers (it is loaded with "
                f"weights_only=True), found a pickled object of type {found.group(1)}. If it is your model "
                "saved with torch.save(model), re-save model.state_dict(); if you trust this file, re-run with "
                "--trust-checkpoint to unpickle it fully (triage takes a module's state_dict()).")
    detail = next((line.strip() for line in text.splitlines() if "unsupported" in line.lower()), _first_line(exc))
    return (f"Expected '{path}' to hold only tensors and plain containers (it is loaded with weights_only=True), "
            f"found pickled content that loading refuses ({detail[:300]}). If you trust this file, re-run with "
            "--trust-checkpoint.")


_NO_ATTRIBUTE = re.compile(r"Can't get attribute '([\w.]+)' on <module '([\w.]+)'")


def _missing_class(path: Path, exc: BaseException) -> Optional[str]:
    """The class a trusted unpickle needs and cannot import, named with its module and what to do."""
    found = _NO_ATTRIBUTE.search(str(exc))
    try:
        wanted = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001  (only a help for the message)
        wanted = []
    if found:  # the module as the pickle names it (`__main__`, which the error shows as the running module)
        named = next((g for g in wanted if g.endswith("." + found.group(1))), None)
        module = named[: -len(found.group(1)) - 1] if named else found.group(2)
    else:
        module = getattr(exc, "name", None)
    if not module:
        return None
    names = [g for g in wanted if g.rsplit(".", 1)[0] == module or g.startswith(module + ".")]
    if found:
        names = names or [f"{module}.{found.group(1)}"]
    shown = ", ".join(names[:4]) or f"a class from the module '{module}'"
    if module == "__main__":
        return (f"Expected to unpickle '{path}' (--trust-checkpoint), found it holds {shown}: a class defined in the "
                f"script that saved it (run as __main__), which no other program can import. Load it in that "
                "script and re-save model.state_dict() with torch.save, or move the class into a module and "
                "save again.")
    if found:
        return (f"Expected to unpickle '{path}' (--trust-checkpoint), found it needs {shown}, and the module "
                f"'{module}' has no '{found.group(1)}' (renamed or moved since the checkpoint was saved?). Import "
                f"the module that defines it as it was then, or re-save the checkpoint with model.state_dict().")
    return (f"Expected to unpickle '{path}' (--trust-checkpoint), found it needs {shown}, and the module "
            f"'{module}' cannot be imported here ({_first_line(exc)}). Run triage where `import {module}` works "
            f"(from the project's folder, or with it on PYTHONPATH), or re-save the checkpoint with "
            "model.state_dict().")


def _unreadable(path: Path, exc: BaseException) -> str:
    return (f"Expected '{path}' to be a checkpoint written by torch.save, but it could not be read "
            f"({type(exc).__name__}: {_first_line(exc)}). Check the path, or whether the file was "
            "truncated while the run was writing it.")


def _read_dict(data: Any, path: Path) -> Checkpoint:
    if isinstance(data, torch.nn.Module):  # torch.save(model), unpickled under --trust-checkpoint
        log.warning("%s holds a whole pickled %s, not a state dict: using its state_dict()", path,
                    type(data).__name__)
        return Checkpoint(layout="module", model_state=data.state_dict())
    if isinstance(data, dict):  # {"model": model, "optimizer": optimizer} pickled whole (trusted)
        data = {k: v.state_dict() if isinstance(v, (torch.nn.Module, torch.optim.Optimizer)) else v
                for k, v in data.items()}
    if not isinstance(data, dict) or not data:
        raise CheckpointError(
            f"Expected '{path}' to hold a dict (a state_dict or a dict with a 'model' entry), "
            f"found {type(data).__name__}. Save the run with torch.save({{'model': model.state_dict(), "
            "'optimizer': optimizer.state_dict(), ...}}, path)."
        )
    if all(isinstance(v, torch.Tensor) for v in data.values()):
        return Checkpoint(layout="state_dict", model_state=data)
    if "pytorch-lightning_version" in data or "optimizer_states" in data:
        return _read_lightning(data)
    model_key = next((k for k in _MODEL_KEYS if isinstance(data.get(k), dict)), None)
    if model_key is None:
        # An entry of another name (Deep-SVDD's 'net_dict', a 'generator' beside its 'optimizer'): the one
        # entry whose every value is a tensor, where there is exactly one.
        tensor_dicts = [k for k, v in data.items() if isinstance(v, dict) and v
                        and all(isinstance(t, torch.Tensor) for t in v.values())]
        model_key = tensor_dicts[0] if len(tensor_dicts) == 1 else None
    if model_key is None:
        raise CheckpointError(
            f"Expected '{path}' to have one of the entries {', '.join(_MODEL_KEYS)} holding the "
            f"model's state_dict (or exactly one entry holding tensors alone), found the entries "
            f"{sorted(map(str, data))[:12]}. Re-save with a 'model' entry, or save model.state_dict() alone."
        )
    optimizer_key = next((k for k in _OPTIMIZER_KEYS if isinstance(data.get(k), dict)), None)
    if optimizer_key is None:  # else its one entry shaped as Optimizer.state_dict(), whatever its name
        shaped = [k for k, v in data.items() if isinstance(v, dict) and {"state", "param_groups"} <= v.keys()]
        optimizer_key = shaped[0] if len(shaped) == 1 else None
    history_key = next((k for k in _HISTORY_KEYS if data.get(k) is not None), "history")
    return Checkpoint(
        layout="dict",
        model_state=data[model_key],
        optimizer_state=data.get(optimizer_key) if optimizer_key else None,
        scheduler_state=data.get("scheduler"),
        scaler_state=data.get("scaler"),
        **_with_history(read_step(data, _STEP_KEYS), lambda: history_from_value(data.get(history_key)),
                        f"the checkpoint's '{history_key}'"),
    )


def _read_lightning(data: dict[str, Any]) -> Checkpoint:
    optimizers = data.get("optimizer_states") or [None]
    schedulers = data.get("lr_schedulers") or [None]
    return Checkpoint(
        layout="lightning",
        model_state=data["state_dict"],
        optimizer_state=optimizers[0],
        scheduler_state=schedulers[0],
        scaler_state=data.get("MixedPrecision") or data.get("native_amp_scaling_state"),
        **read_step(data, ("global_step",), "Lightning's"),
        hyper_parameters=_plain_dict(data.get("hyper_parameters")),
        datamodule_hyper_parameters=_plain_dict(data.get("datamodule_hyper_parameters")),
    )


def _plain_dict(value: Any) -> dict[str, Any]:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else {}


def _read_capture(folder: Path, trusted: bool) -> Checkpoint:
    """A flight-recorder capture: the checkpoint its manifest names, with the run's full history."""
    manifest = read_manifest(folder)
    inner = folder / manifest.checkpoint
    if not inner.exists():
        raise CheckpointError(f"Expected the capture '{folder}' to hold {manifest.checkpoint} as its manifest "
                              "says, found no such file. The capture is incomplete: re-capture.")
    checkpoint = read_checkpoint(inner, trusted)
    history = checkpoint.history
    if (folder / HISTORY).is_file():
        try:
            history = read_history_file(folder / HISTORY)
        except CheckpointError as exc:  # e.g. a Trainer whose custom loss the recorder could not see
            log.warning("capture %s: no loss history (%s)", folder, exc)
    return dataclasses.replace(checkpoint, step=manifest.checkpoint_step, step_source="the capture's manifest",
                               history=history, capture_dir=folder.absolute(), manifest=manifest)


def _read_hf_folder(folder: Path, trusted: bool) -> Checkpoint:
    weights = folder / "model.safetensors"
    if weights.exists():
        try:
            from safetensors.torch import load_file
        except ImportError as exc:
            raise CheckpointError(
                f"Expected to read '{weights}', but the safetensors package is not installed. "
                "Run `pip install safetensors`."
            ) from exc
        try:
            model_state = load_file(str(weights), device="cpu")
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise CheckpointError(_unreadable(weights, exc)) from exc
    elif (folder / "pytorch_model.bin").exists():
        model_state = _load(folder / "pytorch_model.bin", trusted)
    elif is_report_folder(folder):
        read_manifest(folder)  # raises: a watcher's report folder, naming the capture it belongs to
    else:
        raise CheckpointError(
            f"Expected the folder '{folder}' to be a Hugging Face Trainer checkpoint with "
            "model.safetensors or pytorch_model.bin, found neither. Pass the checkpoint-N folder itself."
        )
    state_file = folder / "trainer_state.json"  # only the step and the loss history: never worth a refusal
    try:
        trainer_state = json.loads(state_file.read_text()) if state_file.exists() else {}
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"Expected '{state_file}' to be JSON, found it unreadable ({exc}). "
                              "Fix or remove it (it only carries the step and the loss history).") from None
    if not isinstance(trainer_state, dict):
        raise CheckpointError(f"Expected '{state_file}' to hold a JSON object, found a {type(trainer_state).__name__}. "
                              "Fix or remove it (it only carries the step and the loss history).")
    optional = {name: folder / f"{name}.pt" for name in ("optimizer", "scheduler", "scaler")}
    parts = {name: _load(p, trusted) if p.exists() else None for name, p in optional.items()}
    return Checkpoint(
        layout="huggingface",
        model_state=model_state,
        optimizer_state=parts["optimizer"],
        scheduler_state=parts["scheduler"],
        scaler_state=parts["scaler"],
        **_with_history(read_step(trainer_state, ("global_step",), "trainer_state.json's"),
                        lambda: history_from_log_entries(trainer_state.get("log_history") or []),
                        "trainer_state.json's 'log_history'"),
    )


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> list[str]:
    """Load `state` into `model`, mapping wrapper prefixes both ways (`_orig_mod.` of torch.compile,
    `module.` of DataParallel/DDP, a Lightning module's `model.`) and filling keys left out because they are
    tied to a key that is present (triage/ties.py). Returns what was mapped, in words (empty: nothing)."""
    expected = set(model.state_dict())
    state, notes = _match_prefixes(state, expected)
    state, _ = fill_tied_keys(model, state)
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"Expected the checkpoint '{path}' to fit the model setup() built, found "
            f"{len(missing)} missing keys {missing[:5]} and {len(unexpected)} unexpected keys "
            f"{unexpected[:5]}. Check that --entry builds the same architecture the run saved."
        )
    own = model.state_dict()
    wrong = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in own
             if isinstance(state.get(k), torch.Tensor) and tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        shown = "; ".join(f"{k}: checkpoint {a}, model {b}" for k, a, b in wrong[:10])
        more = f"; and {len(wrong) - 10} more" if len(wrong) > 10 else ""
        raise CheckpointError(
            f"Expected the checkpoint '{path}' tensors to have the model's shapes, found {len(wrong)} that "
            f"differ: {shown}{more}. Check that setup() builds the same sizes the run used."
        )
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"Expected the checkpoint '{path}' tensors to have the model's shapes, found a "
            f"mismatch: {_first_line(exc)}. Check that setup() builds the same sizes the run used."
        ) from exc
    return notes


# What wraps a model and prefixes every key of its state_dict: torch.compile, DataParallel/DDP.
_WRAPPERS = {"_orig_mod.": "torch.compile", "module.": "DataParallel/DDP"}


def _match_prefixes(state: dict[str, Any], expected: set[str]) -> tuple[dict[str, Any], list[str]]:
    """`state` with its keys' wrapper prefixes replaced by the model's: a compiled or wrapped model's
    checkpoint loads into a plain model, and a plain checkpoint into a compiled or wrapped one."""
    if not state or not expected or set(state) & expected:
        return state, []
    saved_prefix, own_prefix = _wrapper_prefix(state), _wrapper_prefix(expected)
    bare = {k[len(saved_prefix):]: v for k, v in state.items()}
    own_bare = {k[len(own_prefix):] for k in expected}
    if not set(bare) & own_bare:  # a Lightning module's `self.model`: keys of the other attributes left out
        for prefix in ("model.", "model.module."):
            stripped = {k[len(prefix):]: v for k, v in bare.items() if k.startswith(prefix)}
            if set(stripped) & own_bare:
                bare, saved_prefix = stripped, saved_prefix + prefix
                break
    if not set(bare) & own_bare:
        return state, []
    mapped = {own_prefix + k: v for k, v in bare.items()}
    wrapped = [f"'{p}' ({_WRAPPERS[p]})" for p in _split(saved_prefix) if p in _WRAPPERS]
    wanted = [f"'{p}' ({_WRAPPERS[p]})" for p in _split(own_prefix)]
    if not wrapped and not wanted:
        return mapped, []  # `model.` alone: a framework's attribute name, not a wrapper
    said = (f"the checkpoint's {len(state)} model keys start with {' then '.join(wrapped) or 'no wrapper prefix'} "
            f"and the model setup() built expects {' then '.join(wanted) or 'none'}: each key was mapped "
            f"(e.g. '{next(iter(state))}' -> '{next(iter(mapped))}')")
    return mapped, [said]


def _wrapper_prefix(keys) -> str:
    """The wrapper prefixes every key starts with, outermost first ('' when none)."""
    prefix = ""
    keys = list(keys)
    while True:
        found = next((p for p in _WRAPPERS if all(k.startswith(prefix + p) for k in keys)), None)
        if found is None:
            return prefix
        prefix += found


def _split(prefix: str) -> list[str]:
    return [part + "." for part in prefix.split(".") if part] if prefix else []


# The names real runs save their step under, most specific first (nanoGPT's `iter_num`, HF's `global_step`).
_STEP_KEYS = ("step", "global_step", "iter_num", "iteration", "iter", "num_updates")
# The run's loss log: `history`, else the names training scripts commonly save theirs under.
_HISTORY_KEYS = ("history", "losses", "loss_history", "train_losses", "train_loss_history")


def read_step(data: dict[str, Any], keys: tuple[str, ...], owner: str = "the checkpoint's") -> dict[str, Any]:
    """The step (and epoch) a checkpoint saved, with where it came from: the first of `keys` holding a usable
    step, else the epoch alone. A value that is no step (inf, NaN, negative, a tensor of several values, a
    fraction, text) is left out with a note saying so: it never stops the triage."""
    notes: list[str] = []
    found: dict[str, Any] = {}
    for key in (*keys, "epoch"):
        if key not in data:
            continue
        value, problem = _as_count(data[key])
        if problem:
            notes.append(f"{owner} '{key}' is {problem}, not a step count")
            continue
        if key == "epoch":
            found["epoch"] = value
        elif "step" not in found:
            found.update(step=value, step_source=f"{owner} '{key}'")
    if "step" not in found and "epoch" in found:
        found["step_source"] = f"{owner} 'epoch' ({found['epoch']}; the step needs the steps per epoch)"
    if notes:
        log.warning("the checkpoint's step was left out: %s", "; ".join(notes))
    said = tuple(("checkpoint_step_left_out", f"The checkpoint's step was left out: {n}.") for n in notes)
    return {**found, "notes": said}


def _with_history(found: dict[str, Any], read: Any, where: str) -> dict[str, Any]:
    """`found` (read_step's) with the history `read()` returns; a history that cannot be read (a row whose
    step is inf or NaN) is left out with a note: the baseline replay then stands in for the loss curve."""
    try:
        return {**found, "history": read()}
    except (ValueError, TypeError, AttributeError, CheckpointError) as exc:
        note = f"{where} was left out ({_first_line(exc)}); the loss curve is the baseline replay's"
        log.warning("%s", note)
        said = ("checkpoint_history_left_out", note[0].upper() + note[1:] + ".")
        return {**found, "notes": (*found.get("notes", ()), said)}


def _as_count(value: Any) -> tuple[Optional[int], Optional[str]]:
    """(the non-negative whole number `value` holds, None) or (None, what it is instead)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            return None, f"a tensor of {value.numel()} values (shape {tuple(value.shape)})"
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = repr(value)
        return None, f"{type(value).__name__} {shown[:40]}{'...' if len(shown) > 40 else ''}"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None, str(value)
    if value != int(value):
        return None, f"the fraction {value}"
    if value < 0:
        return None, f"negative ({int(value)})"
    return int(value), None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
