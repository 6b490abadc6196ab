"""What epoch_order measures: whether every epoch repeats the same order of batches
(triage/experiments/epoch_order.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class EpochOrderOutcome(Outcome):
    has_epoch_batches: bool = Field(
        description="setup() gave the loop's epoch_batches(epoch).",
        json_schema_extra={"words": "has epoch batches"})
    has_loader: bool = Field(
        description="setup() gave a DataLoader (as epoch_batches' result or as batches).",
        json_schema_extra={"words": "has loader"})
    sampler: Optional[str] = Field(
        default=None, description="The loader's sampler.",
        json_schema_extra={"words": "sampler"})
    sampler_has_set_epoch: bool = Field(default=False, json_schema_extra={"words": "sampler has set epoch"})
    batches_compared: int = Field(default=0, json_schema_extra={"words": "batches compared"})
    repeats: Optional[bool] = Field(
        default=None, description="The run's epochs 0 and 1 begin with the same batches in the same order.",
        json_schema_extra={"words": "repeats"})
    loader_repeats: Optional[bool] = Field(
        default=None, description="Only a DataLoader given: two passes over it give the same order.",
        json_schema_extra={"words": "loader repeats"})
    fix_reshuffles: Optional[bool] = Field(
        default=None, description="With sampler.set_epoch(1) called, epoch 1's order differs from epoch 0's (the "
                                  "sampler shuffles, and set_epoch is what changes its order).",
        json_schema_extra={"words": "fix reshuffles"})
