"""What a search over one setting (experiments/search.py: the LR on a x10 grid, alternative inits) decides
from its trials' figures: when to stop, whether a half-decade between two grid points is worth a trial,
and which trial it chose. Each trial is a replay paired with the run as it was; the judge reads only the
figures below."""

from __future__ import annotations

import math
from typing import Callable, Optional, Protocol, Sequence, TypeVar

from triage.judge.named import DIVERGES_LOSS_RATIO
from triage.judge.race import Bar

STILL = 0.02  # a trial that moved the loss under 2% did not move it


class TrialFigures(Protocol):
    """What the judge reads of a trial's replay."""

    finite: bool
    loss_end: Optional[float]
    loss_ratio: Optional[float]
    improvement: Optional[float]
    fix_works: bool


T = TypeVar("T")
Trials = Sequence[tuple[T, TrialFigures]]


def settled(trials: Trials, direction: str) -> bool:
    """Stop once a trial worked and the latest is no better than the best; going up, also once a
    trial diverged (non-finite, or its loss up 50%): a higher LR only diverges sooner, and a loss that
    climbs to 10^8 and falls back to 0 is no fix for a plateau; going down, also once the LR is too
    small to move the loss: the latest trial moved it under 2% and ended no lower than the one before
    (a still lower LR moves it less). Not going up: there a unit slip (x1e4) moves nothing until the
    grid reaches it."""
    latest = trials[-1][1]
    if direction == "up" and diverged(latest):
        return True
    if direction == "down" and len(trials) > 1 and still(latest) and end(latest) >= end(trials[-2][1]):
        return True
    working = [o for _, o in trials if o.fix_works]
    return bool(working) and (not latest.fix_works or latest is not min(working, key=end))


def between(trials: Trials, direction: str) -> Optional[float]:
    """When no trial on the x10 grid worked, but the best of them ended below the run as it was: the
    half-decade between it and the next higher LR (the run's own, going down from the best at x0.1). An
    LR that trains often sits in that gap, just under where training turns unstable: on the grid one
    step is still too high and the next too slow to get anywhere in the replay's steps. Where no grid
    LR even beat the run, the LR is not what holds it back, and a lucky half-decade would say it is."""
    if any(o.fix_works for _, o in trials):
        return None
    finite = [(f, o) for f, o in trials if math.isfinite(end(o))]
    if not finite:
        return None
    best, outcome = min(finite, key=lambda t: end(t[1]))
    if outcome.improvement is None or outcome.improvement >= 1:
        return None
    higher = [f for f, _ in trials if f > best] + ([1.0] if direction == "down" else [])
    return math.sqrt(best * min(higher)) if higher else None


def choose(trials: Trials) -> tuple:
    """The working trial that ends lowest; when none works, the finite one that ends lowest."""
    working = [t for t in trials if t[1].fix_works]
    finite = [t for t in trials if t[1].finite and t[1].loss_end is not None]
    pool = working or finite or list(trials)[-1:]
    return min(pool, key=lambda t: end(t[1]))


def to_beat(trials: Trials, setting: Callable[[T], str], factor: Optional[float] = None) -> Optional[Bar]:
    """The bar a later trial, raced (judge/race.py), must end under to matter: once a trial works, a later one
    is chosen only by ending below the best that works. On an LR grid (`factor`, the later trial's multiplier),
    a trial nearer the run's own LR than every one that works could still be the least that works: no bar."""
    working = [(s, o.loss_end) for s, o in trials if o.fix_works and o.loss_end is not None]
    if not working:
        return None
    if factor is not None and any(abs(math.log10(factor)) < abs(math.log10(f)) for f, _ in working):
        return None
    best, best_end = min(working, key=lambda t: t[1])
    return Bar(best_end, f"end below {setting(best)}'s {best_end:.4g}, the best trial that works")


def to_matter(trials: Trials, setting: Callable[[T], str], working: Optional[float]) -> Optional[Bar]:
    """Before any trial works, where the search's choice is read beyond its own differential: a later trial
    matters by working (its end under `working`, the highest end that could) or by ending below every finite
    trial so far (choose's pick when none works). None where any end could work or no trial ended finite."""
    finite = [(s, end(o)) for s, o in trials if math.isfinite(end(o))]
    if working is None or not finite:
        return None
    best, lowest_end = min(finite, key=lambda t: t[1])
    return Bar(max(lowest_end, working), f"work, or end below {setting(best)}'s {lowest_end:.4g}, the lowest so far")


def least_working(trials: Trials) -> Optional[float]:
    """Of the trials (LR multipliers) whose fix works, the multiplier nearest 1 (in orders of magnitude)."""
    working = [factor for factor, o in trials if o.fix_works]
    return min(working, key=lambda f: abs(math.log10(f))) if working else None


def still(outcome: TrialFigures) -> bool:
    return outcome.finite and outcome.loss_ratio is not None and abs(outcome.loss_ratio - 1) < STILL


def diverged(outcome: TrialFigures) -> bool:
    return not outcome.finite or (outcome.loss_ratio is not None and outcome.loss_ratio > DIVERGES_LOSS_RATIO)


def end(outcome: TrialFigures) -> float:
    return outcome.loss_end if outcome.loss_end is not None and outcome.finite else float("inf")
