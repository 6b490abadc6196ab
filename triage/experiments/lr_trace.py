"""The learning-rate schedule, traced from step 0 past the checkpoint, and where the run stands on it."""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np
import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.training import current_lr
from triage.judge.named import DECAYED_LR
from triage.views import Curve, Mark
from triage.outcomes.lr_trace import LrTraceOutcome

MAX_POINTS = 500  # the trace is subsampled to this many points: enough for a plot and a peak


class LrTraceParams(Params):
    horizon_factor: float = Field(default=3.0, gt=1, description="Without total_steps: trace to this many "
                                                                  "times the checkpoint's step.")
    min_steps: int = Field(default=100, ge=1, description="Trace at least this many steps.")
    max_steps: int = Field(default=200_000, ge=1, description="Trace at most this many steps.")


def measure(ctx: Context, p: LrTraceParams) -> LrTraceOutcome:
    session = ctx.session
    setup = session.setup
    lr_now = current_lr(setup.optimizer)
    checkpoint_step = _checkpoint_step(ctx)
    horizon = setup.total_steps or max(p.min_steps, int(p.horizon_factor * (checkpoint_step or 0)))
    horizon = min(horizon, p.max_steps)
    if setup.scheduler is None:
        return LrTraceOutcome(has_scheduler=False, steps=[0, horizon], lrs=[lr_now, lr_now],
                              checkpoint_step=checkpoint_step, lr_now=lr_now, lr_peak=lr_now,
                              lr_now_ratio=1.0 if lr_now > 0 else 0.0, lr_end=lr_now, horizon=horizon)
    # The schedule is a function of the step: a fresh setup() replays it from step 0 on its own
    # optimizer, and the run's real scheduler and optimizer are never touched.
    fresh = session.fresh_setup(at_checkpoint=False)  # the schedule from its step 0
    optimizer, scheduler = fresh.optimizer, fresh.scheduler
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        # Driven by a metric, not the step: no trace, but the LR it started from is its peak, and an LR
        # under it was reduced from it (it only ever goes down): past the peak.
        peak = max(current_lr(optimizer), lr_now)
        return LrTraceOutcome(has_scheduler=True, metric_driven=True, steps=[0], lrs=[current_lr(optimizer)],
                              checkpoint_step=checkpoint_step, lr_now=lr_now, lr_peak=peak,
                              lr_now_ratio=lr_now / peak if peak > 0 else 0.0, horizon=horizon,
                              past_peak=lr_now < peak)
    lrs, truncated = [], False
    every = setup.steps_per_scheduler_step
    with warnings.catch_warnings():
        # "lr_scheduler.step() before optimizer.step()": true here, and the point.
        warnings.simplefilter("ignore", UserWarning)
        for step in range(horizon + 1):
            lrs.append(current_lr(optimizer))
            if step == horizon:
                break
            if step % 1000 == 0 and ctx.out_of_time():
                truncated = True
                break
            if (step + 1) % every:  # a scheduler stepped once an epoch holds its LR in between
                continue
            try:
                scheduler.step()
            except ValueError:  # OneCycleLR refuses to step past its total_steps: the schedule ended
                truncated = True
                break
    peak = max(max(lrs), lr_now)
    idle_from = _idle_from(lrs, peak) if setup.total_steps and not truncated else None
    keep = np.unique(np.linspace(0, len(lrs) - 1, min(len(lrs), MAX_POINTS)).round().astype(int))
    if checkpoint_step is not None and checkpoint_step < len(lrs):
        keep = np.union1d(keep, [checkpoint_step])
    return LrTraceOutcome(
        has_scheduler=True, steps=[int(i) for i in keep], lrs=[float(lrs[i]) for i in keep],
        checkpoint_step=checkpoint_step, lr_now=lr_now, lr_peak=peak,
        lr_now_ratio=lr_now / peak if peak > 0 else 0.0, lr_end=lrs[-1], horizon=horizon, truncated=truncated,
        past_peak=checkpoint_step is not None and checkpoint_step >= int(np.argmax(lrs)),
        position_known=_position_known(ctx), lr_idle_from=idle_from,
    )


def _idle_from(lrs: list[float], peak: float) -> Optional[int]:
    """The step after the peak from which the LR stays under DECAYED_LR of it to the trace's end (None: never)."""
    low = np.asarray(lrs) < DECAYED_LR * peak
    top = int(np.argmax(lrs))
    if not low[-1]:
        return None
    above = np.flatnonzero(~low[top:])
    return top + (int(above[-1]) + 1 if above.size else 0)


def _position_known(ctx: Context) -> bool:
    """The checkpoint says where the run stood on its schedule: a step, or the scheduler's own state. Without
    either, a scheduler built by setup() is at its step 0 whatever the run's was."""
    checkpoint = ctx.session.checkpoint
    return checkpoint is None or checkpoint.step is not None or checkpoint.scheduler_state is not None


def _checkpoint_step(ctx: Context) -> Optional[int]:
    """The checkpoint's step, else how many times the scheduler has stepped."""
    checkpoint = ctx.session.checkpoint
    if checkpoint is not None and checkpoint.step is not None:
        return int(checkpoint.step)
    setup = ctx.session.setup
    last_epoch = getattr(setup.scheduler, "last_epoch", None)
    every = setup.steps_per_scheduler_step
    return int(last_epoch) * every if isinstance(last_epoch, int) and last_epoch >= 0 else None


LR_TRACE = Experiment(
    name="lr_trace",
    summary="Traces the scheduler's learning rate from step 0 past the checkpoint and compares "
            "the LR now with the schedule's peak.",
    params=LrTraceParams,
    outcome=LrTraceOutcome,
    views=(Curve(title="Learning rate schedule", field="lrs", x="steps", ylabel="learning rate",
                 marks=(Mark(field="checkpoint_step", label="checkpoint", tone="bad"),)),),
    measure=measure,
)
