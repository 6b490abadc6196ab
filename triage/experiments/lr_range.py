"""Leslie Smith's learning-rate range test from the checkpoint: raise the LR exponentially step by step,
watch the smoothed loss, stop when it diverges; the steepest descent suggests an LR."""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, model_validator

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.probes import mean_loss
from triage.experiments.training import current_lr, grad_scaler, reference_step, trainable
from triage.views import Curve, Mark
from triage.outcomes.lr_range import LrRangeOutcome
from triage.judge.readings import LR_RANGE_DIVERGED


class LrRangeParams(Params):
    # x1e-5 .. x1e5: ten decades, so a unit slip (1e-3 written as 1e-7 or as 10) lies inside the sweep.
    min_factor: float = Field(default=1e-5, gt=0, description="First LR, as a multiple of the current LR.")
    max_factor: float = Field(default=1e5, gt=0, description="Last LR, as a multiple of the current LR.")
    steps: int = Field(default=100, ge=5, le=10_000, description="Steps of the sweep (10 per decade).")
    smoothing: float = Field(default=0.1, gt=0, le=1, description="EMA weight of each new loss.")
    diverge: float = Field(default=LR_RANGE_DIVERGED, gt=1, description="Stop when the smoothed loss exceeds this x the best.")

    @model_validator(mode="after")
    def _increasing(self) -> "LrRangeParams":
        if self.max_factor <= self.min_factor:
            raise ValueError("max_factor must be larger than min_factor")
        return self


def measure(ctx: Context, p: LrRangeParams) -> LrRangeOutcome:
    session = ctx.session
    setup, device = session.setup, session.device
    optimizer = setup.optimizer
    base = current_lr(optimizer)
    if not base > 0:  # a schedule decayed to zero: sweep around the LR it started from
        base = float(optimizer.param_groups[0].get("initial_lr") or 1e-3)
    group_scale = [g["lr"] / optimizer.param_groups[0]["lr"] if optimizer.param_groups[0]["lr"] > 0 else 1.0
                   for g in optimizer.param_groups]  # keep each group's LR relative to group 0
    scaler = grad_scaler(setup, setup.precision, device)
    params = trainable(setup.model)
    factors = np.geomspace(p.min_factor, p.max_factor, p.steps)
    setup.model.train()
    lrs, raw, smooth, diverged, lr_prev = [], [], [], None, None
    # A step's loss is measured before its update: the loss of step i is the effect of the LR of
    # step i-1, so each LR is paired with the next step's loss (the last with one forward pass).
    for i, factor in enumerate(factors):
        if ctx.out_of_time():
            break
        lr = base * float(factor)
        for group, scale in zip(optimizer.param_groups, group_scale):
            group["lr"] = lr * scale
        batch = session.batches[i % len(session.batches)]
        loss, _ = reference_step(setup, batch, setup.precision, setup.grad_clip, scaler, device, params)
        loss = ctx.ranks.mean(loss)  # every rank sweeps the same curve and stops at the same LR
        if lr_prev is not None and _record(lrs, raw, smooth, lr_prev, loss, p):
            diverged = lr_prev
            break
        lr_prev = lr
        ctx.progress(i + 1, p.steps)
    else:
        loss = ctx.ranks.mean(mean_loss(setup, [session.batches[len(factors) % len(session.batches)]], device))
        if _record(lrs, raw, smooth, lr_prev, loss, p):
            diverged = lr_prev
    ctx.restart()  # the sweep wrecked the weights on purpose; hand them back as they were
    return _summarise(lrs, raw, smooth, base, diverged)


def _record(lrs, raw, smooth, lr, loss, p: LrRangeParams) -> bool:
    """Append one point; True when the smoothed loss has diverged (non-finite or > diverge x best).

    The EMA runs on the median of the last three raw losses: one outlying batch (a spike that the LR
    did not cause) would otherwise end the sweep as a divergence, and the EMA's decay after it would
    read as the steepest descent. A real divergence persists and passes the median a step later.
    """
    lrs.append(lr)
    raw.append(loss)
    recent = [x if math.isfinite(x) else math.inf for x in raw[-3:]]
    despiked = float(np.median(recent)) if len(recent) != 2 else min(recent)
    smooth.append(despiked if not smooth else p.smoothing * despiked + (1 - p.smoothing) * smooth[-1])
    return not math.isfinite(smooth[-1]) or smooth[-1] > p.diverge * min(smooth)


def _summarise(lrs, raw, smooth, base, diverged) -> LrRangeOutcome:
    finite = [i for i, x in enumerate(smooth) if math.isfinite(x)]
    best_lr = lrs[min(finite, key=lambda i: smooth[i])] if finite else None
    suggested = None
    # Steepest descent of the smoothed loss against log LR, before the loss turned upward for good.
    end = len(smooth) if diverged is None else len(smooth) - 1
    if end >= 3 and all(math.isfinite(x) for x in smooth[:end]):
        slope = np.gradient(np.asarray(smooth[:end]), np.log(np.asarray(lrs[:end])))
        suggested = float(lrs[int(np.argmin(slope))]) if slope.min() < 0 else None
    return LrRangeOutcome(
        lrs=lrs, losses=smooth, raw_losses=raw, current_lr=base, suggested_lr=suggested,
        suggested_ratio=suggested / base if suggested is not None else None,
        best_lr=best_lr, diverged_at_lr=diverged,
    )


LR_RANGE_TEST = Experiment(
    name="lr_range_test",
    summary="Sweeps the learning rate exponentially from the checkpoint (Leslie Smith's range test) and "
            "suggests the LR where the loss falls fastest.",
    params=LrRangeParams,
    outcome=LrRangeOutcome,
    views=(Curve(title="LR range test: loss against learning rate", field="losses", x="lrs",
                 xlabel="learning rate", ylabel="loss (smoothed)", log_x=True, log_y=False,
                 marks=(Mark(field="current_lr", label="the run's lr"),
                        Mark(field="suggested_lr", label="suggested", tone="good"),
                        Mark(field="diverged_at_lr", label="diverged", tone="bad"))),),
    measure=measure,
)
