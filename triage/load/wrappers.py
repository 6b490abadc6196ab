"""What setup() wrapped its model in: DistributedDataParallel, FSDP2 (fully_shard), or nothing."""

from __future__ import annotations

from typing import Literal

import torch

Wrapper = Literal["ddp", "fsdp2", "plain"]


def wrapper_of(model: torch.nn.Module) -> Wrapper:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return "ddp"
    if is_sharded(model):
        return "fsdp2"
    return "plain"


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module: DDP's `.module` (its parameter and module names carry no `module.`
    prefix); an FSDP2 model is its own module (fully_shard keeps the names)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def is_sharded(model: torch.nn.Module) -> bool:
    """Parameters held as DTensors (fully_shard): each rank holds a shard, not a replica."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())
