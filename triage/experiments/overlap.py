"""Train/val overlap: validation examples that also appear, exactly, among the training batches, each read whole
(every tensor the model reads of it, a graph's nodes as its masks select them: fingerprint.example_rows)."""

from __future__ import annotations

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.fingerprint import example_digests, examples_unreadable, sequence_rows, window_digests
from triage.outcomes.overlap import OverlapOutcome


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
    val_examples, duplicates, first = 0, 0, []
    for index, digest in enumerate(example_digests(session.val_batches)):
        val_examples += 1
        if digest in train:
            duplicates += 1
            if len(first) < 20:
                first.append(index)
    shifted, compared = _shifted_copies(session.batches, session.val_batches)
    return OverlapOutcome(
        has_val=True, train_examples=len(train_hashes), val_examples=val_examples, duplicates=duplicates,
        duplicate_fraction=duplicates / val_examples if val_examples else 0.0, first_duplicates=first,
        shifted_copies=shifted, shifted_fraction=shifted / compared if compared else None,
    )


def _shifted_copies(train_batches: list, val_batches: list) -> tuple[int, int]:
    """How many validation sequences share all but their first (or last) few steps with a training sequence
    moved by as many: windows cut from one series before it was split. And how many were compared."""
    tails, heads = set(), set()
    for row in sequence_rows(train_batches):
        tails.update(window_digests(row, "tail"))
        heads.update(window_digests(row, "head"))
    if not tails:
        return 0, 0
    shifted = compared = 0
    for row in sequence_rows(val_batches):
        compared += 1
        # a val window moved forward (its head is a train window's tail) or back (its tail, a train head)
        if any(d in tails for d in window_digests(row, "head")) or \
                any(d in heads for d in window_digests(row, "tail")):
            shifted += 1
    return shifted, compared


OVERLAP_CHECK = Experiment(
    name="overlap_check",
    summary="Counts validation examples whose inputs also appear among the training batches.",
    params=OverlapParams,
    outcome=OverlapOutcome,
    measure=measure,
)
