"""Shared pieces of the distributed fault zoo: the digits as a Dataset, per-rank loaders, the model wrapped
as the run wrapped it (DDP, FSDP2 or not at all), the run's own training loop on every rank, and the
checkpoint rank 0 (or every rank, for DCP) writes. Every example runs under torchrun with the gloo
backend on CPU; the same module also runs in a single process (a world of one), where it can.

    torchrun --nproc-per-node 2 examples/distributed/identical_rank_data.py     # trains, writes ckpt
    triage run --nproc-per-node 2 --checkpoint ckpt.pt --entry examples/distributed/identical_rank_data.py:setup
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import triage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the single-process zoo's helpers

GLOBAL_BATCH = 64  # examples per optimizer step over all ranks: each rank takes its share


def rank_world() -> tuple[int, int]:
    """(rank, world size); a single process is rank 0 of 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def digits_dataset() -> TensorDataset:
    """scikit-learn's bundled 8x8 digits (no download), standardised: (x (N, 64), y (N,))."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    return TensorDataset(x, torch.tensor(y, dtype=torch.long))


def loader(dataset: Dataset, sharded: bool = True, shuffle: bool = True, seed: int = 0) -> DataLoader:
    """The run's loader on this rank: with a DistributedSampler (each rank its shard) or, when not
    `sharded`, a plain shuffling loader seeded alike on every rank (every rank draws the same batches)."""
    rank, world = rank_world()
    batch = GLOBAL_BATCH // world
    if sharded:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed)
        return DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
    return DataLoader(dataset, batch_size=batch, shuffle=shuffle, drop_last=True,
                      generator=torch.Generator().manual_seed(seed))


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def wrap(model: nn.Module, how: str) -> nn.Module:
    """As the run wrapped it: "ddp", "fsdp2" (every Linear, then the root) or "plain" (nothing)."""
    _, world = rank_world()
    if how == "ddp" and dist.is_initialized():
        return nn.parallel.DistributedDataParallel(model)
    if how == "fsdp2" and dist.is_initialized():
        from torch.distributed.fsdp import fully_shard

        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        return fully_shard(model)
    return model


def cross_entropy(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def snapshot(data: DataLoader, batches: int = 12) -> list:
    """The first `batches` batches this rank's loader gives (its data snapshot)."""
    out = []
    for i, batch in enumerate(data):
        if i == batches:
            break
        out.append(batch)
    return out


def train(setup: triage.Setup, steps: int) -> list[float]:
    """The run's loop on this rank: its own train_step if it has one, else zero_grad / loss / backward /
    step on its own batches (DDP averages the gradients). Returns the losses (the ranks' mean)."""
    model, opt = setup.model, setup.optimizer
    batches = setup.batches if isinstance(setup.batches, list) else snapshot(setup.batches, steps)
    model.train()
    losses = []
    for step in range(steps):
        batch = batches[step % len(batches)]
        if setup.train_step is not None:
            loss = float(setup.train_step(model, opt, batch))
        else:
            opt.zero_grad()
            value = setup.loss_fn(model, batch)
            value.backward()
            opt.step()
            loss = float(value.detach())
        losses.append(_mean(loss))
        if not math.isfinite(losses[-1]):
            break
    return losses


def _mean(value: float) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def write_checkpoint(setup_fn: Callable[[], triage.Setup], path, steps: int, layout: str = "full") -> Path:
    """Train the faulty run `steps` steps on every rank and save its checkpoint: a full state dict written by
    rank 0 (`layout="full"`, the model's own names, without DDP's prefix), or a DCP folder written by
    every rank (`layout="dcp"`). Call it on every rank."""
    torch.manual_seed(0)
    setup = setup_fn()
    history = train(setup, steps) if steps else []
    path = Path(path)
    rank, _ = rank_world()
    if layout == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(setup.model, setup.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state, "step": len(history)}, checkpoint_id=str(path))
    elif rank == 0:
        module = setup.model.module if isinstance(setup.model, nn.parallel.DistributedDataParallel) else setup.model
        triage.save_checkpoint(path, module, setup.optimizer, step=len(history), history=history)
    if dist.is_initialized():
        dist.barrier()
    return path


def main(module_globals: dict, steps: int, default: Optional[str] = None) -> None:
    """`torchrun --nproc-per-node 2 examples/distributed/<example>.py [PATH]`: write the checkpoint."""
    path = sys.argv[1] if len(sys.argv) > 1 else default or f"{Path(module_globals['__file__']).stem}.pt"
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    module_globals["write_checkpoint"](path)
    if dist.get_rank() == 0:
        print(path)
    dist.destroy_process_group()
