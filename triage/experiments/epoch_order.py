"""epoch_order: does every epoch repeat the same order?

A DistributedSampler (and any sampler with `set_epoch`) draws its order from its seed and its epoch: a
loop that never calls `sampler.set_epoch(epoch)` gets the same order every epoch, on every rank. triage
cannot see the loop, so it needs the loop's per-epoch data: `Setup.epoch_batches(epoch)`, the function
the run's loop calls at the start of each epoch (e.g. `sampler.set_epoch(epoch); return loader`, or just
`return loader` in the faulty run). It compares the order of epochs 0 and 1 (the digests of their first
batches) and tries the fix: `set_epoch(1)` called on the loader's sampler, then epoch 1 again.

Given only a DataLoader as `Setup.batches`, it measures whether that loader repeats its order unless
set_epoch is called (the risk, not the fault: whether the loop calls it is not visible).
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field
from torch.utils.data import DataLoader

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.fingerprint import order_digest
from triage.outcomes.epoch_order import EpochOrderOutcome


class EpochOrderParams(Params):
    max_batches: int = Field(default=8, ge=1, description="Compare the first N batches of each epoch.")


def measure(ctx: Context, p: EpochOrderParams) -> EpochOrderOutcome:
    setup = ctx.session.setup
    given = setup.epoch_batches
    if given is None and not isinstance(setup.batches, DataLoader):
        return EpochOrderOutcome(has_epoch_batches=False, has_loader=False)
    first_source = given(0) if given is not None else setup.batches
    first = order_digest(first_source, p.max_batches)
    second_source = given(1) if given is not None else setup.batches
    second = order_digest(second_source, p.max_batches)
    loader = second_source if isinstance(second_source, DataLoader) else None
    sampler = _sampler_of(loader)
    fix = None
    if sampler is not None and hasattr(sampler, "set_epoch"):
        saved = getattr(sampler, "epoch", 0)
        try:
            sampler.set_epoch(1)
            fix = order_digest(loader, p.max_batches) != first
        finally:
            sampler.set_epoch(saved)  # leave the run's sampler as setup() made it
    same = first == second
    return EpochOrderOutcome(
        has_epoch_batches=given is not None, has_loader=loader is not None,
        sampler=type(sampler).__name__ if sampler is not None else None,
        sampler_has_set_epoch=sampler is not None and hasattr(sampler, "set_epoch"),
        batches_compared=min(len(first), len(second)),
        repeats=same if given is not None else None,
        loader_repeats=same if given is None else None,
        fix_reshuffles=fix,
    )


def _sampler_of(loader: Optional[DataLoader]) -> Any:
    """The sampler that orders a DataLoader's examples (inside its batch_sampler when it has one)."""
    if loader is None:
        return None
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    return inner if inner is not None and hasattr(inner, "set_epoch") else loader.sampler


EPOCH_ORDER = Experiment(
    name="epoch_order",
    summary="Compares the order of two epochs of the run's data loader (the loop's epoch_batches), and tries "
            "sampler.set_epoch: every epoch should see the data in a new order.",
    params=EpochOrderParams,
    outcome=EpochOrderOutcome,
    measure=measure,
)
