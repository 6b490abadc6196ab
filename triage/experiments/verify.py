"""The verification figures a counterfactual's outcome carries (VerifiedFix). The experiment measures the
pairing (`paired_with`: its reference's figures over the same steps, and the loss levels both are judged
against); the judge reads them (`judged`, triage/judge/fix.py: what "the fix works" means), and the walk
is what asks it, for every outcome it records (walk/engine.run_experiment). A search asks it too, of each
trial, to choose its next one.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.experiments.base import Outcome
from triage.judge.fix import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, SaneKind, end_of, judge_fix
from triage.judge.levels import LossLevels

__all__ = ["DEFAULT_LEVEL_MARGIN", "DEFAULT_MARGIN", "VerifiedFix", "judged", "paired_with"]


class VerifiedFix(Outcome):
    """The verification figures of a counterfactual (None where it was not paired with a reference)."""

    against: Optional[str] = Field(default=None, description="The node it is paired with: the run as it was.")
    reference_end: Optional[float] = Field(
        default=None, description="The reference's end-window loss (inf when it did not end finite).")
    reference_steps: Optional[int] = Field(
        default=None, description="The steps of the reference it was compared with: as many as its own (a fix "
                                  "extended past the reference's length is compared with the reference replayed "
                                  "as long).")
    improvement: Optional[float] = Field(
        default=None, description="loss_end / reference_end: lower is better; 0 when the reference blew up.")
    better: Optional[bool] = Field(default=None, description="Ends at most margin x the reference's end.",
                                   json_schema_extra={"ranks": "all"})
    sane_level: Optional[float] = Field(default=None, description="The level it must end below.")
    sane_kind: Optional[SaneKind] = Field(
        default=None, description="constant: level_margin x the best constant prediction's loss (label "
                                  "frequencies, mean target); chance: level_margin x ln K; start: its own start.")
    sane: Optional[bool] = Field(default=None, description="Ends below sane_level, and not below the loss's floor.",
                                 json_schema_extra={"ranks": "all"})
    fix_val: Optional[float] = Field(
        default=None, description="Its validation loss at its end (val_final), where the run has validation data.")
    reference_val: Optional[float] = Field(
        default=None, description="The reference's validation loss at its end, over the same steps.")
    levels: Optional[LossLevels] = Field(
        default=None, description="The loss levels both are judged against (the run's loss's, or the standard "
                                  "loss's for a replay scored by it): learning nothing, and the floor.")
    generalises: Optional[bool] = Field(
        default=None, description="Its validation loss ends lower than the reference's, clearly (None without "
                                  "validation data): a fix that only memorises the snapshot is none.",
        json_schema_extra={"ranks": "all"})
    fix_works: Optional[bool] = Field(default=None, description="Finite, better, sane and, where validation "
                                                                "data exists, generalising: the fix is verified.",
                                      json_schema_extra={"ranks": "all"})


def paired_with(*, reference: Optional[Outcome], against: Optional[str], levels: LossLevels,
                val_end: Optional[float] = None) -> dict:
    """The measured VerifiedFix fields of a counterfactual paired with `reference` (a replay-like outcome with
    `finite`, `loss_end`, `steps_run` and `val_final`), its own validation loss at its end `val_end`: what the
    judge will read it against."""
    if against is None or reference is None:
        return {}
    return dict(against=against, reference_end=_end(reference), reference_steps=getattr(reference, "steps_run", None),
                reference_val=getattr(reference, "val_final", None), fix_val=val_end, levels=levels)


def judged(outcome: Outcome, *, margin: float = DEFAULT_MARGIN, level_margin: float = DEFAULT_LEVEL_MARGIN) -> dict:
    """The judge's reading of a paired counterfactual's figures (its own end, start and validation loss, against
    its reference's): the VerifiedFix fields it decides. Empty for an outcome paired with nothing."""
    levels = getattr(outcome, "levels", None)
    reference_end = getattr(outcome, "reference_end", None)
    if levels is None or reference_end is None:
        return {}
    verdict = judge_fix(finite=bool(getattr(outcome, "finite", False)), loss_start=getattr(outcome, "loss_start", None),
                        loss_end=getattr(outcome, "loss_end", None), reference_end=reference_end, levels=levels,
                        margin=margin, level_margin=level_margin, fix_val=getattr(outcome, "fix_val", None),
                        reference_val=getattr(outcome, "reference_val", None))
    return verdict.model_dump(exclude={"reference_end"})


def _end(reference: Outcome) -> float:
    return end_of(getattr(reference, "finite", False), getattr(reference, "loss_end", None))
