"""What batch_scan measures: the loss and gradient norm of every snapshot batch at the checkpoint's
weights, and the batches that stand out (triage/experiments/batch_scan.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class BatchScanOutcome(Outcome):
    losses: list[float] = Field(
        description="Loss of each snapshot batch at the checkpoint's weights.",
        json_schema_extra={"words": "loss per step"})
    grad_norms: list[float] = Field(
        description="Global gradient norm of each batch.",
        json_schema_extra={"words": "gradient norm per step"})
    z_loss: list[float] = Field(
        description="Robust z-score of log loss (inf for a non-finite loss).",
        json_schema_extra={"words": "z-score loss"})
    z_grad: list[float] = Field(
        description="Robust z-score of log gradient norm.",
        json_schema_extra={"words": "z-score gradient"})
    outliers: list[int] = Field(
        default_factory=list, description="Batches with a finite loss whose z is above the threshold.",
        json_schema_extra={"words": "outliers"})
    outlier_count: int = Field(
        default=0, description="Batches whose loss or gradient lies far from the others.",
        json_schema_extra={"words": "outlying batches"})
    nonfinite_batches: list[int] = Field(
        default_factory=list, description="Batches whose loss or gradient is non-finite at these weights.",
        json_schema_extra={"words": "non-finite batches"})
    nonfinite_count: int = Field(
        default=0, description="How many batches are non-finite at these weights (nonfinite_batches).",
        json_schema_extra={"words": "non-finite tensors"})
    first_nonfinite_batch: Optional[int] = Field(
        default=None, description="The first snapshot batch whose loss or gradient is non-finite at the checkpoint's "
                                  "weights.",
        json_schema_extra={"words": "first non-finite batch"})
    worst_batch: Optional[int] = Field(
        default=None, description="Index in the data snapshot of the outlier with the highest z-score (else of the "
                                  "highest-z batch of all).",
        json_schema_extra={"words": "most outlying batch"})
    worst_z: float = Field(
        default=0.0, description="How far that batch's loss or gradient (whichever is higher) lies from the others "
                                 "(robust z).",
        json_schema_extra={"words": "its z-score", "unit": "σ"})
    batches_scanned: int = Field(default=0, json_schema_extra={"words": "batches scanned"})
    worst_tensor: Optional[str] = Field(
        default=None, description="The tensor of the worst outlier (its dict key or tuple position) whose largest "
                                  "|value| stands out from the same tensor's in the other batches (robust z above the "
                                  "threshold); None where no tensor does, no outlier, or the run is distributed (each "
                                  "rank scans its own batches).",
        json_schema_extra={"words": "tensor that stands out"})
    worst_tensor_z: Optional[float] = Field(
        default=None, description="How far its largest |value| lies from the same tensor's in the other batches "
                                  "(robust z of the log).",
        json_schema_extra={"words": "that tensor's z-score", "unit": "σ"})
    worst_value: Optional[float] = Field(
        default=None, description="That tensor's value of largest magnitude.",
        json_schema_extra={"words": "its largest value"})
    worst_value_index: list[int] = Field(
        default_factory=list, description="Where that value is, e.g. [3, 17]: example 3 of the batch, feature 17.",
        json_schema_extra={"words": "where that value is"})
    typical_value: Optional[float] = Field(
        default=None, description="The same tensor's largest |value|, median over the snapshot's batches.",
        json_schema_extra={"words": "the tensor's typical largest |value|"})
    worst_sample_id: Optional[int] = Field(
        default=None, description="That example's index in the dataset, where the batch carries its examples' indices "
                                  "(an 'index' or 'idx' key); else None.",
        json_schema_extra={"words": "dataset index of that example"})
