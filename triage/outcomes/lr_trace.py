"""What lr_trace measures: the learning-rate schedule from step 0 past the checkpoint, and where the run
stands on it (triage/experiments/lr_trace.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class LrTraceOutcome(Outcome):
    has_scheduler: bool = Field(json_schema_extra={"words": "has scheduler"})
    metric_driven: bool = Field(
        default=False, description="ReduceLROnPlateau: the LR follows a metric.",
        json_schema_extra={"words": "metric driven"})
    steps: list[int] = Field(
        default_factory=list, description="Steps traced (subsampled).",
        json_schema_extra={"words": "steps"})
    lrs: list[float] = Field(
        default_factory=list, description="LR of param group 0 at those steps.",
        json_schema_extra={"words": "learning rate per step"})
    checkpoint_step: Optional[int] = Field(
        default=None, description="Where the run stopped on the schedule.",
        json_schema_extra={"words": "checkpoint step"})
    lr_now: float = Field(description="The optimizer's LR at the checkpoint.", json_schema_extra={"words": "LR now"})
    lr_peak: float = Field(
        description="The highest LR of the schedule (or lr_now, if higher).",
        json_schema_extra={"words": "LR peak"})
    lr_now_ratio: float = Field(
        description="lr_now / lr_peak: ~0 is a schedule that has decayed away.",
        json_schema_extra={"words": "LR now ratio", "unit": "×"})
    past_peak: bool = Field(
        default=False, description="The checkpoint's step is at or after the schedule's peak (a low LR before it is "
                                   "warmup, not decay).",
        json_schema_extra={"words": "past peak"})
    lr_end: Optional[float] = Field(
        default=None, description="The LR at the end of the trace.",
        json_schema_extra={"words": "LR end"})
    horizon: int = Field(
        description="Steps the trace was meant to cover.",
        json_schema_extra={"words": "horizon", "unit": "steps"})
    position_known: bool = Field(
        default=True, description="The checkpoint holds a step or the scheduler's state (else where the run stood "
                                  "on its schedule is not known, and checkpoint_step is a fresh scheduler's 0).",
        json_schema_extra={"words": "checkpoint's place on the schedule known"})
    lr_idle_from: Optional[int] = Field(
        default=None, description="Where the run declares its length (total_steps): the step after the schedule's "
                                  "peak from which its LR stays under 1% of the peak to the run's end (none: it "
                                  "never does).",
        json_schema_extra={"words": "LR under 1% of its peak from step", "unit": "steps"})
    truncated: bool = Field(
        default=False, description="The schedule ended early, or the walk's ceiling (--max-minutes) cut the trace.",
        json_schema_extra={"words": "cut short by the time ceiling"})
