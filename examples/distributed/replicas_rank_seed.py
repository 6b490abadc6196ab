"""replicas_out_of_sync (a rank-dependent init): a hand-written data-parallel loop: train_step averages the
gradients with dist.all_reduce itself (no DDP), but setup() seeds each rank with its own rank before
building the model and nothing broadcasts rank 0's weights, so the ranks start from different weights
and keep them apart for ever (the same averaged update on different weights). triage sees it at setup()'s
own init. Fix: broadcast every parameter from rank 0 after building the model (fixed_setup)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import triage
from _dist_zoo import cross_entropy, digits_dataset, loader, main, mlp, rank_world, snapshot, write_checkpoint as _write

ROOT_CAUSE = "replicas_out_of_sync"


def averaged_step(model, optimizer, batch):
    """The run's own step: backward, then the gradients averaged over ranks by hand, then the update."""
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    if dist.is_initialized():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
    optimizer.step()
    return loss.detach()


def _setup(broadcast: bool) -> triage.Setup:
    data = loader(digits_dataset(), sharded=True, shuffle=True)
    rank, world = rank_world()
    torch.manual_seed(rank)  # the bug: a seed per rank for the weights (meant for dropout and data order)
    model = mlp()
    if broadcast and world > 1:
        with torch.no_grad():
            for p in model.parameters():
                dist.broadcast(p, src=0)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data), train_step=averaged_step)


def setup() -> triage.Setup:
    return _setup(broadcast=False)


def fixed_setup() -> triage.Setup:
    return _setup(broadcast=True)


def write_checkpoint(path):
    return _write(setup, path, steps=5)


if __name__ == "__main__":
    main(globals(), steps=5)
