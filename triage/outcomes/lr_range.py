"""What lr_range_test measures: the smoothed loss as the LR rises step by step from the checkpoint
(triage/experiments/lr_range.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class LrRangeOutcome(Outcome):
    lrs: list[float] = Field(
        description="LR of each sweep step (param group 0).",
        json_schema_extra={"words": "learning rate per step"})
    losses: list[float] = Field(
        description="Smoothed loss after the step at that LR (median of 3, then EMA).",
        json_schema_extra={"words": "loss per step"})
    raw_losses: list[float] = Field(
        default_factory=list, description="The same, unsmoothed.",
        json_schema_extra={"words": "raw losses"})
    current_lr: float = Field(
        description="The LR the sweep is relative to (the optimizer's at the checkpoint).",
        json_schema_extra={"words": "current LR"})
    suggested_lr: Optional[float] = Field(
        default=None, description="LR at the steepest descent of the loss.",
        json_schema_extra={"words": "suggested LR"})
    suggested_ratio: Optional[float] = Field(
        default=None, description="suggested_lr / current_lr.",
        json_schema_extra={"words": "suggested ratio", "unit": "×"})
    best_lr: Optional[float] = Field(
        default=None, description="LR at the lowest smoothed loss.",
        json_schema_extra={"words": "best LR"})
    diverged_at_lr: Optional[float] = Field(
        default=None, description="LR where the loss blew up, if it did.",
        json_schema_extra={"words": "diverged at LR"})
