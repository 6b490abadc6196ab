"""Which candidate of a differential wins, and how sure that is: the lowest tier whose fix works (tier 1
where the abnormality a candidate repairs was measured), the lowest score within it; medium where a rival
of another cause at that tier ends about as low, or where a candidate relevant to the symptom was not
measured to its end; never more than the winner's own `confidence:` (a drastic change that won with
nothing measured for it to repair), nor than medium where the LR that trained is over FAR_FACTOR away
from the run's own or past what its optimizer is usually run at; low where no fix works."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from triage.records import CandidateResult, Confidence


# A rival fix of another cause at the winner's tier whose score is within this ratio of the winner's makes
# the verdict medium: the data cannot tell the two apart (a playbook's differential node may set `close`).
CLOSE = 0.8

# An LR fix more than three orders of magnitude from the run's own (x1e4, x1e-4) is rarely a mistyped LR:
# something else scales the step (gradients summed over a closure's calls, a loss summed, not averaged).
# A run whose LR-scaled replay trains is still evidence, not a confirmed cause. (A slip of x1000, 1e-3
# written as 1e-6, is common enough to keep its "high".)
FAR_FACTOR = 1000.0

# The learning rates each optimizer is run at in practice: PyTorch's default inside, the edges those of
# the usual tuning grids (1e-6..1e-1 for the adaptive methods, whose steps are normalised; plain SGD up to
# 10 under large batches and normalisation layers; L-BFGS at 1 with a line search). A fix that takes the
# LR past the far edge in its own direction (Adam raised to 1, L-BFGS to 1000, SGD lowered to 1e-8)
# compensates for something else far more often than it undoes a mistyped LR. Optimizers not named here
# have no range, and only FAR_FACTOR applies.
_ADAPTIVE = (1e-7, 0.1)
USUAL_LR: dict[str, tuple[float, float]] = {
    "Adam": _ADAPTIVE, "AdamW": _ADAPTIVE, "NAdam": _ADAPTIVE, "RAdam": _ADAPTIVE, "Adamax": _ADAPTIVE,
    "SparseAdam": _ADAPTIVE, "RMSprop": _ADAPTIVE, "Adagrad": (1e-6, 1.0), "SGD": (1e-6, 10.0),
    "LBFGS": (1e-3, 10.0),
}


def far_fetched(lr_factor: object, moved_to: object = None, optimizer_kind: object = None) -> Optional[str]:
    """Why a fix at this LR multiplier may claim medium at most (None: a factor of an ordinary size, to an LR
    inside what the optimizer is usually run at). `moved_to` is the LR the factor trains at, of an optimizer
    of class `optimizer_kind`."""
    if not _positive(lr_factor):
        return None
    if not 1 / FAR_FACTOR <= lr_factor <= FAR_FACTOR:
        return (f"the LR that trained is x{lr_factor:g} the run's own, over {FAR_FACTOR:g}x away: a loop or a "
                "loss that scales the step (gradients summed over calls, a sum where a mean was meant) is as "
                "likely as a mistyped LR")
    usual = USUAL_LR.get(optimizer_kind) if isinstance(optimizer_kind, str) else None
    if usual is None or not _positive(moved_to):
        return None
    low, high = usual
    if lr_factor > 1 and moved_to > high:
        side = "above"
    elif lr_factor < 1 and moved_to < low:
        side = "below"
    else:
        return None
    return (f"the LR that trained, {moved_to:g} (x{lr_factor:g} the run's own), is {side} the LRs {optimizer_kind} "
            f"is usually run at ({low:g} to {high:g}): a loop or a loss that scales the step is as likely as a "
            "mistyped LR")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def tier_of(declared: int, abnormal: Optional[bool]) -> int:
    """A candidate's tier as ranked: 1 where its `measured` abnormality held, else the tier written."""
    return 1 if abnormal else declared


def outranked(*, leads_to_a_cause: bool, read_later: bool, lower_tier_works: Iterable[Optional[bool]]) -> bool:
    """Not worth running: a fix of a lower tier already works, so this one could neither win nor come close
    (both need the winner's tier). A control, or a candidate a later one reads, still runs."""
    return leads_to_a_cause and not read_later and any(works is True for works in lower_tier_works)


@dataclass(frozen=True)
class Judgement:
    winner: Optional[CandidateResult]
    also: frozenset[str]  # rivals of another cause at the winner's tier that end about as low
    confidence: Confidence


def judge_candidates(results: list[CandidateResult], cause_of: Callable[[Optional[str]], Optional[str]],
                     close: float) -> Judgement:
    """The winner among candidates measured to their end (`works`, `score` filled), by tier then score."""
    working = [r for r in results if r.then and r.works]
    if not working:
        return Judgement(winner=None, also=frozenset(), confidence="low")
    winner = min(working, key=lambda r: (r.tier, r.score if r.score is not None else math.inf))
    # A rival of another cause at the winner's tier that ends about as low: the data cannot tell the two
    # apart. A working rival of a lower tier is the expected masking (a higher LR also "fixes" a clip
    # that is too tight) and does not lower the confidence.
    cause = cause_of(winner.then)
    also = frozenset(r.id for r in working if cause_of(r.then) != cause and r.tier == winner.tier
                     and is_close(r.score, winner.score, close))
    # "high" needs every candidate relevant to the symptom measured to its end: one that raised, ran out of
    # memory or time, or could not run in this setup might have been the better fix.
    unmeasured = any(r.then and r.status is not None and r.status != "ok" for r in results)
    confidence: Confidence = "medium" if also or unmeasured else "high"
    if winner.cap is not None:  # a drastic change that won with nothing measured to repair: it may only mask
        confidence = min(confidence, winner.cap, key=("low", "medium", "high").index)
    return Judgement(winner=winner, also=also, confidence=confidence)


def is_close(score: Optional[float], best: Optional[float], close: float) -> bool:
    """A competitor's score is within `close` of the winner's (both lower-is-better); unknown or
    non-positive scores cannot show a clear gap, so they count as close."""
    if score is None or best is None or score <= 0 or best <= 0:
        return True
    return best / score >= close
