"""A copy of every piece of training state, taken once and restored before each experiment.

Restoring is exact: weights and buffers, optimizer moments and hyper-parameters, scheduler,
grad scaler, the RNG streams (python, numpy, torch CPU and CUDA) and each module's train/eval mode.

Memory: the copy lives on the CPU whatever the model's device (a GPU keeps its memory for the
experiments), and there is one copy: restoring copies into the model's and the optimizer's own tensors
rather than loading a second copy. With `spill_dir` its tensors are written to a file there and read
back memory-mapped, so the operating system pages them in and out as restores need them (as
pytorch-lr-finder's state cacher keeps its state on disk).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch

from triage.errors import SetupError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    model: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]  # all of them: state_dict() leaves out non-persistent buffers
    training_modes: dict[str, bool]
    requires_grad: dict[str, bool]
    optimizer: dict[str, Any]
    scheduler: Optional[dict[str, Any]]
    scaler: Optional[dict[str, Any]]
    rng: dict[str, Any]

    @classmethod
    def take(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scheduler: Any = None, scaler: Any = None, spill_dir: Optional[Path] = None) -> "Snapshot":
        state = model.state_dict(keep_vars=False)
        persistent = {id(v) for v in state.values()}
        live = {
            "model": state,
            # all buffers (state_dict() leaves out non-persistent ones); the persistent ones are in "model"
            "buffers": {k: b.detach() for k, b in model.named_buffers() if id(b) not in persistent},
            "optimizer": optimizer.state_dict(),
        }
        # Spilled, the live tensors are written straight to the file: no copy in memory at any time.
        tensors = _spill(live, Path(spill_dir)) if spill_dir is not None else _cpu_copy(live)
        buffers = {k: tensors["buffers"].get(k, tensors["model"].get(k)) for k, _ in model.named_buffers()}
        return cls(
            model=tensors["model"],
            buffers=buffers,
            training_modes={name: m.training for name, m in model.named_modules()},
            requires_grad={name: p.requires_grad for name, p in model.named_parameters()},
            optimizer=tensors["optimizer"],
            scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
            scaler=copy.deepcopy(scaler.state_dict()) if scaler is not None else None,
            rng=rng_state(),
        )

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: Any = None, scaler: Any = None) -> None:
        with torch.no_grad():
            model.load_state_dict(self.model)  # copies into the model's own tensors, across devices
            for name, buffer in model.named_buffers():
                buffer.copy_(self.buffers[name])
        for name, module in model.named_modules():
            module.training = self.training_modes[name]
        for name, param in model.named_parameters():
            param.requires_grad_(self.requires_grad[name])
            param.grad = None
        if not _copy_into(optimizer, self.optimizer):
            # Another layout than the snapshot's (an experiment replaced the state): load a copy.
            # load_state_dict keeps references into what it is given, hence the copy.
            optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        if scheduler is not None and self.scheduler is not None:
            scheduler.load_state_dict(copy.deepcopy(self.scheduler))
        if scaler is not None and self.scaler is not None:
            # A GradScaler also remembers, per optimizer, that unscale_() ran in the step under way: an
            # experiment stopped between unscale_() and update() (a non-finite loss) would make the next
            # one's unscale_() raise. Its state_dict does not hold that; the fresh per-step state is empty.
            per_optimizer = getattr(scaler, "_per_optimizer_states", None)
            if per_optimizer is not None:
                per_optimizer.clear()
            scaler.load_state_dict(copy.deepcopy(self.scaler))
        set_rng_state(self.rng)


def _cpu_copy(value: Any) -> Any:
    """A copy of a (nested) state on the CPU: tensors cloned there, everything else deep-copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


def _copy_into(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> bool:
    """Restore the optimizer by copying the saved state into its own tensors (no second copy of the
    moments). False, with nothing changed, when its layout differs from the saved one."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = saved["param_groups"]
    if len(groups) != len(optimizer.param_groups) or \
            any(len(g["params"]) != len(live["params"]) for g, live in zip(groups, optimizer.param_groups)):
        return False
    by_index = {i: p for i, p in enumerate(params)}
    saved_state = saved["state"]
    live_state = {i: optimizer.state[p] for i, p in by_index.items() if p in optimizer.state and optimizer.state[p]}
    if set(saved_state) != set(live_state):
        return False
    for i, values in saved_state.items():
        live = live_state[i]
        if set(values) != set(live):
            return False
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and not (
                    isinstance(live[key], torch.Tensor) and live[key].shape == value.shape
                    and live[key].dtype == value.dtype):
                return False
    with torch.no_grad():
        for i, values in saved_state.items():
            live = live_state[i]
            for key, value in values.items():
                if isinstance(value, torch.Tensor):
                    live[key].copy_(value)
                else:
                    live[key] = copy.deepcopy(value)
    for group, saved_group in zip(optimizer.param_groups, groups):
        for key, value in saved_group.items():
            if key != "params":
                group[key] = copy.deepcopy(value)
    return True


def _spill(tensors: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Write the snapshot's tensors to a file under `folder` and read them back memory-mapped: pages the
    OS can drop and read again, copy-on-write (a restore only reads them). The file is unlinked once
    mapped, so nothing is left behind however triage ends; its space is freed when triage exits."""
    where = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        where = Path(tempfile.mkdtemp(prefix="triage-snapshot-", dir=folder))
        path = where / "snapshot.pt"
        torch.save(tensors, path)
        size = path.stat().st_size
        mapped = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (OSError, RuntimeError) as exc:
        if where is not None:  # a full disk: the part written is removed, nothing is left behind
            shutil.rmtree(where, ignore_errors=True)
        raise SetupError(f"Expected to keep the snapshot in '{folder}', found it cannot be written there "
                         f"({exc}). Pass another --snapshot-dir with room for about the checkpoint's size, "
                         "or leave it out to keep the snapshot in memory.") from None
    try:
        shutil.rmtree(where)
    except OSError:  # a system that cannot unlink an open file: removed at exit instead
        atexit.register(shutil.rmtree, where, True)
    log.info("snapshot spilled to %s (%.0f MiB, memory-mapped)", folder, size / 2**20)
    return mapped


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def untouched_buffers_and_rng(model: torch.nn.Module) -> Iterator[None]:
    """An extra forward inside someone else's run: BatchNorm statistics and RNG streams stay as they were."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rng = rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        set_rng_state(rng)
