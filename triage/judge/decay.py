"""How far weight decay can have shrunk the weights: the figure a decay candidate is tried on
(SetupFacts.decay_reach), from the optimizer's settings and the steps the run has taken."""

from __future__ import annotations

from typing import Optional

import torch


def decay_reach(optimizer, checkpoint_step: Optional[int], horizon: int = 100) -> Optional[float]:
    """SetupFacts.decay_reach: how much weight decay can have shrunk the weights, at most."""
    if checkpoint_step is None:
        return None
    decoupled = isinstance(optimizer, torch.optim.AdamW) or (
        isinstance(optimizer, torch.optim.Adam) and optimizer.defaults.get("decoupled_weight_decay"))
    if not decoupled and not isinstance(optimizer, torch.optim.SGD):
        return None
    per_step = 0.0
    for group in optimizer.param_groups:
        lr = max(float(group.get("lr") or 0.0), float(group.get("initial_lr") or 0.0))
        momentum = 0.0 if decoupled else float(group.get("momentum") or 0.0)
        per_step = max(per_step, lr * float(group.get("weight_decay") or 0.0) / max(1.0 - momentum, 1e-3))
    return per_step * (checkpoint_step + horizon)

