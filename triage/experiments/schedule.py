"""The run's LR scheduler stepped as the run stepped it: once per optimizer step, once per epoch, or (for
ReduceLROnPlateau) on the loss."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch


def is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class RunSchedule:
    """Call `after_step(loss)` after each optimizer step of a replay.

    Per epoch, the first epoch boundary is where the run's was: `steps_per_epoch - (start_step mod
    steps_per_epoch)` steps after the checkpoint (its step, where it has one). ReduceLROnPlateau is handed
    the mean training loss of the steps since its last step (the replay has no validation pass of the run's:
    the training loss is the metric it can measure)."""

    def __init__(self, scheduler: Any, interval: str = "step", steps_per_epoch: Optional[int] = None,
                 start_step: Optional[int] = None):
        self.scheduler = scheduler
        self.every = steps_per_epoch if interval == "epoch" and steps_per_epoch else 1
        self.done = (start_step or 0) % self.every
        self.losses: list[float] = []
        self.scheduler_steps = 0

    def after_step(self, loss: float) -> None:
        if self.scheduler is None:
            return
        self.done += 1
        if math.isfinite(loss):
            self.losses.append(loss)
        if self.done % self.every:
            return
        if is_plateau(self.scheduler):
            metric = sum(self.losses) / len(self.losses) if self.losses else math.inf
            self.scheduler.step(metric)
        else:
            self.scheduler.step()
        self.losses.clear()
        self.scheduler_steps += 1


def scheduler_position(scheduler: Any) -> Any:
    """What changes when a scheduler steps (to notice a train_step that steps its own scheduler)."""
    return getattr(scheduler, "last_epoch", None) if scheduler is not None else None
