"""`triage.Recorder`: the flight recorder for a plain PyTorch loop.

    recorder = triage.Recorder(model, optimizer, scheduler=sched, dir="captures", entry="mymod:setup")
    for batch in loader:
        loss = loss_fn(model, batch); loss.backward(); optimizer.step(); sched.step()
        recorder.step(loss, batch)          # last in the step: after optimizer.step(), before zero_grad()
        optimizer.zero_grad()

Bounds, with the default settings: CPU memory of one copy of the model and optimizer state (two for the
moment a new snapshot is copied), at most `keep_batches` batches within `max_batch_mb`, and `history_len`
rows of four numbers. On disk, a capture is that checkpoint plus the kept batches plus the history.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Callable, Optional, Union

import torch
from pydantic import Field

from triage.flight.memory import BatchRing, History, cpu_copy
from triage.flight.triggers import Trigger, TriggerSettings, TriggerWatch
from triage.flight.autotriage import OnCapture, auto_triage, launch
from triage.flight.writer import CheckpointWriter, rank_and_world_size, write_capture

log = logging.getLogger("triage.recorder")


class RecorderSettings(TriggerSettings):
    """What the recorder keeps and when it captures."""

    snapshot_every: int = Field(default=50, ge=1, description="Steps between CPU copies of the last good state.")
    keep_batches: int = Field(default=64, ge=0, description="Batches kept (the most recent). At least "
                              "snapshot_every keeps every batch since the snapshot.")
    grad_norm_every: int = Field(default=10, ge=1, description="Steps between gradient norms (when the loop "
                                 "does not pass its own); a non-finite gradient between two shows as a "
                                 "non-finite loss one step later.")
    max_batch_mb: float = Field(default=256.0, gt=0, description="Memory the kept batches may take, in MiB.")
    history_len: int = Field(default=100_000, ge=1, description="Steps of loss / LR / gradient-norm history kept.")
    max_captures: int = Field(default=1, ge=0, description="Captures written at most; later triggers are logged.")


class FlightRecorder:
    """The framework-neutral part: history, batches, the last good state, triggers, the capture.

    A front end (the plain Recorder, a Lightning or Trainer callback) feeds `record()` once per step and
    calls `remember()` when the state it would snapshot is the start of the next step.
    """

    def __init__(self, settings: RecorderSettings, root: Path, framework: str,
                 write_checkpoint: CheckpointWriter, run_info: Callable[[], dict[str, Any]],
                 entry: Optional[str] = None, on_capture: OnCapture = None):
        self.settings = settings
        self.auto = auto_triage(on_capture, entry)
        self.root = Path(root)
        self.framework = framework
        self.entry = entry
        self._write_checkpoint = write_checkpoint
        self._run_info = run_info  # precision, grad_clip, total_steps, device, run_settings: read at capture
        self.watch = TriggerWatch(settings)
        self.batches = BatchRing(settings.keep_batches, int(settings.max_batch_mb * 2**20))
        self.history = History(settings.history_len)
        self.captures: list[Path] = []
        self.step = 0
        self._good: Any = None
        self._good_step = 0

    def remember(self, step: int, state: Any) -> None:
        """Keep a CPU copy of `state`, the state at the start of step `step` + 1."""
        self._good = cpu_copy(state)
        self._good_step = step

    def due(self, step: int) -> bool:
        return step % self.settings.snapshot_every == 0

    def record(self, step: int, loss: Optional[float], grad_norm: Optional[float], lr: Optional[float],
               batch: Any = None) -> Optional[Trigger]:
        """One step's figures; `loss` None when the front end could not see it (only the gradient is watched)."""
        self.step = step
        self.history.add(step, loss, lr, grad_norm)
        if batch is not None:
            self.batches.add(step, batch)
        if loss is None:
            if grad_norm is not None and not math.isfinite(grad_norm):
                return Trigger(kind="nonfinite_grad", step=step, detail=f"the gradient norm was {grad_norm}")
            return None
        return self.watch.observe(step, loss, grad_norm)

    def capture(self, trigger: Trigger) -> Optional[Path]:
        if len(self.captures) >= self.settings.max_captures:
            log.info("triage: %s at step %d (no capture: max_captures=%d reached)", trigger.kind, trigger.step,
                     self.settings.max_captures)
            return None
        if self._good is None:
            log.warning("triage: %s at step %d, but no state was kept yet: nothing to capture", trigger.kind,
                        trigger.step)
            return None
        folder = write_capture(self.root, trigger, self._good, self._good_step, self._write_checkpoint,
                               self.batches.items(), self.history, framework=self.framework, entry=self.entry,
                               **self._run_info())
        self.captures.append(folder)
        if self.auto is not None:
            launch(folder, self.auto.entry or self.entry, self.auto, rank_and_world_size()["rank"])
        return folder


