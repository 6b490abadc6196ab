"""What checkpoint_check measures: NaN or Inf already in the checkpoint's weights, buffers or optimizer
state (triage/experiments/checkpoint_check.py)."""

from __future__ import annotations

from pydantic import Field

from triage.outcomes.base import Outcome


class NonFiniteState(Outcome):
    name: str = Field(
        description="e.g. 'encoder.0.weight' or 'optimizer exp_avg_sq of encoder.0.weight'.",
        json_schema_extra={"words": "name"})
    part: str = Field(description="weights, buffers or optimizer.", json_schema_extra={"words": "part"})
    nan: int = Field(json_schema_extra={"words": "NaN"})
    inf: int = Field(json_schema_extra={"words": "Inf"})
    numel: int = Field(json_schema_extra={"words": "elements"})


class CheckpointCheckOutcome(Outcome):
    tensors_checked: int = Field(json_schema_extra={"words": "tensors checked"})
    nonfinite_count: int = Field(
        description="Tensors holding a NaN or Inf: weights, buffers and optimizer state.",
        json_schema_extra={"words": "non-finite tensors"})
    weights_nonfinite: int = Field(
        default=0, description="Of those, parameters.",
        json_schema_extra={"words": "weights non-finite"})
    buffers_nonfinite: int = Field(
        default=0, description="Of those, buffers (BatchNorm statistics, ...).",
        json_schema_extra={"words": "buffers non-finite"})
    optimizer_nonfinite: int = Field(
        default=0, description="Of those, optimizer state (moments, ...).",
        json_schema_extra={"words": "optimizer non-finite"})
    tensors: list[str] = Field(
        default_factory=list, description="Their names, the first `names` of them.",
        json_schema_extra={"words": "tensors"})
    nonfinite: list[NonFiniteState] = Field(default_factory=list, json_schema_extra={"words": "non-finite"})
