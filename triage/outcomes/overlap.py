"""What overlap_check measures: validation examples that also appear among the training batches, or
are training windows shifted by a few steps (triage/experiments/overlap.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome

MAX_SHIFT = 32  # shifted windows: a sequence compared with others moved by 1 to MAX_SHIFT steps (at most half its own)
# Near copies: a val example nearer a training one than this quantile of the training examples' distances to
# their nearest other one (and than half its distance to the nearest other val example).
NEAR_QUANTILE = 0.05


class OverlapOutcome(Outcome):
    has_val: bool = Field(description="The run has validation batches.", json_schema_extra={"words": "has validation"})
    train_examples: int = Field(default=0, json_schema_extra={"words": "train examples"})
    val_examples: int = Field(default=0, json_schema_extra={"words": "validation examples"})
    duplicates: int = Field(
        default=0, description="Val examples that are also a train example, every tensor of them alike.",
        json_schema_extra={"words": "duplicates"})
    duplicate_fraction: Optional[float] = Field(
        default=0.0, description="duplicates / val_examples; unknown where examples are not rows.",
        json_schema_extra={"words": "duplicate share", "unit": "%"})
    train_repeat_fraction: Optional[float] = Field(
        default=None, description="Training examples that another training example of the snapshot repeats exactly, "
                                  "beyond the snapshot's passes over its data (each example's count above the least "
                                  "count): how often an example drawn from the same data repeats one already drawn.",
        json_schema_extra={"words": "training examples repeated within training", "unit": "%"})
    first_duplicates: list[int] = Field(
        default_factory=list, description="Up to 20 val example indices.",
        json_schema_extra={"words": "first duplicates"})
    duplicate_loss: Optional[float] = Field(
        default=None, description="The run's loss at the checkpoint on the validation examples that are training "
                                  "examples, averaged over them (eval mode); None where there are none, or all "
                                  "are, or they cannot be selected apart.",
        json_schema_extra={"words": "loss on the duplicated validation examples"})
    other_loss: Optional[float] = Field(
        default=None, description="The same on the validation examples that are not training examples.",
        json_schema_extra={"words": "loss on the other validation examples"})
    not_measured: Optional[str] = Field(
        default=None, description="Why the examples could not be compared.",
        json_schema_extra={"words": "not measured"})
    shifted_copies: int = Field(
        default=0, description="Val examples whose input sequence is a training "
                               f"example's moved by 1 to {MAX_SHIFT} steps (sliding windows), over the part "
                               "they share.",
        json_schema_extra={"words": "validation windows shifted from training"})
    shifted_fraction: Optional[float] = Field(
        default=None, description="shifted_copies / val_examples; None where the inputs are not sequences.",
        json_schema_extra={"words": "shifted-window share", "unit": "%"})
    near_copies: int = Field(
        default=0, description="Val examples, exact copies left out, nearer their nearest training example than "
                               f"{1 - NEAR_QUANTILE:.0%} of the snapshot's training examples are to their nearest "
                               "other one, and nearer it than half their distance to the nearest other val example "
                               "(every tensor of the example, each column scaled over training).",
        json_schema_extra={"words": "validation examples near a training one"})
    near_fraction: Optional[float] = Field(
        default=None, description="near_copies over the val examples compared (exact copies left out); None where "
                                  "the examples' rows could not be compared.",
        json_schema_extra={"words": "near-copy share", "unit": "%"})
    near_distance_ratio: Optional[float] = Field(
        default=None, description="The val examples' median distance to their nearest training example over the "
                                  "training examples' to their nearest other one (about 1 for a random split).",
        json_schema_extra={"words": "distance to training, validation over training"})
    near_loss: Optional[float] = Field(
        default=None, description="The run's loss at the checkpoint on the near val examples, averaged over them "
                                  "(eval mode); None where there are none or they cannot be selected apart.",
        json_schema_extra={"words": "loss on the near validation examples"})
    far_loss: Optional[float] = Field(
        default=None, description="The same on the other val examples.",
        json_schema_extra={"words": "loss on the other validation examples"})