def total_grad_norm(params: list[torch.nn.Parameter]) -> Optional[torch.Tensor]:
    """The global L2 norm of the gradients present, as a tensor on their device (None when there are none)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    if hasattr(torch, "_foreach_norm") and all(g.device == grads[0].device and g.dtype == grads[0].dtype
                                               for g in grads):
        # Two kernels (what clip_grad_norm_ does inside, without its per-call Python bookkeeping).
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()).to(grads[0].device)
                                                 for g in grads]))


def scalars(loss: Any, grad_norm: Any) -> tuple[float, Optional[float]]:
    """The loss and gradient norm as floats, with one device sync when they live on an accelerator."""
    if isinstance(loss, torch.Tensor) and isinstance(grad_norm, torch.Tensor) and loss.device.type != "cpu":
        both = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float().to(loss.device)]).tolist()
        return both[0], both[1]
    value = loss.item() if isinstance(loss, torch.Tensor) else float(loss)
    norm = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else grad_norm
    return value, norm


def dict_checkpoint(folder: Path, state: Any, step: int) -> tuple[str, str]:
    """triage's own dict layout ({model, optimizer, scheduler, scaler, step}), loadable with weights_only."""
    torch.save({**state, "step": step}, folder / "checkpoint.pt")
    return "checkpoint.pt", "dict"


class Recorder:
    """Flight recorder for a plain loop: one `step(loss, batch)` per optimizer step.

    Keeps a CPU copy of the last good state every `snapshot_every` steps, the last batches, and the loss,
    LR and gradient-norm history; on a non-finite loss or gradient, a loss spike, a plateau (when
    `plateau_window` is set) or `capture()`, writes a capture folder and logs the `triage run` command.
    `entry` names the setup() that rebuilds the run, for that command; `precision`, `grad_clip` and
    `total_steps` are written to the manifest as the run used them. `triage_on_capture` (True, an entry,
    or a `triage.AutoTriage`) triages the capture in a detached low-priority process (flight/autotriage.py).
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, *,
                 scaler: Any = None, dir: Union[str, Path] = "triage-captures", entry: Optional[str] = None,
                 precision: Optional[str] = None, grad_clip: Optional[float] = None,
                 total_steps: Optional[int] = None, settings: Optional[RecorderSettings] = None,
                 triage_on_capture: OnCapture = None):
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self._params = [p for p in model.parameters() if p.requires_grad]
        info = {"precision": precision, "grad_clip": grad_clip, "total_steps": total_steps,
                "device": str(next(iter(self._params)).device) if self._params else "cpu", "run_settings": {}}
        self.flight = FlightRecorder(settings or RecorderSettings(), Path(dir), "torch", dict_checkpoint,
                                     lambda: info, entry, triage_on_capture)
        self.flight.remember(0, self._state())  # so a failure before the first snapshot still has one

    @property
    def captures(self) -> list[Path]:
        return list(self.flight.captures)

    def _state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def step(self, loss: Any, batch: Any = None, *, grad_norm: Any = None) -> Optional[Path]:
        """Record one finished step. `grad_norm` (e.g. what clip_grad_norm_ returned) saves computing it.
        Returns the capture folder when this step triggered one."""
        step = self.flight.step + 1
        if grad_norm is None and step % self.flight.settings.grad_norm_every == 0:
            grad_norm = total_grad_norm(self._params)
        value, norm = scalars(loss, grad_norm)
        lr = self.optimizer.param_groups[0].get("lr")
        trigger = self.flight.record(step, value, norm, float(lr) if lr is not None else None, batch)
        if trigger is not None:
            return self.flight.capture(trigger)
        if self.flight.due(step) and math.isfinite(value):
            self.flight.remember(step, self._state())
        return None

    def capture(self, reason: str = "requested by the run") -> Optional[Path]:
        """Write a capture now (e.g. from your own check); the checkpoint is the last good snapshot."""
        return self.flight.capture(Trigger(kind="manual", step=self.flight.step, detail=reason))
