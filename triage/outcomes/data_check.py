"""What data_check measures: non-finite values in any tensor of the snapshot's batches
(triage/experiments/data_check.py)."""

from __future__ import annotations

import math
from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class NonFiniteTensor(Outcome):
    split: str = Field(json_schema_extra={"words": "split"})
    batch: int = Field(json_schema_extra={"words": "batch"})
    key: str = Field(
        description="The tensor in the batch: its dict key or tuple position, e.g. [0] or ['x'].",
        json_schema_extra={"words": "key"})
    nan: int = Field(json_schema_extra={"words": "NaN"})
    inf: int = Field(json_schema_extra={"words": "Inf"})
    numel: int = Field(json_schema_extra={"words": "elements"})
    first_index: list[int] = Field(
        default_factory=list, description="Where its first NaN/Inf is (row-major), e.g. [3, 17]: example 3 of the "
                                          "batch, feature 17.",
        json_schema_extra={"words": "where the first non-finite value is"})
    first_value: float = Field(
        default=math.nan, description="That value: NaN, inf or -inf.",
        json_schema_extra={"words": "first non-finite value"})
    sample_id: Optional[int] = Field(
        default=None, description="That example's index in the dataset, where the batch carries its examples' indices "
                                  "(an 'index' or 'idx' key); else None.",
        json_schema_extra={"words": "dataset index of the example"})


class DataCheckOutcome(Outcome):
    batches_checked: int = Field(json_schema_extra={"words": "batches checked"})
    tensors_checked: int = Field(json_schema_extra={"words": "tensors checked"})
    nonfinite_count: int = Field(
        description="Tensors holding a NaN or Inf, train and val.",
        json_schema_extra={"words": "non-finite tensors"})
    train_nonfinite_count: int = Field(
        default=0, description="Of those, in the training batches.",
        json_schema_extra={"words": "non-finite values in the training batches"})
    nonfinite: list[NonFiniteTensor] = Field(default_factory=list, json_schema_extra={"words": "non-finite"})
    first_bad_batch: int | None = Field(
        default=None, description="Index of the first bad train batch.",
        json_schema_extra={"words": "first bad batch", "ranks": "min"})
