"""How a framework names its run settings, in triage's terms (precision, clip)."""

from __future__ import annotations

import logging
from typing import Any, Optional

log = logging.getLogger(__name__)

# Lightning's precision names (1.x and 2.x), the Trainer's flags, and triage's own.
_PRECISION = {
    "32": "fp32", "32-true": "fp32", "64": "fp32", "64-true": "fp32", "fp32": "fp32",
    "16": "fp16", "16-mixed": "fp16", "fp16": "fp16", "16-true": "fp16",
    "bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16",
}


def triage_precision(value: Any) -> Optional[str]:
    """'16-mixed' -> 'fp16', 'bf16-mixed' -> 'bf16', 32 -> 'fp32'; None when unknown (with a warning)."""
    if value is None:
        return None
    name = str(value).lower()
    if name in _PRECISION:
        if name.endswith("-true") and name not in ("32-true", "64-true"):
            log.warning("the run trained with precision=%s (weights in half precision); triage replays it as "
                        "%s autocast over fp32 weights", value, _PRECISION[name])
        return _PRECISION[name]
    log.warning("precision %r is not one triage replays (fp32, bf16, fp16): replaying in fp32", value)
    return None


def triage_clip(value: Any, algorithm: Any = "norm") -> Optional[float]:
    """A global-norm clip; clipping by value is not replayed (triage clips by norm), with a warning."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    if value <= 0:
        return None
    if algorithm is not None and str(algorithm).lower() not in ("norm", "gradientclipalgorithmtype.norm"):
        log.warning("the run clipped gradients by value (%s); triage replays without that clip", value)
        return None
    return value
