"""Racing: when a candidate fix may stop before its last step, because it can no longer change the verdict.

A differential's candidate matters only by working (judge/fix.py); a trial of a search, once another trial
works, only by ending below the best of them. Each has a bar: the highest end window at which it would still
matter. A candidate whose end window, projected to its last step at the fastest pace its own losses allow,
stays clearly above that bar (by NOISE_SIGMAS of the step-to-step noise) stops there. Its last step is that of
its first window, or of its extension where its best projected end there could earn one (judge/extension.py).
A restart is not raced before it has begun to learn: a fresh init can sit at the loss of learning nothing for
a while and then fall fast (a ViT restarted at lr x0.01 sat at chance, 2.298, for 15 steps, and ended at 0.93),
so its pace at chance says nothing of its end. Racing decides where the steps go, never what counts as
verified: a stopped candidate is reported as stopped, with the figures that stopped it, and never wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from triage.judge.extension import LEARNS

# A projection must sit this many standard deviations of the step-to-step noise above the bar: the end window
# is a median of a few noisy steps, and one lucky stretch must not be what kept a candidate in.
NOISE_SIGMAS = 3.0
# The pace a projection assumes: the fall per step fitted to the latest half of the candidate's losses, plus
# this many standard errors of that fit, never less than none. A training curve bends upwards (it falls ever
# slower), so its latest pace carried on to the last step overstates what is left.
PACE_SIGMAS = 2.0
# No candidate stops before a quarter of the steps of its first window (10 of 40): a fix that needs a few
# steps to turn (a restart leaving its init, a higher LR leaving a plateau) is given them. At a half (20 of
# 40), every suite split walked as at a quarter, case by case, and saved 5.1% of the steps against 7.4%.
EARLIEST = 0.25
# How often a running candidate is looked at, in its steps: often enough to save most of what is left, each
# look a least-squares fit of a few dozen numbers.
EVERY = 5
# A paired run began where the candidate did when their first losses agree this closely (relative): one forward
# of the same batch at the same weights, to the rounding of another precision.
PAIRED_FIRST = 1e-3


@dataclass(frozen=True)
class Bar:
    """The highest end window at which a candidate still matters, and what ending under it would do."""

    level: float
    what: str


def lowest(bars: Sequence[Optional[Bar]]) -> Optional[Bar]:
    """The bar that binds: a candidate must clear each of them to matter."""
    known = [b for b in bars if b is not None and math.isfinite(b.level)]
    return min(known, key=lambda b: b.level) if known else None


def noise(losses: Sequence[float]) -> float:
    """Step-to-step noise of a loss curve: the spread of its steps' changes (1.4826 x their median absolute
    deviation, over sqrt 2: one step's own noise), which neither its trend nor one spike inflates (0 with fewer
    than three finite steps)."""
    finite = np.asarray([x for x in losses if math.isfinite(x)], dtype=float)
    if len(finite) < 3:
        return 0.0
    changes = np.diff(finite)
    return float(1.4826 * np.median(np.abs(changes - np.median(changes))) / math.sqrt(2))


def out_of_contention(losses: Sequence[float], *, steps: int, extend_to: int, bar: Bar, run_noise: float,
                      extendable: Callable[[float, float], bool], restart: bool = False,
                      learned_nothing: Optional[float] = None, paired: Sequence[float] = ()) -> Optional[str]:
    """Why a candidate that has run `losses` may stop (None: it stays in). It runs `steps`, and up to
    `extend_to` where, at `steps`, its figures earn more (`extendable(start, end)`, judge/extension.py);
    `run_noise` is the step-to-step noise of the run it is paired with. A `restart` stays in until it has
    begun to learn: its end window LEARNS x its start and, where known, under `learned_nothing` (the level a
    fix must end below, judge/fix.sane_level). `paired`: the losses of the run it is paired with, where both
    trained on the same batches in the same order from the same weights (its first loss the candidate's):
    the candidate is then projected by its gap to that run step by step, which the batches' own spread does not
    hide (a Barlow Twins replay at its peak LR, 15 under the run by step 19 with its batches' losses spread over
    196-244, read alone as flat and stopped; that LR wins over 120 steps)."""
    done = len(losses)
    last = extend_to if done >= steps else steps
    if done < max(3, EARLIEST * steps) or done % EVERY or done >= max(steps, extend_to):
        return None
    if not all(math.isfinite(x) for x in losses):
        return None  # a replay stops at its first non-finite step by itself
    start = float(np.median(losses[:max(1, steps // 5)]))
    pairs = _same_steps(losses, paired, restart)
    if pairs:
        gaps = [a - b for a, b in zip(losses, paired)]
        fit = _fit(gaps[done // 2:])
        # where the candidate stands: the paired run's end window, plus the gap as it is now
        current = float(np.median(paired[-max(1, len(paired) // 5):]) + np.median(gaps[-max(1, done // 5):]))
        sigma = noise(gaps[done // 2:])
    else:
        fit = _fit(list(losses[done // 2:]))
        current = float(np.median(losses[-max(1, done // 5):]))
        sigma = max(run_noise, noise(losses[done // 2:]))
    if fit is None:
        return None
    if restart and (current > LEARNS * start or (learned_nothing is not None and current >= learned_nothing)):
        return None
    pace = max(0.0, -fit[0] + PACE_SIGMAS * fit[1])
    if last == steps and extend_to > steps:  # could its end at `steps`, at best, earn it the longer window?
        if extendable(start, current - pace * (steps - done) - NOISE_SIGMAS * sigma):
            last = extend_to
    projected = current - pace * (last - done)
    if projected - NOISE_SIGMAS * sigma <= bar.level:
        return None
    said = "its loss (the paired run's end plus its gap to it now)" if pairs else "its loss"
    return (f"stopped after {done} of its {last} steps: {said} {current:.4g}, falling at most {pace:.3g} a step, "
            f"ends near {projected:.4g} at best, above the {bar.level:.4g} it needs to {bar.what} (by more than "
            f"{NOISE_SIGMAS:g}x the step-to-step noise, {sigma:.2g})")


def _same_steps(losses: Sequence[float], paired: Sequence[float], restart: bool) -> bool:
    """The paired run covers the candidate's steps so far, finite to its end, and began at the candidate's first
    loss (to PAIRED_FIRST of it: the same first batch at the same weights)."""
    done = len(losses)
    if restart or len(paired) < done or not all(math.isfinite(x) for x in paired):
        return False
    return abs(losses[0] - paired[0]) <= PAIRED_FIRST * abs(paired[0])


def _fit(losses: list[float]) -> Optional[tuple[float, float]]:
    """(slope per step, standard error of the slope) of a least-squares line."""
    n = len(losses)
    if n < 3:
        return None
    x = np.arange(n, dtype=float)
    y = np.asarray(losses, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    spread = float(np.sqrt(residual @ residual / (n - 2)))
    return float(slope), spread / float(np.sqrt(((x - x.mean()) ** 2).sum()))
