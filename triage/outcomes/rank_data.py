"""What rank_data measures: whether each rank of a data-parallel run trains on its own data
(triage/experiments/rank_data.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class RankDataOutcome(Outcome):
    world_size: int = Field(description="Processes in the distributed run.", json_schema_extra={"words": "ranks"})
    batches_compared: int = Field(default=0, json_schema_extra={"words": "batches compared"})
    identical_batch_fraction: Optional[float] = Field(
        default=None, description="Share of batch positions at which every rank holds the very same batch.",
        json_schema_extra={"words": "identical batch share", "unit": "%"})
    identical_groups: list[list[int]] = Field(
        default_factory=list, description="Groups of ranks whose compared batches are all the same.",
        json_schema_extra={"words": "identical groups"})
    shared_example_fraction: Optional[float] = Field(
        default=None, description="Mean over ranks of the share of a rank's examples another rank also holds.",
        json_schema_extra={"words": "shared example share", "unit": "%"})
    sampler: Optional[str] = Field(
        default=None, description="The sampler of setup()'s DataLoader, if it gave one.",
        json_schema_extra={"words": "sampler"})
    sampler_shards: Optional[bool] = Field(
        default=None, description="A DistributedSampler over the same dataset gives every rank a different first "
                                  "batch (None: no map-style DataLoader to try it on).",
        json_schema_extra={"words": "sampler shards"})
