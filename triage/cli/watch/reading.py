"""`triage read-history`: what a loss log alone says (diverged, plateau, oscillating or healthy) and the
step it started. An unverified reading: it names the symptom, never the cause; `triage run` finds that by
experiment. Pure functions of the logged numbers.

The curve is smoothed by a centred running median over `window` points (a twentieth of the log, even, at least 4),
so one noisy batch decides nothing. In the order checked:

    diverged     a non-finite loss
    oscillating  over the last half, the loss swings around its smoothed trend by more than half of that
                 trend's level (10th to 90th percentile of the residuals) and more than twice as much as over
                 the log's first quarter, while the trend moved less than the swing
    diverged     the loss ended above its best by more than half of what the run had gained from its start
                 to that best (and by more than 10 % of the best's size)
    diverged     the log ends in a spike (the flight recorder's spike test fired within the last window)
    plateau      over the last third, the loss fell less than 1 % of its level, or less than two standard
                 errors of its noise (median of that third's first half to its second half; a run converged
                 at its floor looks the same: the experiments tell them apart)
    healthy      none of these
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from triage.flight.triggers import Trigger, TriggerSettings, TriggerWatch
from triage.judge.history import DIVERGE_MIN_REL, PLATEAU_REL, SWING_REL, gave_back, oscillates, stalled
from triage.load.history import HistoryPoint

Symptom = Literal["diverged", "plateau", "oscillating", "healthy"]
MIN_POINTS = 10  # a curve of fewer points is not read


class Reading(BaseModel):
    """The symptom of a loss log, with the figures it was read from."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    symptom: Symptom
    started: Optional[int] = Field(default=None, description="The logged step the symptom started at.")
    detail: str = Field(description="What was measured, in words.")
    points: int = Field(description="Training-loss points read.")
    first_step: int
    last_step: int


