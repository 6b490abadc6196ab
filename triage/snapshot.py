"""An in-memory copy of every piece of training state, taken once and restored before each experiment.

Restoring is exact: weights and buffers, optimizer moments and hyper-parameters, scheduler,
grad scaler, the RNG streams (python, numpy, torch CPU and CUDA) and each module's train/eval mode.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch


@dataclass(frozen=True)
class Snapshot:
    model: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]  # all of them: state_dict() leaves out non-persistent buffers
    training_modes: dict[str, bool]
    requires_grad: dict[str, bool]
    optimizer: dict[str, Any]
    scheduler: Optional[dict[str, Any]]
    scaler: Optional[dict[str, Any]]
    rng: dict[str, Any]

    @classmethod
    def take(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scheduler: Any = None, scaler: Any = None) -> "Snapshot":
        return cls(
            model={k: v.detach().clone() for k, v in model.state_dict().items()},
            buffers={k: b.detach().clone() for k, b in model.named_buffers()},
            training_modes={name: m.training for name, m in model.named_modules()},
            requires_grad={name: p.requires_grad for name, p in model.named_parameters()},
            optimizer=copy.deepcopy(optimizer.state_dict()),
            scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
            scaler=copy.deepcopy(scaler.state_dict()) if scaler is not None else None,
            rng=rng_state(),
        )

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: Any = None, scaler: Any = None) -> None:
        with torch.no_grad():
            model.load_state_dict(self.model)
            for name, buffer in model.named_buffers():
                buffer.copy_(self.buffers[name])
        for name, module in model.named_modules():
            module.training = self.training_modes[name]
        for name, param in model.named_parameters():
            param.requires_grad_(self.requires_grad[name])
            param.grad = None
        # load_state_dict replaces the whole state but keeps references into what it is given.
        optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        if scheduler is not None and self.scheduler is not None:
            scheduler.load_state_dict(copy.deepcopy(self.scheduler))
        if scaler is not None and self.scaler is not None:
            scaler.load_state_dict(copy.deepcopy(self.scaler))
        set_rng_state(self.rng)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
