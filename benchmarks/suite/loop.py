"""The stock PyTorch loop the validity check trains with: zero_grad, forward under autocast, backward,
optional clip, step, scheduler.step(). It is written here on purpose and shares no code with triage's
replay: the suite must not certify a case with the machinery it is meant to test.

`Knobs` are the counterfactual changes the check applies (lr x0.1, clip at 1.0, bf16, ...).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional

import torch

import triage

KEEP = "keep"  # a knob value meaning "as the run had it"


@dataclass(frozen=True)
class Knobs:
    """One counterfactual: what is changed in the loop relative to the run as it was."""

    lr_scale: float = 1.0
    clip: object = KEEP                   # KEEP, None (no clipping) or a max global norm
    precision: Optional[str] = None       # None: the run's own
    skip: tuple[int, ...] = ()            # batch indices left out
    no_weight_decay: bool = False
    hold_peak_lr: Optional[float] = None  # the LR to hold (the schedule is not stepped)
    reference_loop: bool = False          # ignore the run's own train_step

    def label(self) -> str:
        parts = []
        if self.lr_scale != 1.0:
            parts.append(f"lr x{self.lr_scale:g}")
        if self.clip != KEEP:
            parts.append("no clipping" if self.clip is None else f"clip {self.clip:g}")
        if self.precision:
            parts.append(self.precision)
        if self.skip:
            parts.append(f"skip batches {list(self.skip)}")
        if self.no_weight_decay:
            parts.append("no weight decay")
        if self.hold_peak_lr is not None:
            parts.append("LR held at its peak")
        if self.reference_loop:
            parts.append("reference loop")
        return ", ".join(parts) or "as run"


@dataclass(frozen=True)
class Trace:
    """Per-step training losses (ending at the first non-finite one) and validation losses
    (before the first step and every `val_every` steps)."""

    losses: tuple[float, ...]
    val_losses: tuple[float, ...] = ()

    @property
    def finite(self) -> bool:
        return all(math.isfinite(x) for x in self.losses)


_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str):
    dtype = _AUTOCAST.get(precision)
    return torch.autocast("cpu", dtype=dtype) if dtype else contextlib.nullcontext()


def train(setup: triage.Setup, steps: int, knobs: Knobs = Knobs(), val_every: int = 0,
          first_batch: int = 0) -> Trace:
    """Train `steps` steps on the setup's batches (batch `(first_batch + i) % n` at step i)."""
    model, optimizer, scheduler = setup.model, setup.optimizer, setup.scheduler
    batches = [b for i, b in enumerate(setup.batches) if i not in knobs.skip]
    precision = knobs.precision or setup.precision
    clip = setup.grad_clip if knobs.clip == KEEP else knobs.clip
    if knobs.no_weight_decay:
        for group in optimizer.param_groups:
            group["weight_decay"] = 0.0
    use_own_step = setup.train_step is not None and not knobs.reference_loop
    losses: list[float] = []
    val: list[float] = [val_loss(setup, precision)] if val_every and setup.val_batches else []
    model.train()
    for i in range(steps):
        batch = batches[(first_batch + i) % len(batches)]
        if knobs.hold_peak_lr is not None:
            for group in optimizer.param_groups:
                group["lr"] = knobs.hold_peak_lr
        with _scaled_lr(optimizer, knobs.lr_scale):
            if use_own_step:
                # a loop with no optimizer object is handed its step's LR, as triage hands it
                second = optimizer.param_groups[0]["lr"] if setup.manual_update else optimizer
                loss = float(setup.train_step(model, second, batch))
            else:
                loss = _reference_step(setup, batch, precision, clip)
        if scheduler is not None and knobs.hold_peak_lr is None:
            step_scheduler(scheduler, loss, end_of_epoch=(first_batch + i) % len(batches) == len(batches) - 1)
        losses.append(loss)
        if val and (i + 1) % val_every == 0:
            val.append(val_loss(setup, precision))
        if not math.isfinite(loss):
            break
    return Trace(tuple(losses), tuple(val))


PER_EPOCH = "suite_per_epoch"  # a scheduler carrying this attribute (True) is stepped once per pass over the batches


def step_scheduler(scheduler, loss: float, end_of_epoch: bool) -> None:
    """Step the LR schedule as a real loop does: ReduceLROnPlateau on the loss (a finite one), a per-epoch
    schedule at the end of each pass over the batches, every other schedule after every step."""
    if getattr(scheduler, PER_EPOCH, False) and not end_of_epoch:
        return
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        if math.isfinite(loss):
            scheduler.step(loss)
        return
    scheduler.step()


def _reference_step(setup: triage.Setup, batch, precision: str, clip: Optional[float]) -> float:
    setup.optimizer.zero_grad()
    with autocast(precision):
        loss = setup.loss_fn(setup.model, batch)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(setup.model.parameters(), clip)
    setup.optimizer.step()
    return float(loss.detach().float())


@contextlib.contextmanager
def _scaled_lr(optimizer: torch.optim.Optimizer, factor: float):
    if factor == 1.0:
        yield
        return
    saved = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = g["lr"] * factor
    try:
        yield
    finally:
        for g, lr in zip(optimizer.param_groups, saved):
            g["lr"] = lr


@torch.no_grad()
def val_loss(setup: triage.Setup, precision: str = "fp32") -> float:
    """Mean loss over the validation batches in eval mode."""
    was_training = setup.model.training
    setup.model.eval()
    with autocast(precision):
        value = sum(float(setup.loss_fn(setup.model, b).float()) for b in setup.val_batches) / len(setup.val_batches)
    setup.model.train(was_training)
    return value


@torch.no_grad()
def batch_losses(setup: triage.Setup) -> list[float]:
    """The loss of every training batch at the current weights (train mode; BatchNorm statistics and
    RNG left as they were)."""
    buffers = {k: b.clone() for k, b in setup.model.named_buffers()}
    rng = torch.get_rng_state()
    with autocast(setup.precision):
        out = [float(setup.loss_fn(setup.model, b).float()) for b in setup.batches]
    for k, b in setup.model.named_buffers():
        b.copy_(buffers[k])
    torch.set_rng_state(rng)
    return out


def load_checkpoint(setup: triage.Setup, path, optimizer_too: bool = True) -> triage.Setup:
    """Load a checkpoint written by `triage.save_checkpoint` into a fresh setup (weights only: no pickles)."""
    state = torch.load(path, weights_only=True)
    setup.model.load_state_dict(state["model"])
    if optimizer_too and "optimizer" in state:  # a loop with no optimizer object saved none
        setup.optimizer.load_state_dict(state["optimizer"])
        if setup.scheduler is not None and state.get("scheduler") is not None:
            setup.scheduler.load_state_dict(state["scheduler"])
    return setup
