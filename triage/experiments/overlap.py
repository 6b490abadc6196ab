"""Train/val overlap: validation examples that also appear, exactly, among the training batches, each read whole
(every tensor the model reads of it, a graph's nodes as its masks select them: fingerprint.example_rows), and
whether they score better at the checkpoint than the validation examples that are not (the overlap flatters
the validation figure only where they do). And how often the training examples repeat one another: where the
data repeats itself (a user buying the same item again, windows drawn at random cut points), a validation
example drawn apart from training repeats a training one as often, and that is no leak. Then the near copies
(experiments/near_copies.py), scored apart from the rest the same way."""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Optional

import torch

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.fingerprint import (example_digests, examples_unreadable, examples_where, sequence_rows,
                                            window_digests)
from triage.experiments.near_copies import near_copies
from triage.experiments.training import autocast, loss_value, scored_loss
from triage.outcomes.overlap import OverlapOutcome

log = logging.getLogger(__name__)


class OverlapParams(Params):
    pass


def measure(ctx: Context, p: OverlapParams) -> OverlapOutcome:
    session = ctx.session
    if not session.val_batches:
        return OverlapOutcome(has_val=False)
    unreadable = examples_unreadable(session.batches) or examples_unreadable(session.val_batches)
    if unreadable is not None:
        return OverlapOutcome(has_val=True, duplicate_fraction=None, not_measured=unreadable)
    train_hashes = list(example_digests(session.batches))
    train = set(train_hashes)
    counts = Counter(train_hashes)
    # per validation batch, whether each of its examples is a training example
    copied = [torch.tensor([d in train for d in example_digests([b])], dtype=torch.bool) for b in session.val_batches]
    flags = torch.cat(copied) if copied else torch.zeros(0, dtype=torch.bool)
    val_examples, duplicates = len(flags), int(flags.sum())
    shifted, compared = _shifted_copies(session.batches, session.val_batches)
    losses = near_losses = (None, None)
    if 0 < duplicates < val_examples:
        losses = _scored_apart(ctx, copied)
        ctx.restart()  # eval-mode forwards move nothing a stock model holds; a loss_fn with state of its own may
    try:
        near = near_copies(session.batches, session.val_batches, copied)
    except (RuntimeError, TypeError, ValueError) as exc:  # rows torch cannot read as floats (sparse, nested)
        log.info("near copies not measured: %s", exc)
        near = None
    if near is not None and 0 < near.near:
        near_losses = _scored_apart(ctx, near.flags)
        ctx.restart()
    return OverlapOutcome(
        has_val=True, train_examples=len(train_hashes), val_examples=val_examples, duplicates=duplicates,
        train_repeat_fraction=_repeat_fraction(train_hashes, counts),
        duplicate_fraction=duplicates / val_examples if val_examples else 0.0,
        first_duplicates=flags.nonzero().flatten()[:20].tolist(), duplicate_loss=losses[0], other_loss=losses[1],
        shifted_copies=shifted, shifted_fraction=shifted / compared if compared else None,
        near_copies=near.near if near else 0,
        near_fraction=near.near / near.compared if near and near.compared else None,
        near_distance_ratio=near.distance_ratio if near else None, near_loss=near_losses[0], far_loss=near_losses[1],
    )


def _repeat_fraction(hashes: list[str], counts: Counter) -> Optional[float]:
    """The share of training examples another one of the snapshot repeats, beyond passes over the data: where
    every example appears at least m times (a snapshot of m epochs of one set), only a count above m is the
    data's own repetition (Deep SVDD's 216 normal images, each drawn every epoch, repeat none of one another).
    Where the snapshot's first examples, as many as it holds distinct ones, are all distinct, it reads as passes
    over one set, and a count up to its passes rounded up is a pass too (an FNO's 48 batches of 20 over 100
    solutions: 9.6 passes, 60 solutions drawn a tenth time). By order, not by content: rows oversampled by
    appending copies after one pass read as a partial second pass."""
    if not hashes:
        return None
    passes = min(counts.values())
    if len(set(hashes[:len(counts)])) == len(counts):
        passes = max(passes, math.ceil(len(hashes) / len(counts)))
    return sum(counts[d] > passes for d in hashes) / len(hashes)


@torch.no_grad()
def _scored_apart(ctx: Context, copied: list[torch.Tensor]) -> tuple[Optional[float], Optional[float]]:
    """The run's loss at the checkpoint on the validation examples `copied` flags (per batch, a bool per
    example), and on the rest, each averaged over examples (the batches cut to each group; eval mode, as
    validation runs). None where a batch's examples cannot be selected apart, or the loss cannot take part
    of a batch."""
    try:
        return _group_means(ctx.session, copied)
    except Exception:  # noqa: BLE001 - a loss_fn written for one batch size, say: not scored apart
        return None, None


def _group_means(session, copied: list[torch.Tensor]) -> tuple[Optional[float], Optional[float]]:
    setup, sums, counts = session.setup, [0.0, 0.0], [0, 0]
    for batch, flags in zip(session.val_batches, copied):
        for group, keep in enumerate((flags, ~flags)):
            if not keep.any():
                continue
            part = examples_where(batch, keep)
            if part is None:
                return None, None
            with autocast(setup.precision, session.device):
                sums[group] += loss_value(scored_loss(setup, part)) * int(keep.sum())
            counts[group] += int(keep.sum())
    return sums[0] / counts[0], sums[1] / counts[1]


def _shifted_copies(train_batches: list, val_batches: list) -> tuple[int, int]:
    """How many validation sequences share all but their first (or last) few steps with a training sequence
    moved by as many: windows cut from one series before it was split. And how many were compared."""
    tails, heads = set(), set()
    for readings in sequence_rows(train_batches):
        for row in readings:
            tails.update(window_digests(row, "tail"))
            heads.update(window_digests(row, "head"))
    if not tails:
        return 0, 0
    shifted = compared = 0
    for readings in sequence_rows(val_batches):
        compared += 1
        # a val window moved forward (its head is a train window's tail) or back (its tail, a train head)
        if any(any(d in tails for d in window_digests(row, "head")) or
               any(d in heads for d in window_digests(row, "tail")) for row in readings):
            shifted += 1
    return shifted, compared


OVERLAP_CHECK = Experiment(
    name="overlap_check",
    summary="Counts validation examples whose inputs also appear among the training batches.",
    params=OverlapParams,
    outcome=OverlapOutcome,
    measure=measure,
)
