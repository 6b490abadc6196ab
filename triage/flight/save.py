"""Capture helpers: save a checkpoint in the layout triage reads best, from inside a training loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import torch


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer], *,
                    scheduler: Any = None, scaler: Any = None, step: Optional[int] = None,
                    history: Optional[Sequence[float]] = None) -> Path:
    """Write {model, optimizer, scheduler, scaler, step, history} with torch.save.

    `history` is the loss per step so far: it becomes the report's loss curve of the failing run.
    `optimizer` None: a loop that updates the weights itself has no optimizer state to save.
    Everything saved loads under `torch.load(weights_only=True)`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "step": step,
             "history": [float(x) for x in history] if history is not None else None}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    torch.save(state, path)
    return path
