"""Train/val overlap: validation examples whose inputs also appear, exactly, among the training batches."""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.probes import input_tensor

ROUNDING = 1e-6  # floats equal to this precision count as the same example (a CSV round trip, say)


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
    train_hashes = list(_example_hashes(session.batches))
    train = set(train_hashes)
    val_examples, duplicates, first = 0, 0, []
    for index, digest in enumerate(_example_hashes(session.val_batches)):
        val_examples += 1
        if digest in train:
            duplicates += 1
            if len(first) < 20:
                first.append(index)
    return OverlapOutcome(
        has_val=True, train_examples=len(train_hashes), val_examples=val_examples, duplicates=duplicates,
        duplicate_fraction=duplicates / val_examples if val_examples else 0.0, first_duplicates=first,
    )


def _example_hashes(batches: list[Any]) -> Iterator[bytes]:
    """One digest per example: its input tensor's row (dim 0 of the batch), floats rounded to 1e-6."""
    for batch in batches:
        x = input_tensor(batch)
        if x is None or x.dim() == 0:
            continue
        rows = x.detach().reshape(x.shape[0], -1).cpu()
        if rows.is_floating_point():
            # + 0.0 turns -0.0 into 0.0, so the two hash alike
            rows = torch.round(rows.double() / ROUNDING) + 0.0
        for row in rows.numpy():
            yield hashlib.blake2b(row.tobytes(), digest_size=16).digest()


OVERLAP_CHECK = Experiment(
    name="overlap_check",
    summary="Counts validation examples whose inputs also appear among the training batches.",
    params=OverlapParams,
    outcome=OverlapOutcome,
    measure=measure,
)
