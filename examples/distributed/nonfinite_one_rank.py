"""numerical_instability on one rank: the digits MLP begins with a hand-written row normalisation,
x / ||x||, without an eps. One example of the dataset is all zeros (a padding row a loader may serve); it
falls in rank 1's shard (DistributedSampler, no shuffle), third batch: 0/0 = NaN there, on rank 1 only,
and DDP spreads it to every rank's gradients. triage names rank 1, the module, the op and the source line.
Fix: an eps in the norm (fixed_setup). In a single process the same run fails the same way."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _dist_zoo import GLOBAL_BATCH, cross_entropy, digits_dataset, loader, main, snapshot, wrap, write_checkpoint as _write

ROOT_CAUSE = "numerical_instability"
BLANK = 2 * GLOBAL_BATCH + 1  # dataset index: with 2 ranks and no shuffle, odd indices are rank 1's (batch 2)
LOCATION = {"module": "0", "op": "Tensor.div"}
RANK = 1  # the rank triage should name under 2 ranks


class RowNorm(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x):
        return x / (x.norm(dim=1, keepdim=True) + self.eps)  # (B, 64): each row to unit length


def _setup(eps: float) -> triage.Setup:
    dataset = digits_dataset()
    dataset.tensors[0][BLANK] = 0.0  # a blank example
    data = loader(dataset, sharded=True, shuffle=False)
    torch.manual_seed(0)
    model = wrap(nn.Sequential(RowNorm(eps), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), "ddp")
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data))


def setup() -> triage.Setup:
    return _setup(eps=0.0)


def fixed_setup() -> triage.Setup:
    return _setup(eps=1e-6)


def write_checkpoint(path):
    return _write(setup, path, steps=1)  # before the blank example's batch: the checkpoint is finite


if __name__ == "__main__":
    main(globals(), steps=1)
