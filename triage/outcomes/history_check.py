"""What history_check reads of the run's own logged curve (triage/experiments/history_check.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class HistoryOutcome(Outcome):
    points: int = Field(description="Logged points in the run's history.", json_schema_extra={"words": "points"})
    has_val: bool = Field(
        description="The history logs a validation loss.",
        json_schema_extra={"words": "has validation"})
    loss_first: Optional[float] = Field(default=None, json_schema_extra={"words": "loss first"})
    loss_last: Optional[float] = Field(default=None, json_schema_extra={"words": "loss last"})
    val_best: Optional[float] = Field(default=None, json_schema_extra={"words": "validation best"})
    val_best_step: Optional[int] = Field(default=None, json_schema_extra={"words": "validation best step"})
    val_last: Optional[float] = Field(default=None, json_schema_extra={"words": "validation last"})
    val_ratio: Optional[float] = Field(
        default=None, description="Last val loss / best val loss: above 1, validation loss rose from its best.",
        json_schema_extra={"words": "last / best validation loss", "unit": "×"})
    train_ratio_since_val_best: Optional[float] = Field(
        default=None, description="Train loss at the end / train loss when val was best.",
        json_schema_extra={"words": "train ratio since validation best"})
    nothing_level: Optional[float] = Field(
        default=None, description="The run's loss on a prediction that learned nothing (the best constant), "
                                  "measured on the training snapshot: a logged validation loss that never went "
                                  "below it never showed anything learned.",
        json_schema_extra={"words": "loss of learning nothing"})
    val_nothing_level: Optional[float] = Field(
        default=None, description="The same prediction of nothing learned (the training snapshot's class frequencies "
                                  "or mean target), scored on the validation batches: what the logged validation "
                                  "loss is set against.",
        json_schema_extra={"words": "loss of learning nothing on validation"})
    val_checkpoint: Optional[float] = Field(
        default=None, description="The run's loss on the first validation batches at the checkpoint (eval mode): "
                                  "the log's validation figures are in the run's units where its last one is near it.",
        json_schema_extra={"words": "validation loss at the checkpoint"})
