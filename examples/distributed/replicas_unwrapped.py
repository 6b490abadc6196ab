"""replicas_out_of_sync (not wrapped): the run builds its model and a DistributedSampler on every rank, but
never wraps the model in DDP: nothing averages the gradients, so each rank trains its own copy on its own
shard and the copies drift apart from the first step (rank 0's checkpoint is one of them). Fix: DDP
(fixed_setup)."""

from __future__ import annotations

import torch

import triage
from _dist_zoo import cross_entropy, digits_dataset, loader, main, mlp, snapshot, wrap, write_checkpoint as _write

ROOT_CAUSE = "replicas_out_of_sync"


def _setup(how: str) -> triage.Setup:
    data = loader(digits_dataset(), sharded=True, shuffle=True)
    torch.manual_seed(0)
    model = wrap(mlp(), how)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data))


def setup() -> triage.Setup:
    return _setup("plain")


def fixed_setup() -> triage.Setup:
    return _setup("ddp")


def write_checkpoint(path):
    return _write(setup, path, steps=5)


if __name__ == "__main__":
    main(globals(), steps=5)
