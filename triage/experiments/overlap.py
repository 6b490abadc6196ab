"""Train/val overlap: validation examples that also appear, exactly, among the training batches, each read whole
(every tensor the model reads of it, a graph's nodes as its masks select them: fingerprint.example_rows)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.fingerprint import example_digests, examples_unreadable


class OverlapParams(Params):
    pass


class OverlapOutcome(Outcome):
    has_val: bool
    train_examples: int = 0
    val_examples: int = 0
    duplicates: int = Field(default=0, description="Val examples that are also a train example, every tensor "
                                                   "of them alike.")
    duplicate_fraction: Optional[float] = Field(default=0.0, description="duplicates / val_examples; unknown "
                                                                          "where examples are not rows.")
    first_duplicates: list[int] = Field(default_factory=list, description="Up to 20 val example indices.")
    not_measured: Optional[str] = Field(default=None, description="Why the examples could not be compared.")


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
    return OverlapOutcome(
        has_val=True, train_examples=len(train_hashes), val_examples=val_examples, duplicates=duplicates,
        duplicate_fraction=duplicates / val_examples if val_examples else 0.0, first_duplicates=first,
    )


OVERLAP_CHECK = Experiment(
    name="overlap_check",
    summary="Counts validation examples whose inputs also appear among the training batches.",
    params=OverlapParams,
    outcome=OverlapOutcome,
    measure=measure,
)
