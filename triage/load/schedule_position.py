"""A scheduler placed at the checkpoint's step where the checkpoint holds the step and not the scheduler's state
(a NeRF-style `{global_step, network_fn_state_dict, optimizer_state_dict}`): left where setup() built it, the
replays would run the schedule from its step 0 (its warm-up, its first LR) instead of where the run stood.

Placed only where it can be checked: the schedule at that step must give the LR the checkpoint's optimizer
saved. A step that counts something else (micro-batches under gradient accumulation, samples, epochs) lands
elsewhere on the schedule and is left unplaced, as is a scheduler whose step() wants arguments."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, Optional

import torch

# Steps a scheduler is stepped through at most to reach the checkpoint's (each a few Python operations).
MAX_STEPS = 200_000
# The schedule's LR at the step and the LR the checkpoint's optimizer saved agree within this share.
SAME_LR = 0.01

Note = tuple[str, str]


def advance(setup: Any, step: Optional[int], saved_state: Any) -> Optional[Note]:
    """Step setup()'s scheduler to where the run's stood at `step`, before the optimizer's saved state loads (so
    a chained schedule starts from setup()'s LR, as the run's did), where the LR it gives there is the one
    `saved_state` (the checkpoint's optimizer state) holds. A (finding id, text) saying what was done; None where
    there is nothing to place (no scheduler, no step, a metric-driven one)."""
    scheduler = setup.scheduler
    if scheduler is None or step is None or step <= 0 or \
            isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or not hasattr(scheduler, "step"):
        return None
    calls = step // setup.steps_per_scheduler_step
    saved_lr = _saved_lr(saved_state)
    if calls == 0:
        return None
    if saved_lr is None or calls > MAX_STEPS:
        why = ("the checkpoint holds no optimizer state to check the schedule's LR there against" if saved_lr is None
               else f"{calls} scheduler steps are too many to replay here")
        return ("scheduler_not_placed", f"The checkpoint holds its step ({step}) but not the scheduler's state, and "
                f"{why}: the replays run the schedule from where setup() built it. Save the scheduler's "
                "state_dict with the checkpoint.")
    before = copy.deepcopy(scheduler.state_dict())
    lrs = [group["lr"] for group in setup.optimizer.param_groups]
    try:
        done = _step(scheduler, calls)
        placed_lr = float(setup.optimizer.param_groups[0]["lr"])
    except Exception as exc:  # noqa: BLE001 - a step() that wants arguments (timm's), or fails: not placed
        placed_lr, done, failed = None, 0, f"its step() failed ({type(exc).__name__}: {exc})"
    else:
        failed = None if math.isclose(placed_lr, saved_lr, rel_tol=SAME_LR, abs_tol=0.0) else (
            f"stepped {done} times it gives LR {placed_lr:.3g}, where the checkpoint's optimizer saved {saved_lr:.3g} "
            "(the step may count micro-batches, samples or epochs)")
    if failed is not None:
        scheduler.load_state_dict(before)
        for group, lr in zip(setup.optimizer.param_groups, lrs):
            group["lr"] = lr
        return ("scheduler_not_placed", f"The checkpoint holds its step ({step}) but not the scheduler's state, and "
                f"the scheduler setup() built was not placed there: {failed}. The replays run the schedule from "
                "where setup() built it; save the scheduler's state_dict with the checkpoint.")
    return ("scheduler_placed", f"The checkpoint holds its step ({step}) but not the scheduler's state: the scheduler "
            f"setup() built was stepped {done} times to reach it, where it gives the LR the checkpoint's optimizer "
            f"saved ({saved_lr:.3g}), and the replays continue the schedule from that step.")


def _step(scheduler: Any, calls: int) -> int:
    """Step `scheduler` `calls` times (fewer where it ends: OneCycleLR refuses to step past its total_steps)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "lr_scheduler.step() before optimizer.step()": on purpose
        for done in range(calls):
            try:
                scheduler.step()
            except ValueError:
                return done
    return calls


def _saved_lr(state: Any) -> Optional[float]:
    """The first param group's LR in a saved optimizer state (None: none saved, or several optimizers')."""
    try:
        lr = state["param_groups"][0]["lr"]
    except (TypeError, KeyError, IndexError):
        return None
    return float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None
