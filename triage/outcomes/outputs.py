"""What output_check measures: whether the model outputs raw scores, probabilities or log-probabilities,
and how its loss compares with the standard loss for them (triage/experiments/outputs.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class OutputCheckOutcome(Outcome):
    has_output: bool = Field(
        description="A floating output of dim >= 2 was seen.",
        json_schema_extra={"words": "has output"})
    output_dim: Optional[int] = Field(
        default=None, description="The output's last dim (K for a classifier).",
        json_schema_extra={"words": "output dim"})
    output_min: Optional[float] = Field(default=None, json_schema_extra={"words": "output min"})
    output_max: Optional[float] = Field(default=None, json_schema_extra={"words": "output max"})
    looks_like_probabilities: bool = Field(
        default=False, description="In [0, 1], rows sum to 1.",
        json_schema_extra={"words": "looks like probabilities"})
    looks_like_log_probabilities: bool = Field(
        default=False, description="<= 0, rows' logsumexp is 0.",
        json_schema_extra={"words": "looks like log probabilities"})
    loss_checkpoint: Optional[float] = Field(
        default=None, description="Mean loss over the batches checked, at the checkpoint's weights.",
        json_schema_extra={"words": "loss at the checkpoint"})
    probability_ce_floor: Optional[float] = Field(
        default=None, description="ln(e + K - 1) - 1: the lowest cross-entropy reachable when the scores fed to it "
                                  "are probabilities (a perfect one-hot still leaves this).",
        json_schema_extra={"words": "probability cross-entropy floor"})
    loss_floor_ratio: Optional[float] = Field(
        default=None, description="loss_checkpoint / probability_ce_floor: ~1 or above with probability outputs is a "
                                  "loss that cannot go lower.",
        json_schema_extra={"words": "loss floor ratio", "unit": "×"})
    squashed: bool = Field(
        default=False, description="Every output lies in [0, 1] (sigmoid or softmax).",
        json_schema_extra={"words": "squashed", "ranks": "all"})
    scores_squashed: bool = Field(
        default=False, description="What the run's loss hands a loss on raw scores (binary_cross_entropy_with_logits, "
                                   "cross_entropy) lies in [0, 1] on every call: squashed before it, in forward() or "
                                   "after it.",
        json_schema_extra={"words": "scores squashed before the loss", "ranks": "all"})
    least_spread: Optional[float] = Field(
        default=None, description="How far the model's least spread floating output spreads over the examples: its "
                                  "rows scaled to unit length, their std over the rows averaged over the d "
                                  "dimensions, times sqrt(d). About 1 for outputs spread over every direction; near 0 "
                                  "for the same vector whatever the input (a collapsed representation).",
        json_schema_extra={"words": "least spread of an output", "unit": "×"})
    scores_min: Optional[float] = Field(
        default=None, description="The least value the run's loss handed a loss on raw scores, over every call "
                                  "(None: no such call, or a non-finite value).",
        json_schema_extra={"words": "least score handed the loss"})
    scores_max: Optional[float] = Field(
        default=None, description="The greatest such value.",
        json_schema_extra={"words": "greatest score handed the loss"})
    scores_unsquashed_loss: Optional[float] = Field(
        default=None, description="The loss with those scores' squashing undone (log of probability rows, logit of "
                                  "[0, 1] values) where the score loss receives them.",
        json_schema_extra={"words": "loss on the scores unsquashed"})
    unstable_margin: Optional[float] = Field(
        default=None, description="The least margin (of 10, 20, 30 logits) on every example's true class at which "
                                  "the run's loss is finite and its gradient on the output is not: once the model "
                                  "is that sure of one example, the batch's gradient is NaN. None where it stays "
                                  "finite, or no classifier's prediction could be built.",
        json_schema_extra={"words": "margin (logits) at which the loss's gradient turns non-finite", "ranks": "min"})
    unstable_op: Optional[str] = Field(
        default=None, description="The backward op autograd's anomaly mode named for that non-finite gradient.",
        json_schema_extra={"words": "op whose gradient turns non-finite"})
    unstable_source: Optional[str] = Field(
        default=None, description="file:line of the user's forward call that built that op.",
        json_schema_extra={"words": "where that op is built"})
    unstable_line: Optional[str] = Field(
        default=None, description="That line of source.", json_schema_extra={"words": "its line"})
    targets_discrete: bool = Field(
        default=False, description="The targets are class indices or 0/1 values (what a loss on scores expects; pixel "
                                   "intensities are not).",
        json_schema_extra={"words": "targets discrete", "ranks": "all"})
    unsquashed_loss: Optional[float] = Field(
        default=None, description="The loss when the model's output is replaced by its squashing undone (log of "
                                  "probability rows, logit of [0, 1] values); None when the loss refuses such values "
                                  "(it wanted probabilities).",
        json_schema_extra={"words": "unsquashed loss"})
    unsquash_ratio: Optional[float] = Field(
        default=None, description="unsquashed_loss / loss_checkpoint: well below 1 is a loss that squashes what the "
                                  "model already squashed (sigmoid into BCEWithLogits, ...).",
        json_schema_extra={"words": "unsquash ratio", "unit": "×"})
    standard_rule: Optional[str] = Field(
        default=None, description="The standard loss for these outputs and targets: cross_entropy (raw scores, class "
                                  "targets), soft_cross_entropy (target distributions), binary_cross_entropy (0/1 "
                                  "targets; _on_probabilities when the model squashes its output) or mse (raw values, "
                                  "float targets); None when none pairs.",
        json_schema_extra={"words": "standard rule"})
    standard_loss: Optional[float] = Field(
        default=None, description="That loss at the checkpoint (eval mode).",
        json_schema_extra={"words": "standard loss"})
    loss_vs_standard: Optional[float] = Field(
        default=None, description="The run's own loss / the standard loss, on the same forwards: 1 when the run's "
                                  "loss is the standard one.",
        json_schema_extra={"words": "loss vs standard", "unit": "×"})
    standard_level_ratio: Optional[float] = Field(
        default=None, description="The standard loss at the checkpoint / its loss of learning nothing (label entropy, "
                                  "binary entropy, target variance): how much the model has learned by the standard "
                                  "measure, whatever its own loss says.",
        json_schema_extra={"words": "standard level ratio", "unit": "×"})
    weighting_spread: Optional[float] = Field(
        default=None, description="How far the gradient the run's loss sends into the output is from the standard "
                                  "loss's times one positive weight per group (a class's rows; a column's positives "
                                  "or negatives): the largest (max - min) / the larger in size of their ratio within "
                                  "a group. About 0 where the run's loss is the standard one weighted (pos_weight, "
                                  "class weights), 1 or more where the two point different ways; none where no "
                                  "groups are known (a regressor).",
        json_schema_extra={"words": "gradient's spread from a weighted standard loss", "unit": "×"})
    gradient_vs_standard: Optional[float] = Field(
        default=None, description="|d own/d output - d standard/d output| / |d standard/d output| at the checkpoint: "
                                  "0 when the run's loss is the standard one; above a few percent, a loss of its own "
                                  "making (even where the two values agree).",
        json_schema_extra={"words": "gradient vs standard", "unit": "×"})
