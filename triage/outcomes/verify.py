"""The verification figures a counterfactual's outcome carries (VerifiedFix): its pairing with its reference,
measured by the experiment, and the judge's reading of it (triage/judge/fix.py: what "the fix works" means),
which the walk asks for (triage/experiments/verify.py)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from triage.outcomes.base import Outcome
from triage.outcomes.levels import LossLevels

SaneKind = Literal["constant", "chance", "start"]  # what the sane level is made of


class VerifiedFix(Outcome):
    """The verification figures of a counterfactual (None where it was not paired with a reference)."""

    against: Optional[str] = Field(
        default=None, description="The node it is paired with: the run as it was.",
        json_schema_extra={"words": "compared with"})
    reference_end: Optional[float] = Field(
        default=None, description="The reference's end-window loss (inf when it did not end finite).",
        json_schema_extra={"words": "end loss of the run as it was"})
    reference_steps: Optional[int] = Field(
        default=None, description="The steps of the reference it was compared with: as many as its own (a fix "
                                  "extended past the reference's length is compared with the reference replayed as "
                                  "long).",
        json_schema_extra={"words": "steps of the run compared"})
    reference_ratio: Optional[float] = Field(
        default=None, description="The reference's own loss end / start over the steps compared.",
        json_schema_extra={"words": "the run's own loss end / start", "unit": "×"})
    improvement: Optional[float] = Field(
        default=None, description="loss_end / reference_end: lower is better; 0 when the reference blew up.",
        json_schema_extra={"words": "end loss vs the run as it was", "unit": "×"})
    better: Optional[bool] = Field(
        default=None, description="Ends at most margin x the reference's end.",
        json_schema_extra={"words": "clearly better than the run", "ranks": "all"})
    sane_level: Optional[float] = Field(
        default=None, description="The level it must end below: level_margin x the loss of learning nothing, else its "
                                  "own start (sane_kind).",
        json_schema_extra={"words": "level it must end below"})
    sane_kind: Optional[SaneKind] = Field(
        default=None, description="constant: level_margin x the best constant prediction's loss (label frequencies, "
                                  "mean target); chance: level_margin x ln K; start: its own start.",
        json_schema_extra={"words": "sane level from"})
    sane: Optional[bool] = Field(
        default=None, description="Ends below sane_level, and not below the loss's floor.",
        json_schema_extra={"words": "ends at a sane level", "ranks": "all"})
    fix_val: Optional[float] = Field(
        default=None, description="Its validation loss at its end (val_final), where the run has validation data.",
        json_schema_extra={"words": "validation loss with the fix"})
    reference_val: Optional[float] = Field(
        default=None, description="The reference's validation loss at its end, over the same steps.",
        json_schema_extra={"words": "validation loss of the run as it was"})
    fix_val_neighbours: Optional[float] = Field(
        default=None, description="Where the labels name groups, not output columns: its validation examples' "
                                  "nearest-neighbour label agreement at its end (val_neighbours).",
        json_schema_extra={"words": "validation neighbour agreement with the fix"})
    reference_val_neighbours: Optional[float] = Field(
        default=None, description="The reference's, over the same steps.",
        json_schema_extra={"words": "validation neighbour agreement of the run as it was"})
    val_neighbour_examples: Optional[int] = Field(
        default=None, description="The distinct validation examples its neighbour agreement compared (the "
                                  "reference's are the same batches).",
        json_schema_extra={"words": "validation examples compared by neighbours"})
    neighbours_higher: Optional[bool] = Field(
        default=None, description="Its validation neighbour agreement ends above the reference's by NEIGHBOUR_Z "
                                  "standard errors of the difference (None where not measured): for labels that "
                                  "name groups, the figure a fix is judged by in place of the loss's values.",
        json_schema_extra={"words": "validation neighbours clearly higher", "ranks": "all"})
    levels: Optional[LossLevels] = Field(
        default=None, description="The loss levels both are judged against (the run's loss's, or the standard "
                                  "loss's for a replay scored by it): the loss of learning nothing, and the floor.",
        json_schema_extra={"words": "loss levels judged against"})
    generalises: Optional[bool] = Field(
        default=None, description="Its validation loss ends lower than the reference's, clearly (None without "
                                  "validation data): a fix that only memorises the snapshot is none.",
        json_schema_extra={"words": "lower on validation too", "ranks": "all"})
    fix_works: Optional[bool] = Field(
        default=None, description="Finite, better, sane and, where validation data exists, generalising (or, where "
                                  "the labels name groups, its validation neighbours clearly higher in place of both "
                                  "'better' and 'generalising'): the fix is verified.",
        json_schema_extra={"words": "fix works", "ranks": "all"})