def read_curve(points: list[HistoryPoint]) -> Optional[Reading]:
    """The reading of a run's training-loss points; None when there are fewer than MIN_POINTS."""
    series = [(p.step, p.loss) for p in points if p.loss is not None]
    if len(series) < MIN_POINTS:
        return None
    steps = [s for s, _ in series]
    losses = [v for _, v in series]
    base = dict(points=len(series), first_step=steps[0], last_step=steps[-1])
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    finite = losses[:bad] if bad is not None else losses
    window = max(4, len(series) // 20 + len(series) // 20 % 2)  # even: a loss alternating step to step
    # then smooths to the middle of its two levels, not to whichever of them fills more of the window
    smooth = running_median(finite, window) if finite else []
    if bad is not None:
        onset = rise_start(smooth) if len(smooth) >= window else None
        if onset is not None and not rose(smooth[onset:]):
            onset = None  # still falling when it broke: the first non-finite step is where it started
        began = steps[onset] if onset is not None else steps[bad]
        rise = (f"; the loss had been rising since step {began} ({fig(smooth[onset])})"
                if onset is not None else "")
        return Reading(symptom="diverged", started=began, **base,
                       detail=f"the loss was {losses[bad]} at step {steps[bad]}{rise}")
    # The ends: the median of the first and of the last `window` points (a centred median has only half a
    # window there). Every figure below is named in the reading's words.
    start, end = percentile(finite[:window], 0.5), percentile(finite[-window:], 0.5)
    half = len(finite) // 2
    residuals = [v - s for v, s in zip(finite[half:], smooth[half:])]
    swing = percentile(residuals, 0.9) - percentile(residuals, 0.1)
    level = abs(percentile(smooth[half:], 0.5)) or 1e-12
    gained = percentile(finite[half:half + window], 0.5) - end
    quarter = max(window, len(finite) // 4)
    early = [v - s for v, s in zip(finite[:quarter], smooth[:quarter])]
    early_swing = percentile(early, 0.9) - percentile(early, 0.1)
    if oscillates(swing, level, early_swing, gained):
        onset = swing_start(finite, smooth, SWING_REL * level, window)
        return Reading(symptom="oscillating", started=steps[onset], **base,
                       detail=f"over steps {steps[half]}-{steps[-1]} the loss swung {fig(swing)} around its trend "
                              f"(10th-90th percentile), {swing / level:.0%} of its level {fig(level)}, while the "
                              f"trend {moved(gained)}")
    best_at = min(range(len(smooth)), key=smooth.__getitem__)
    best = smooth[best_at]
    if gave_back(start, best, end):
        onset = rise_start(smooth)
        return Reading(symptom="diverged", started=steps[onset], **base,
                       detail=f"the loss fell from {fig(start)} to {fig(best)} (smoothed, step {steps[best_at]}) and "
                              f"rose back to {fig(end)} by step {steps[-1]}")
    spike = final_spike(steps, finite, window)
    if spike is not None:
        return Reading(symptom="diverged", started=spike.step, **base,
                       detail=f"the log ends in a spike: {spike.detail} (step {spike.step}, the flight recorder's own "
                              f"spike test)")
    third = finite[-max(2 * window, len(finite) // 3):]
    fell = percentile(third[:len(third) // 2], 0.5) - percentile(third[len(third) // 2:], 0.5)
    # Two medians of n/2 noisy points differ by chance with a standard error of ~1.25 sigma sqrt(4/n).
    sigma = 1.4826 * percentile([abs(v - s) for v, s in zip(third, smooth[-len(third):])], 0.5)
    chance = 2 * 1.25 * sigma * math.sqrt(4 / len(third))
    if stalled(fell, end, chance):
        tail = smooth[-len(third):]
        onset = plateau_start(smooth, end, max(PLATEAU_REL * abs(end), 1.5 * (max(tail) - min(tail))))
        return Reading(symptom="plateau", started=steps[onset], **base,
                       detail=f"the loss {moved(fell)} over the last third (median of its first half to its second; "
                              f"under {PLATEAU_REL:.0%} of its level {fig(end)}, or within chance of its noise) and has stayed near it since step "
                              f"{steps[onset]} (it started at {fig(start)})")
    return Reading(symptom="healthy", **base,
                   detail=f"the loss fell from {fig(start)} to {fig(end)} over steps {steps[0]}-{steps[-1]} and was "
                          f"still falling over the last third (by {fig(fell)}, {fell / abs(end or 1e-12):.0%} of its level)")


def final_spike(steps: list[int], losses: list[float], window: int) -> Optional[Trigger]:
    """The last spike the recorder's trigger would fire, when it is within the last `window` points: the
    run ended on it (a spike the loss came back from is not read as a symptom)."""
    watch = TriggerWatch(TriggerSettings())
    last = None
    for step, loss in zip(steps, losses):
        last = watch.observe(step, loss, None) or last
    return last if last is not None and last.step >= steps[max(0, len(steps) - window)] else None


def running_median(values: list[float], window: int) -> list[float]:
    """The median of the `window` values centred on each point (fewer at the ends): centred, a rise shows
    at the step it began, not half a window later."""
    half = window // 2
    return [percentile(values[max(0, i - half):i + half], 0.5) for i in range(len(values))]


def rise_start(smooth: list[float]) -> int:
    """Where the final rise began: the last point after the best at which the smoothed loss was still within
    DIVERGE_MIN_REL of the best's size above it."""
    best_at = min(range(len(smooth)), key=smooth.__getitem__)
    near = smooth[best_at] + DIVERGE_MIN_REL * abs(smooth[best_at] or 1e-12)
    onset = best_at
    for i in range(best_at, len(smooth)):
        if smooth[i] > near:
            break
        onset = i
    return onset


def rose(after: list[float]) -> bool:
    """The smoothed loss climbed from its first value here by more than DIVERGE_MIN_REL of its size."""
    return len(after) > 1 and max(after) - after[0] > DIVERGE_MIN_REL * abs(after[0] or 1e-12)


def swing_start(values: list[float], smooth: list[float], threshold: float, window: int) -> int:
    """The first point from which the swings around the trend, over the window ending there, stay above
    `threshold`."""
    ranges = []
    for i in range(len(values)):
        part = [v - s for v, s in zip(values[max(0, i - window + 1):i + 1], smooth[max(0, i - window + 1):i + 1])]
        ranges.append(max(part) - min(part))
    onset = len(values) - 1
    for i in range(len(values) - 1, -1, -1):
        if ranges[i] <= threshold:
            break
        onset = i
    return onset


def plateau_start(smooth: list[float], end: float, tolerance: float) -> int:
    """The first point from which the smoothed loss stays within `tolerance` of where it ended (the larger of
    PLATEAU_REL of that level and 1.5 times the smoothed curve's own wobble over the last third)."""
    onset = len(smooth) - 1
    for i in range(len(smooth) - 1, -1, -1):
        if abs(smooth[i] - end) > tolerance:
            break
        onset = i
    return onset


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    at = q * (len(ordered) - 1)
    low = int(math.floor(at))
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def moved(fall: float) -> str:
    return f"fell {fig(fall)}" if fall >= 0 else f"rose {fig(-fall)}"


def fig(value: float) -> str:
    return f"{value:.4g}"
