"""What a loss curve shows: the symptom classes of the validity check, measured on a `loop.Trace`.

The thresholds are the issue's: a window is the median of the first or last fifth of the finite losses;
divergence is a non-finite loss, an end window above 1.5x the start window, or a lasting spike; no
learning is an end window above 0.9x the start window or at the constant-predictor level; overfitting is
validation rising while training falls.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

from suite.loop import Trace

DIVERGENCE = "divergence"
NO_LEARNING = "no_learning"
OVERFITTING = "overfitting"
HIGH_START = "high_start"      # starts far above the constant-predictor level and never gets below it
VAL_LEAK = "val_leak"          # validation suspiciously good (measured by the check, not from one trace)
NONE = "none"

RISE = 1.5             # end window over start window: diverging
FLAT = 0.9             # end window over start window: not learning
SPIKE = 3.0            # a loss this many times the first one is a spike...
AT_CONSTANT = 0.95     # ...and an end window at this fraction of the constant-predictor level is "learned nothing"
FAR_ABOVE = 1.5        # an end window this many times the constant level is a blown-up run, not a plateau
HIGH = 3.0             # a first loss this many times the constant level is "far from expected"
CONVERGED = 0.1        # a flat curve below this fraction of the constant level has converged: not stuck
VAL_RISE = 1.05        # validation's last value over its best
MEANINGFUL = 0.02      # a difference in loss below this fraction of the constant level is noise


def windows(losses: tuple[float, ...]) -> tuple[Optional[float], Optional[float]]:
    """Median of the first and of the last fifth of the finite losses."""
    finite = [x for x in losses if math.isfinite(x)]
    if not finite:
        return None, None
    k = max(1, len(finite) // 5)
    return statistics.median(finite[:k]), statistics.median(finite[-k:])


@dataclass(frozen=True)
class Reading:
    """The figures one trace gives and the symptom flags they raise."""

    constant: float
    start: Optional[float]
    end: Optional[float]
    peak: Optional[float]
    first: Optional[float]
    first_raw: Optional[float]   # the first loss even when it is not finite
    nonfinite: bool
    rising: bool
    lasting_spike: bool
    far_above_constant: bool
    flat: bool
    at_constant: bool
    converged: bool
    val_first: Optional[float] = None
    val_best: Optional[float] = None
    val_last: Optional[float] = None
    val_rising: bool = False

    @property
    def diverged(self) -> bool:
        return self.nonfinite or self.rising or self.lasting_spike or self.far_above_constant

    @property
    def learns_nothing(self) -> bool:
        return not self.diverged and (self.flat or self.at_constant) and not self.converged

    @property
    def starts_high(self) -> bool:
        """The first loss far above the constant level (or already non-finite), and never below it."""
        if self.first_raw is None or not (self.first_raw >= HIGH * self.constant or math.isnan(self.first_raw)):
            return False
        return self.end is None or self.nonfinite or self.end >= AT_CONSTANT * self.constant

    @property
    def overfits(self) -> bool:
        return self.val_rising and not self.diverged and self.end is not None and self.end < self.start

    def symptoms(self) -> tuple[str, ...]:
        found = [name for name, on in ((DIVERGENCE, self.diverged), (NO_LEARNING, self.learns_nothing),
                                       (HIGH_START, self.starts_high), (OVERFITTING, self.overfits)) if on]
        return tuple(found)


def read(trace: Trace, constant: float) -> Reading:
    start, end = windows(trace.losses)
    finite = [x for x in trace.losses if math.isfinite(x)]
    nonfinite = len(finite) < len(trace.losses) or not finite
    first = finite[0] if finite else None
    peak = max(finite) if finite else None
    reading = dict(
        constant=constant, start=start, end=end, peak=peak, first=first, nonfinite=nonfinite,
        first_raw=trace.losses[0] if trace.losses else None,
        # rises and spikes count above the converged level: 0.0004 -> 0.0009 is noise, not divergence
        rising=bool(finite) and end > RISE * start and end > CONVERGED * constant,
        lasting_spike=bool(finite) and peak >= max(SPIKE * first, 0.5 * constant) and end >= FLAT * first,
        far_above_constant=bool(finite) and end >= FAR_ABOVE * constant,
        flat=bool(finite) and end > FLAT * start,
        at_constant=bool(finite) and end >= AT_CONSTANT * constant,
        converged=bool(finite) and end < CONVERGED * constant,
    )
    val = [v for v in trace.val_losses if math.isfinite(v)]
    if len(val) >= 2:
        reading.update(val_first=val[0], val_best=min(val), val_last=val[-1],
                       val_rising=val[-1] >= VAL_RISE * min(val) and val[-1] - min(val) >= MEANINGFUL * constant)
    return Reading(**reading)


def fixed_by(fixed: Reading, faulty: Reading, constant: float, on_validation: bool = False) -> bool:
    """Whether a counterfactual removes the symptom: it stays finite, does not diverge, ends at least 20%
    below the faulty run's end window (when that is finite) and below the constant-predictor level.
    For overfitting the comparison is on the last validation loss instead."""
    if fixed.diverged or fixed.end is None:
        return False
    if on_validation:
        if fixed.val_last is None or faulty.val_last is None or fixed.val_rising:
            return False
        return fixed.val_last <= 0.8 * faulty.val_last and fixed.val_last < FLAT * constant
    better = faulty.end is None or faulty.nonfinite or fixed.end <= 0.8 * faulty.end
    return better and fixed.end < FLAT * constant
