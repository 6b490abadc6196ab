"""How fast a replay learns against how fast the run learned before its checkpoint (issue 26, item 5).

The run's pace is the loss it shed per step, in steps of this run, from where it started (or from the loss
of learning nothing, if it started above it: falling from an absurd init to chance level is not learning)
to the checkpoint. A replay that drops 5-10% in its 40 steps sits near the plateau threshold: it is a
clear stall only where it also learns at under a tenth of that pace (judge/named.SLOW_PACE); a run still
learning at its own pace (the 1M language model that fell 16% in 80 steps and 7% in the next 40) is not
one, and a verdict reached through it is medium at most.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from triage.experiments.training import start_end

MIN_HISTORY_STEPS = 10  # a logged curve shorter than this gives no pace


def pace_vs_run(session: Any, losses: list[float], nothing: Optional[float]) -> Optional[float]:
    """The replay's fall per step over the run's average fall per step before the checkpoint. None where
    the run's pace is unknown (no step, no learned-nothing level and no logged curve) or it did not fall."""
    start, end = start_end(losses)
    run_fall = _run_fall_per_step(session, start, nothing)
    span = len(losses) - max(1, len(losses) // 5)  # steps between the middles of start_end's two windows
    if start is None or end is None or not run_fall or span < 1:
        return None
    return (start - end) / span / run_fall


def _run_fall_per_step(session: Any, at_checkpoint: Optional[float], nothing: Optional[float]) -> Optional[float]:
    checkpoint = getattr(session, "checkpoint", None)
    step = getattr(checkpoint, "step", None)
    if at_checkpoint is None or not step or step < 1:
        return None
    began, first_step = nothing, 0
    logged = [(p.step, p.loss) for p in getattr(checkpoint, "history", []) or []
              if p.loss is not None and math.isfinite(p.loss) and p.step < step]
    if len(logged) >= 2 and step - logged[0][0] >= MIN_HISTORY_STEPS:
        head, _ = start_end([loss for _, loss in logged])
        began, first_step = (head if nothing is None else min(head, nothing)), logged[0][0]
    if began is None or step <= first_step:
        return None
    fall = (began - at_checkpoint) / (step - first_step)
    return fall if fall > 0 and math.isfinite(fall) else None
