"""The verification figures a counterfactual's outcome carries (VerifiedFix). The experiment measures the
pairing (`paired_with`: its reference's figures over the same steps, and the loss levels both are judged
against); the judge reads them (`judged`, triage/judge/fix.py: what "the fix works" means), and the walk
is what asks it, for every outcome it records (walk/engine.run_experiment). A search asks it too, of each
trial, to choose its next one.
"""

from __future__ import annotations

from typing import Optional

from triage.experiments.base import Outcome
from triage.experiments.neighbours import NeighbourAgreement
from triage.judge.fix import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN, end_of, judge_fix
from triage.judge.levels import LossLevels
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.verify import VerifiedFix

__all__ = ["DEFAULT_LEVEL_MARGIN", "DEFAULT_MARGIN", "VerifiedFix", "judged", "paired_with"]


def paired_with(*, reference: Optional[Outcome], against: Optional[str], levels: LossLevels,
                val_end: Optional[float] = None, neighbours: Optional[NeighbourAgreement] = None) -> dict:
    """The measured VerifiedFix fields of a counterfactual paired with `reference` (a replay-like outcome with
    `finite`, `loss_end`, `steps_run`, `val_final` and `val_neighbours`), its own validation loss at its end
    `val_end` and, where measured, its validation neighbour agreement: what the judge will read it against."""
    if against is None or reference is None:
        return {}
    reference_neighbours = getattr(reference, "val_neighbours", None)
    both = neighbours is not None and reference_neighbours is not None
    return dict(against=against, reference_end=_end(reference), reference_steps=getattr(reference, "steps_run", None),
                reference_ratio=getattr(reference, "loss_ratio", None),
                reference_val=getattr(reference, "val_final", None), fix_val=val_end, levels=levels,
                fix_val_neighbours=neighbours.agreement if both else None,
                reference_val_neighbours=reference_neighbours if both else None)


def judged(outcome: ReplayOutcome, *, margin: float = DEFAULT_MARGIN,
           level_margin: float = DEFAULT_LEVEL_MARGIN) -> dict:
    """The judge's reading of a paired counterfactual's figures (its own end, start and validation loss, against
    its reference's): the VerifiedFix fields it decides. Empty for an outcome paired with nothing."""
    if outcome.levels is None or outcome.reference_end is None:
        return {}
    verdict = judge_fix(finite=outcome.finite, loss_start=outcome.loss_start, loss_end=outcome.loss_end,
                        reference_end=outcome.reference_end, levels=outcome.levels, margin=margin,
                        level_margin=level_margin, fix_val=outcome.fix_val, reference_val=outcome.reference_val,
                        fix_neighbours=outcome.fix_val_neighbours, reference_neighbours=outcome.reference_val_neighbours,
                        neighbour_examples=outcome.val_neighbour_examples)
    # Stopped as out of contention, it never works: the end window of a replay cut short is not set against
    # the paired run's end over the same steps (a ResNet's clip stopped at step 10 on easy batches read 0.72
    # against the run's 1.04 at step 40), and a search never chooses such a trial.
    stopped = getattr(outcome, "raced_out", None)
    return verdict.model_dump(exclude={"reference_end"}) | ({"fix_works": False} if stopped else {})


def _end(reference: Outcome) -> float:
    return end_of(getattr(reference, "finite", False), getattr(reference, "loss_end", None))
