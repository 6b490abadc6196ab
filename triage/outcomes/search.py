"""What a search measures: the chosen trial's replay, plus every trial's figures
(triage/experiments/search.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome
from triage.outcomes.replay import ReplayOutcome


class Trial(Outcome):
    setting: str = Field(
        description="What this trial changed: lr x0.01, init=kaiming, ...",
        json_schema_extra={"words": "setting"})
    finite: bool = Field(
        description="Every loss and gradient norm stayed finite (on every rank).",
        json_schema_extra={"words": "stayed finite", "ranks": "all"})
    loss_end: Optional[float] = Field(
        default=None, description="Median loss of the last fifth of steps.",
        json_schema_extra={"words": "loss at the end"})
    improvement: Optional[float] = Field(
        default=None, description="loss_end / reference_end: lower is better; 0 when the reference blew up.",
        json_schema_extra={"words": "end loss vs the run as it was", "unit": "×"})
    fix_works: Optional[bool] = Field(
        default=None, description="Finite, better, sane and, where validation data exists, generalising: the fix is "
                                  "verified.",
        json_schema_extra={"words": "fix works"})
    steps_run: Optional[int] = Field(
        default=None, description="Training steps the replay ran.",
        json_schema_extra={"words": "steps replayed"})
    raced_out: Optional[str] = Field(
        default=None, description="Stopped early, out of contention (its replay's).",
        json_schema_extra={"words": "stopped out of contention"})


class SearchOutcome(ReplayOutcome):
    chosen: Optional[str] = Field(
        default=None, description="The trial whose replay this outcome is.",
        json_schema_extra={"words": "setting chosen"})
    trials: list[Trial] = Field(
        default_factory=list, description="Every trial, in the order run.",
        json_schema_extra={"words": "trials"})


class LrSearchOutcome(SearchOutcome):
    lr_factor: Optional[float] = Field(
        default=None, description="The chosen trial's LR multiplier.",
        json_schema_extra={"words": "LR factor", "unit": "×"})
    least_working_factor: Optional[float] = Field(
        default=None, description="Of the trials that work, the multiplier nearest the run's own LR: how far the LR "
                                  "must move at least (None: none works).",
        json_schema_extra={"words": "nearest LR factor that trained", "unit": "×"})
    lr_owner: Optional[str] = Field(
        default=None, description="With several optimizers: the one whose LR alone, scaled by the chosen factor, is "
                                  "the fix (the others' alone are not); the chosen replay is that one.",
        json_schema_extra={"words": "optimizer whose LR is the fix"})
    least_working_lr: Optional[float] = Field(
        default=None, description="The LR the least working factor trains at: the run's LR at the checkpoint (the "
                                  "first param group of the optimizer it scales) times that factor.",
        json_schema_extra={"words": "nearest LR that trained"})
    optimizer_kind: Optional[str] = Field(
        default=None, description="The class of the optimizer whose LR the search scales (None: several of different "
                                  "classes, scaled together).",
        json_schema_extra={"words": "optimizer scaled"})
