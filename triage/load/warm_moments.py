"""An optimizer state the checkpoint did not save, rebuilt before any replay: steps at LR 0.

A run saved as its model's weights alone (voxceleb_trainer's `model.state_dict()`) hands triage an optimizer
with no state. Replayed as it is, Adam's first step moves every weight by about the LR whatever its gradient
(the moments are one gradient), where the run's own steps, normalised by moments of hundreds of gradients,
were far smaller: a healthy speaker model's loss rose from 0.064 to 0.15 in the replay's first steps, and
clipping "fixed" it (`exploding_gradients`, high). Steps at LR 0 over the snapshot's batches at the
checkpoint's weights fill the moments (and a momentum buffer) with the gradients there, the weights held.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import torch

from triage.contract import autocast
from triage.load.snapshot import untouched_buffers_and_rng

log = logging.getLogger(__name__)

WARM_STEPS = 10  # Adam's bias correction makes 10 gradients' moments an average of them, not a tenth of one
# Whose state an LR of 0 would set wrong (Rprop's step sizes start at the LR) or that steps only on a closure.
NOT_AT_LR_0 = (torch.optim.Rprop, torch.optim.LBFGS)


def warm_moments(setup: Any, batches: list[Any], step: Optional[int]) -> Optional[tuple[str, str]]:
    """Fill setup.optimizer's state by WARM_STEPS steps at LR 0 over `batches` (cycled), each gradient clipped
    as the run clips it (Setup.grad_clip), the weights, buffers and RNG put back after them, a step on a
    non-finite gradient skipped. Returns the finding that says so, or None where nothing was filled: no
    optimizer, several, one in NOT_AT_LR_0, the run's own train_step (what it does to a gradient before its
    step is its own), a process group, a checkpoint at step 0 (the run began with fresh moments itself), a loss
    that raised, or an optimizer that keeps no state (plain SGD)."""
    optimizer = setup.optimizer
    if (optimizer is None or getattr(optimizer, "optimizers", None) is not None or not batches or step == 0
            or isinstance(optimizer, NOT_AT_LR_0) or setup.train_step is not None
            or (torch.distributed.is_available() and torch.distributed.is_initialized())):
        return None
    params = [p for group in optimizer.param_groups for p in group["params"]]
    weights = [p.detach().to("cpu", copy=True) for p in params]  # off the device: a model's worth of memory
    lrs = [group["lr"] for group in optimizer.param_groups]
    stepped = 0
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        with untouched_buffers_and_rng(setup.model):
            for k in range(WARM_STEPS):
                optimizer.zero_grad(set_to_none=True)
                with autocast(setup.precision, setup.device):
                    loss = setup.loss_fn(setup.model, batches[k % len(batches)])
                (sum(loss.values()) if isinstance(loss, dict) else loss).backward()  # a dict: its terms' sum
                norm = _grad_norm(params)
                if math.isfinite(norm):
                    if setup.grad_clip is not None and norm > setup.grad_clip:
                        for p in params:
                            if p.grad is not None:
                                p.grad.mul_(setup.grad_clip / (norm + 1e-6))
                    optimizer.step()
                    stepped += 1
    except Exception as exc:  # noqa: BLE001 - not the fault's place: the experiments meet the same loss and say so
        log.warning("the optimizer's state could not be rebuilt (%s); replays start with fresh moments",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        optimizer.state.clear()
        stepped = 0
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w.to(p.device))
    kept = sorted({key for state in optimizer.state.values() for key in state})
    if not stepped or not kept:
        return None
    what = f"{stepped} steps at LR 0 over the snapshot's batches" + (
        f" ({WARM_STEPS - stepped} skipped: a non-finite gradient)" if stepped < WARM_STEPS else "") + (
        f", each gradient clipped at {setup.grad_clip:g} as the run clips it" if setup.grad_clip is not None else "")
    log.warning("the checkpoint holds no optimizer state: %s's state rebuilt at the checkpoint's weights from %s",
                type(optimizer).__name__, what)
    return ("optimizer_state_rebuilt",
            f"The checkpoint holds no optimizer state: {type(optimizer).__name__}'s state ({', '.join(kept)}) was "
            f"rebuilt from {what}, at the checkpoint's weights, which they left as they were, before any replay. "
            f"Save the optimizer's state_dict with the model to replay the run's own.")


def _grad_norm(params: list[torch.Tensor]) -> float:
    """The global gradient norm (a sparse gradient by its values), as one number: inf or nan where one is."""
    norms = [(p.grad.coalesce().values() if p.grad.is_sparse else p.grad).float().norm()
             for p in params if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0

