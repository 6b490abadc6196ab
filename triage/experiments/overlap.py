"""Train/val overlap: validation examples whose inputs also appear, exactly, among the training batches."""

from __future__ import annotations

from pydantic import Field

from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.fingerprint import example_digests


class OverlapParams(Params):
    pass


class OverlapOutcome(Outcome):
    has_val: bool
    train_examples: int = 0
    val_examples: int = 0
    duplicates: int = Field(default=0, description="Val examples whose input is also a train example.")
    duplicate_fraction: float = Field(default=0.0, description="duplicates / val_examples.")
    first_duplicates: list[int] = Field(default_factory=list, description="Up to 20 val example indices.")


def measure(ctx: Context, p: OverlapParams) -> OverlapOutcome:
    session = ctx.session
    if not session.val_batches:
        return OverlapOutcome(has_val=False)
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
