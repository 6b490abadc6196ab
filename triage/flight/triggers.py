"""When a run has failed: a non-finite loss or gradient norm, a loss spike (robust z-score over a window,
and a rise that matters against the loss's own level), a plateau over a window. The watch only measures
and compares; it writes nothing."""

from __future__ import annotations

import math
from collections import deque
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

TriggerKind = Literal["nonfinite_loss", "nonfinite_grad", "spike", "plateau", "manual"]


class Trigger(BaseModel):
    """Why a capture was written, at which step."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    kind: TriggerKind
    step: int = Field(description="The step whose loss or gradient fired the trigger (1 = the first step).")
    detail: str = Field(description="What was measured, in words.")


class TriggerSettings(BaseModel):
    """The thresholds; the defaults fire on divergence and leave a healthy noisy run alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spike_z: Optional[float] = Field(
        default=8.0, gt=0, description="A loss this many robust standard deviations above its recent median "
        "is a spike (the deviation: 1.4826 MAD of the step-to-step changes over the window, / sqrt 2); None "
        "turns spikes off.")
    spike_rel: float = Field(
        default=0.25, ge=0, description="A spike must also rise this fraction of the loss's own level (its recent "
        "median) above it: where a loss is flat its step-to-step noise is tiny, and a harmless blip scores a "
        "large z. 0 turns this off (z alone decides).")
    spike_window: int = Field(default=100, ge=10, description="Steps of finite losses the spike statistics use.")
    spike_min_history: int = Field(default=20, ge=5, description="No spike is called before this many steps.")
    plateau_window: Optional[int] = Field(
        default=None, ge=20, description="Steps over which the loss must fall by plateau_rel, else a plateau "
        "fires; None (the default) turns plateaus off: a converged run would look the same.")
    plateau_rel: float = Field(default=0.01, gt=0, lt=1, description="Relative fall a window must show.")


class TriggerWatch:
    """Fed one (step, loss, grad_norm) per step; returns the first trigger that fires, else None.

    The spike statistics (median, MAD) are refreshed every window/10 steps rather than every step: they
    move slowly, and the per-step cost then is a few float operations.
    """

    def __init__(self, settings: TriggerSettings):
        self.settings = settings
        window = max(settings.spike_window, settings.plateau_window or 0)
        self._losses: deque[float] = deque(maxlen=window)
        self._since_refresh = 0
        self._median = math.nan
        self._scale = math.nan
        self._seen = 0

    def observe(self, step: int, loss: float, grad_norm: Optional[float]) -> Optional[Trigger]:
        if not math.isfinite(loss):
            return Trigger(kind="nonfinite_loss", step=step, detail=f"the loss was {loss}")
        if grad_norm is not None and not math.isfinite(grad_norm):
            return Trigger(kind="nonfinite_grad", step=step, detail=f"the gradient norm was {grad_norm}")
        fired = self._spike(step, loss)
        self._losses.append(loss)
        self._seen += 1
        return fired or self._plateau(step)

    def _spike(self, step: int, loss: float) -> Optional[Trigger]:
        s = self.settings
        if s.spike_z is None or self._seen < s.spike_min_history:
            return None
        self._since_refresh += 1
        if math.isnan(self._median) or self._since_refresh >= max(1, s.spike_window // 10):
            recent = list(self._losses)[-s.spike_window:]
            # The level is where the loss is now; the scale is the step-to-step noise (MAD of the first
            # differences / sqrt 2), so a loss that is still falling fast does not hide a spike.
            # Plain Python: on ~100 floats it is several times faster than numpy's per-call overhead.
            self._median = _median(recent[-max(5, len(recent) // 10):])
            diffs = [b - a for a, b in zip(recent, recent[1:])]
            centre = _median(diffs)
            mad = _median([abs(d - centre) for d in diffs]) / math.sqrt(2)
            # A floor on the scale: a loss flat to the last digit must not make every wiggle a spike.
            self._scale = max(1.4826 * mad, 1e-3 * abs(self._median), 1e-12)
            self._since_refresh = 0
        z = (loss - self._median) / self._scale
        rise = loss - self._median
        if z > s.spike_z and rise > s.spike_rel * abs(self._median):
            return Trigger(kind="spike", step=step,
                           detail=f"the loss {loss:.4g} was {z:.1f} robust standard deviations (of the step-to-step noise "
                                  f"over the last {min(self._seen, s.spike_window)} steps) above its recent median "
                                  f"{self._median:.4g}, a rise of {_share(rise, self._median)} of that level")
        return None

    def _plateau(self, step: int) -> Optional[Trigger]:
        window = self.settings.plateau_window
        if window is None or self._seen < window or self._seen % max(1, window // 10):
            return None
        recent = list(self._losses)[-window:]
        quarter = max(1, window // 4)
        start, end = _median(recent[:quarter]), _median(recent[-quarter:])
        if end > start * (1 - self.settings.plateau_rel):
            return Trigger(kind="plateau", step=step,
                           detail=f"the loss went from {start:.4g} to {end:.4g} (median of the first and last "
                                  f"quarter) over {window} steps, less than {self.settings.plateau_rel:.0%} down")
        return None


def _share(rise: float, level: float) -> str:
    return f"{rise / abs(level):.0%}" if level else "all"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
