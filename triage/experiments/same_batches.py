"""A fall the batches make: a replay's loss read at its end and at its start on the same batches.

A replay's start and end windows train on different snapshot batches. Where the weights barely move (an LR
decayed to nothing), the loss can still "fall" by 10% because the end window's batches are easier than the
start window's: the run learns nothing, and reads as training. The end window's batches scored at the
replay's start weights and at its end weights, with the same dropout masks, tell the two apart.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from triage.experiments.probes import mean_loss
from triage.experiments.training import untouched_buffers_and_rng


@torch.no_grad()
def same_batches_ratio(session: Any, setup: Any, start_weights: list[torch.Tensor],
                       batch_order: list[int], calls: int) -> Optional[float]:
    """The end window's batches (the last fifth of `calls`, trained on session.batches[batch_order[k % len]])
    scored at the model's weights now over the same batches scored at `start_weights`: about 1 where the
    replay learned nothing on them. None where there are no calls or the start's loss is not positive."""
    if calls == 0 or not batch_order:
        return None
    window = max(1, calls // 5)
    batches = [session.batches[batch_order[k % len(batch_order)]] for k in range(calls - window, calls)]
    params = list(setup.model.parameters())
    end_weights = [q.detach().to("cpu", copy=True) for q in params]  # off the device: a model's worth of memory
    try:
        with untouched_buffers_and_rng(setup.model):
            after = mean_loss(setup, batches, session.device)
        for q, w in zip(params, start_weights):
            q.copy_(w.to(q.device))
        with untouched_buffers_and_rng(setup.model):
            before = mean_loss(setup, batches, session.device)
    except Exception:  # noqa: BLE001 - a figure, not the replay: a loss that fails here leaves it unknown
        return None
    finally:
        for q, w in zip(params, end_weights):
            q.copy_(w.to(q.device))
    return after / before if before > 0 and math.isfinite(after) else None
