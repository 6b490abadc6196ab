"""One definition of "the fix works" (DESIGN §4), for every experiment that applies a fix.

A counterfactual, started from the same state as the run it is paired with (its reference), works when
- it stays finite to the end: a spike it recovers from is fine, only its end window counts;
- it ends clearly better than the run as it was: its end window (the median of its last fifth of
  steps) at most `margin` x the reference's, and lower by at least MIN_GAIN of the loss of learning
  nothing (a converged run's noise is no fault fixed), or the reference did not end finite at all;
- it ends at a sane level: clearly below (`level_margin` x) the loss of a model that learned nothing
  about its inputs — predicting the label frequencies for a classifier (ln K where they cannot be
  measured), the mean target for a regressor — or below its own start when neither is known.
  Staying finite at an absurd level (10^7 x chance) is not a fix, nor is ending at chance.
- and it does not end below the loss's floor (0 for cross-entropy, MSE, BCE, ...: levels.py):
  a loss under the least it can score is a symptom (a term with the wrong sign), however low. Where the
  loss has neither a level nor a floor measured and the run ends above zero, an end below zero is not
  "better" either: lower is not known to be better where the run's loss never went.
- where the run has validation data, it also ends with a lower validation loss than the reference, by the
  same MIN_GAIN: a replay loops a small snapshot, and a higher LR "fixes" a healthy run by memorising it
  (a recommender at lr x10: training loss 0.10 against 0.42, validation 0.57 against 0.42).
- where the labels name groups of examples, not output columns (metric learning), a validation
  nearest-neighbour agreement higher beyond binomial noise is both "clearly better" and "lower on
  validation": a miner hands the loss the triplets that still violate its margin, so its value, on training
  or validation batches, does not compare two models (a triplet run at its healthy LR: validation loss
  0.136 -> 0.213 while precision@1 rose 0.77 -> 0.96).
"""

from __future__ import annotations

import math
from typing import Optional

from pydantic import BaseModel, ConfigDict

from triage.judge.levels import LossLevels, below_floor
from triage.outcomes.verify import SaneKind  # what the sane level is made of

DEFAULT_MARGIN = 0.8  # "clearly better": the end window at least 20% below the run's
DEFAULT_LEVEL_MARGIN = 0.9  # "clearly below" learning nothing: 10% under it, more than noise
# "Clearly better" in size too: the gain at least 1% of the loss of learning nothing. A run that has all but
# memorised its data (0.008 against ln 10 = 2.3) ends 40% "better" by the noise of a few batches.
MIN_GAIN = 0.01
# "Clearly higher" for a share of validation examples: this many binomial standard errors of the difference.
# Three, not two: the binomial error leaves out the replay's own noise (six replays of one healthy triplet run,
# differing only in batch order, ended 0.922-0.965; at two errors 1 ordered pair in 30 passed) and a search
# tries several candidates.
NEIGHBOUR_Z = 3.0


class FixVerdict(BaseModel):
    """The judge's reading of one counterfactual against its reference (the fields of VerifiedFix)."""

    model_config = ConfigDict(frozen=True)

    reference_end: float
    improvement: Optional[float]
    better: bool
    sane_level: Optional[float]
    sane_kind: SaneKind
    sane: bool
    generalises: Optional[bool]
    neighbours_higher: Optional[bool]
    fix_works: bool


