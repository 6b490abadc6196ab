"""A scheduler placed at the checkpoint's step where the checkpoint holds the step and not the scheduler's state
(a NeRF-style `{global_step, network_fn_state_dict, optimizer_state_dict}`): left where setup() built it, the
replays would run the schedule from its step 0 (its warm-up, its first LR) instead of where the run stood."""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

# Steps a scheduler is stepped through at most to reach the checkpoint's (each a few Python operations).
MAX_STEPS = 200_000


def advance(setup: Any, step: Optional[int]) -> Optional[tuple[str, str]]:
    """Step setup()'s scheduler to where the run's stood at `step` (before the optimizer's state is loaded, so a
    chained schedule starts from setup()'s LR, as the run's did). A (finding id, text) saying so; None where there
    is nothing to place (no scheduler, no step, a metric-driven one) or it is too far to step."""
    scheduler = setup.scheduler
    if scheduler is None or step is None or step <= 0 or \
            isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or not hasattr(scheduler, "step"):
        return None
    every = setup.steps_per_epoch if setup.scheduler_interval == "epoch" else 1
    calls = step // every if every else 0
    if calls == 0:
        return None
    if calls > MAX_STEPS:
        return ("scheduler_not_placed", f"The checkpoint holds its step ({step}) but not the scheduler's state, "
                f"and {calls} scheduler steps are too many to replay here: the replays run the schedule from "
                "where setup() built it. Save the scheduler's state_dict with the checkpoint.")
    done = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "lr_scheduler.step() before optimizer.step()": on purpose
        for done in range(1, calls + 1):
            try:
                scheduler.step()
            except ValueError:  # OneCycleLR past its total_steps: the schedule ended there
                done -= 1
                break
    lr = setup.optimizer.param_groups[0]["lr"]
    return ("scheduler_placed", f"The checkpoint holds its step ({step}) but not the scheduler's state: the "
            f"scheduler setup() built was stepped {done} times to reach it (LR {lr:.3g} there), and the replays "
            "continue the schedule from that step.")
