"""An optimizer state the checkpoint did not save, rebuilt before any replay: steps at LR 0.

A run saved as its model's weights alone (voxceleb_trainer's `model.state_dict()`) hands triage an optimizer
with no state. Replayed as it is, Adam's first step moves every weight by about the LR whatever its gradient
(the moments are one gradient), where the run's own steps, normalised by moments of hundreds of gradients,
were far smaller: a healthy speaker model's loss rose from 0.064 to 0.15 in the replay's first steps, and
clipping "fixed" it (`exploding_gradients`, high). Steps at LR 0 over the snapshot's batches at the
checkpoint's weights fill the moments (and a momentum buffer) with the gradients there, the weights held.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Optional

import torch

from triage.contract import AUTOCAST_DTYPES
from triage.load.snapshot import untouched_buffers_and_rng

log = logging.getLogger(__name__)

WARM_STEPS = 10  # Adam's bias correction makes 10 gradients' moments an average of them, not a tenth of one
# Whose state an LR of 0 would set wrong (Rprop's step sizes start at the LR) or that steps only on a closure.
NOT_AT_LR_0 = (torch.optim.Rprop, torch.optim.LBFGS)


def warm_moments(setup: Any, batches: list[Any]) -> Optional[tuple[str, str]]:
    """Fill setup.optimizer's state by WARM_STEPS steps at LR 0 over `batches` (cycled), the weights, buffers
    and RNG put back after them, a step on a non-finite gradient skipped. Returns the finding that says so, or
    None where nothing was filled (no optimizer, several, one in NOT_AT_LR_0, a process group, a loss that
    raised, or an optimizer that keeps no state: plain SGD)."""
    optimizer = setup.optimizer
    if (optimizer is None or getattr(optimizer, "optimizers", None) is not None or not batches
            or isinstance(optimizer, NOT_AT_LR_0)
            or (torch.distributed.is_available() and torch.distributed.is_initialized())):
        return None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    weights = [p.detach().clone() for p in params]
    lrs = [group["lr"] for group in optimizer.param_groups]
    stepped = 0
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        with untouched_buffers_and_rng(setup.model):
            for k in range(WARM_STEPS):
                optimizer.zero_grad(set_to_none=True)
                with _autocast(setup.precision, setup.device):
                    loss = setup.loss_fn(setup.model, batches[k % len(batches)])
                loss.backward()
                if all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in params):
                    optimizer.step()
                    stepped += 1
    except Exception as exc:  # noqa: BLE001 - not the fault's place: the experiments meet the same loss and say so
        log.warning("the optimizer's state could not be rebuilt (%s: %s); replays start with fresh moments",
                    type(exc).__name__, exc)
        optimizer.state.clear()
        stepped = 0
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w)
    kept = sorted({key for state in optimizer.state.values() for key in state})
    if not stepped or not kept:
        return None
    what = f"{stepped} steps at LR 0 over the snapshot's batches" + (
        f" ({WARM_STEPS - stepped} skipped: a non-finite gradient)" if stepped < WARM_STEPS else "")
    log.warning("the checkpoint holds no optimizer state: %s's state rebuilt from %s at the checkpoint's weights",
                type(optimizer).__name__, what)
    return ("optimizer_state_rebuilt",
            f"The checkpoint holds no optimizer state: {type(optimizer).__name__}'s state ({', '.join(kept)}) was "
            f"rebuilt from {what} at the checkpoint's weights, which they left as they were, before any replay. "
            f"Save the optimizer's state_dict with the model to replay the run's own.")


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The run's autocast, as its replays have it (experiments/training.autocast, a floor up)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=AUTOCAST_DTYPES[precision])