def judge_fix(*, finite: bool, loss_start: Optional[float], loss_end: Optional[float], reference_end: float,
              levels: LossLevels, margin: float = DEFAULT_MARGIN, level_margin: float = DEFAULT_LEVEL_MARGIN,
              fix_val: Optional[float] = None, reference_val: Optional[float] = None,
              fix_neighbours: Optional[float] = None, reference_neighbours: Optional[float] = None,
              neighbour_examples: Optional[int] = None) -> FixVerdict:
    """A counterfactual's own figures against its reference's end window (inf when the reference did not
    end finite), and their validation losses (and neighbour agreements, on `neighbour_examples`) at their
    ends where both were measured."""
    ended = finite and loss_end is not None and math.isfinite(loss_end)
    improvement, better = None, False
    level, kind = sane_level(levels, loss_start, level_margin)
    if ended:
        if not math.isfinite(reference_end):
            improvement, better = 0.0, True
        elif reference_end > 0:
            improvement = loss_end / reference_end
            nothing = levels.nothing_learned
            better = improvement <= margin and not (nothing and reference_end - loss_end < MIN_GAIN * nothing)
            # A loss with neither level nor floor measured (a critic's score, a likelihood of unknown form) that
            # the run ends above zero: a counterfactual ending below zero went where the run's loss is not, and
            # lower is not known to be better there (an unbounded term running off: a WGAN critic at lr x1000).
            better = better and not (loss_end < 0 and kind == "start" and levels.floor is None)
        else:  # a loss that can go negative: "clearly" is the same share of its size
            better = loss_end < reference_end - (1 - margin) * abs(reference_end)
    sane = bool(ended and level is not None and loss_end < level and not below_floor(levels, loss_end))
    generalises = _generalises(fix_val, reference_val, levels)
    higher = _clearly_higher(fix_neighbours, reference_neighbours, neighbour_examples)
    by_neighbours = bool(higher)  # in place of both the loss's "better" and its validation figure
    return FixVerdict(reference_end=reference_end, improvement=improvement, better=better, sane_level=level,
                      sane_kind=kind, sane=sane, generalises=generalises, neighbours_higher=higher,
                      fix_works=bool(ended and sane and (by_neighbours or (better and generalises is not False))))


def highest_working_end(*, reference_end: float, levels: LossLevels, margin: float = DEFAULT_MARGIN,
                        level_margin: float = DEFAULT_LEVEL_MARGIN) -> Optional[float]:
    """The highest end window at which a counterfactual against `reference_end` could still work, as
    judge_fix reads it (None: any end could, as far as is known before its own start is): clearly better than
    the reference, and under the sane level where that level is not the counterfactual's own start."""
    bars = []
    if math.isfinite(reference_end) and reference_end > 0:
        nothing = levels.nothing_learned
        bars += [margin * reference_end] + ([reference_end - MIN_GAIN * nothing] if nothing else [])
    elif math.isfinite(reference_end):
        bars.append(reference_end - (1 - margin) * abs(reference_end))
    level, kind = sane_level(levels, None, level_margin)
    if level is not None and kind != "start":
        bars.append(level)
    return min(bars) if bars else None


def _generalises(fix_val: Optional[float], reference_val: Optional[float], levels: LossLevels) -> Optional[bool]:
    """The fix's validation loss is lower than the reference's, by MIN_GAIN of the loss of learning nothing
    (by any amount where that is unknown); None where either was not measured."""
    if fix_val is None or reference_val is None or not math.isfinite(reference_val):
        return None
    nothing = levels.nothing_learned
    return fix_val < reference_val - (MIN_GAIN * nothing if nothing and nothing > 0 else 0.0)


def _clearly_higher(fix: Optional[float], reference: Optional[float], examples: Optional[int]) -> Optional[bool]:
    """The fix's share above the reference's by NEIGHBOUR_Z standard errors of the difference of two shares
    of `examples` each; None where either was not measured."""
    if fix is None or reference is None or not examples:
        return None
    noise = math.sqrt((fix * (1 - fix) + reference * (1 - reference)) / examples)
    return fix - reference > NEIGHBOUR_Z * max(noise, 1 / examples)


def end_of(finite: bool, loss_end: Optional[float]) -> float:
    """A reference's end window as a fix is judged against it: inf where it did not end finite."""
    if not finite or loss_end is None or not math.isfinite(loss_end):
        return math.inf
    return float(loss_end)


def sane_level(levels: LossLevels, loss_start: Optional[float],
               level_margin: float = DEFAULT_LEVEL_MARGIN) -> tuple[Optional[float], SaneKind]:
    """The level a fix must end below, and what it is: `level_margin` x the best constant prediction's loss,
    else x ln K, else the counterfactual's own start."""
    if levels.constant is not None and levels.constant > 0:
        return level_margin * levels.constant, "constant"
    if levels.chance is not None:
        return level_margin * levels.chance, "chance"
    return loss_start, "start"
