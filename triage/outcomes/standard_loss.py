"""What standard_loss_swap measures: the replay trained on the standard loss for the model's outputs,
against the run as it was scored by the same loss (triage/experiments/standard_loss.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from triage.outcomes.replay import ReplayOutcome

Rule = Literal["cross_entropy", "soft_cross_entropy", "binary_cross_entropy", "binary_cross_entropy_on_probabilities",
               "mse"]


class StandardLossOutcome(ReplayOutcome):
    """The replay trained on the standard loss (its losses in that loss), verified against the run as it
    was scored by the same loss (`run_losses`, its end window `reference_end`): `against` stays None, the
    pairing is inside."""

    rule: Rule = Field(
        description="The standard loss for these outputs and targets: cross_entropy on the raw scores and class "
                    "targets; soft_cross_entropy against target distributions (rows of probabilities); "
                    "binary_cross_entropy on 0/1 targets, the raw outputs as logits (or _on_probabilities); mse on "
                    "the raw outputs.",
        json_schema_extra={"words": "rule"})
    run_losses: list[float] = Field(
        description="The run as it was, replayed from the same start on its own loss, scored per step by the standard "
                    "loss.",
        json_schema_extra={"words": "run losses"})
