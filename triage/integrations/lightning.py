"""`TriageCallback` for `lightning.Trainer`: the flight recorder as a Lightning callback.

    from triage.integrations.lightning import TriageCallback
    trainer = L.Trainer(callbacks=[TriageCallback(dir="captures")], ...)

It keeps a CPU copy of the last good state every `snapshot_every` batches (as a Lightning .ckpt: the
module's state_dict, optimizer and scheduler states, global_step, hyper-parameters), the last batches and
the loss / LR / gradient-norm history; on a non-finite loss or gradient, a spike or a plateau it writes a
capture folder whose manifest records the Trainer's precision, clipping and length, and logs the
`triage run` command. `--entry` can then be the LightningModule class itself. With
`triage_on_capture=True` (or a `triage.AutoTriage`) the capture is triaged in a detached low-priority
process (triage/flight/autotriage.py); pair it with `stop_on_capture=True` so the run ends there.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any, Optional, Union

import torch

from triage.flight.autotriage import OnCapture, auto_triage
from triage.flight.recorder import FlightRecorder, RecorderSettings, scalars, total_grad_norm
from triage.flight.triggers import Trigger
from triage.integrations import require
from triage.integrations.runinfo import triage_clip, triage_precision

_pl = require("lightning.pytorch", "lightning")
log = logging.getLogger("triage.recorder")


def entry_of(obj: Any) -> str:
    """`module:Name` for a class or function, as --entry takes it (a file path when it lives in __main__)."""
    module = getattr(obj, "__module__", "__main__")
    name = getattr(obj, "__qualname__", type(obj).__qualname__)
    if module == "__main__":
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        return f"{main}:{name}" if main else f"YOUR_MODULE:{name}"
    return f"{module}:{name}"


def lightning_checkpoint(folder: Path, state: Any, step: int) -> tuple[str, str]:
    torch.save(state, folder / "checkpoint.ckpt")
    return "checkpoint.ckpt", "lightning"


class TriageCallback(_pl.Callback):
    """Captures a failing Lightning run for triage (see the module docstring)."""

    def __init__(self, dir: Union[str, Path] = "triage-captures", *, entry: Optional[str] = None,
                 settings: Optional[RecorderSettings] = None, stop_on_capture: bool = False,
                 triage_on_capture: OnCapture = None):
        self.dir = Path(dir)
        self.triage_on_capture = triage_on_capture
        auto_triage(triage_on_capture, entry or "the LightningModule")  # a bad setting fails before training
        self.entry = entry
        self.settings = settings or RecorderSettings()
        self.stop_on_capture = stop_on_capture
        self.flight: Optional[FlightRecorder] = None
        self._grad_norm: Any = None
        self._step = 0
        self._warned_no_loss = False

    @property
    def captures(self) -> list[Path]:
        return list(self.flight.captures) if self.flight else []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.flight = FlightRecorder(self.settings, self.dir, "lightning", lightning_checkpoint,
                                     lambda: self._run_info(trainer, pl_module),
                                     self.entry or entry_of(type(pl_module)), self.triage_on_capture)
        self._step = trainer.global_step
        self.flight.step = self._step
        self.flight.remember(self._step, self._state(trainer, pl_module))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if (self._step + 1) % self.settings.grad_norm_every == 0:
            self._grad_norm = total_grad_norm([p for p in pl_module.parameters() if p.requires_grad])

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.flight is None:
            return
        self._step += 1
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, (torch.Tensor, float, int)):
            loss = trainer.callback_metrics.get("train_loss", trainer.callback_metrics.get("loss"))
        if loss is None:
            if not self._warned_no_loss:
                log.warning("TriageCallback: training_step returned no loss and none is logged as 'train_loss' "
                            "or 'loss': only the gradient norm is watched")
                self._warned_no_loss = True
            loss = 0.0
        value, norm = scalars(loss, self._grad_norm)
        self._grad_norm = None
        lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
        trigger = self.flight.record(self._step, value, norm, float(lr) if lr is not None else None, batch)
        if trigger is not None:
            self._capture(trainer, trigger)
        elif self.flight.due(self._step) and math.isfinite(value):
            self.flight.remember(self._step, self._state(trainer, pl_module))

    def capture(self, trainer: Any, reason: str = "requested by the run") -> Optional[Path]:
        """Write a capture now; the checkpoint is the last good snapshot."""
        return self._capture(trainer, Trigger(kind="manual", step=self._step, detail=reason))

    def _capture(self, trainer: Any, trigger: Trigger) -> Optional[Path]:
        folder = self.flight.capture(trigger) if self.flight else None
        if folder is not None and self.stop_on_capture:
            trainer.should_stop = True
        return folder

    def _state(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        """The parts of a Lightning .ckpt that rebuild the run (what load_from_checkpoint and triage read)."""
        state = {
            "state_dict": pl_module.state_dict(),
            "optimizer_states": [o.state_dict() for o in trainer.optimizers],
            "lr_schedulers": [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
            "global_step": trainer.global_step, "epoch": trainer.current_epoch,
            "pytorch-lightning_version": _pl.__version__,
            "hyper_parameters": dict(pl_module.hparams) if pl_module.hparams else {},
        }
        precision_state = trainer.precision_plugin.state_dict()
        if precision_state:
            state[type(trainer.precision_plugin).__qualname__] = precision_state
        return state

    def _run_info(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if total is None:
            estimated = trainer.estimated_stepping_batches
            total = int(estimated) if isinstance(estimated, (int, float)) and math.isfinite(estimated) else None
        batches = trainer.num_training_batches
        settings = {
            "precision": str(trainer.precision), "gradient_clip_val": trainer.gradient_clip_val,
            "gradient_clip_algorithm": str(trainer.gradient_clip_algorithm or "norm"),
            "accumulate_grad_batches": trainer.accumulate_grad_batches, "max_steps": trainer.max_steps,
            "max_epochs": trainer.max_epochs, "global_step": trainer.global_step,
            "steps_per_epoch": int(batches) if isinstance(batches, (int, float)) and math.isfinite(batches) else None,
        }
        return {"precision": triage_precision(trainer.precision),
                "grad_clip": triage_clip(trainer.gradient_clip_val, trainer.gradient_clip_algorithm or "norm"),
                "total_steps": total, "device": str(pl_module.device), "run_settings": settings}
