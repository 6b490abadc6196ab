"""replicas_out_of_sync (a parameter outside DDP): the classifier's output bias is left out of DDP (as
runs do for parameters they mean to sync themselves, then forget to) with
DDP._set_params_and_buffers_to_ignore_for_model: DDP never all-reduces its gradient, so each rank updates
it from its own shard and the replicas' `4.bias` drift apart while every other parameter stays in sync.
Fix: let DDP hold every parameter (fixed_setup)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _dist_zoo import (cross_entropy, digits_dataset, loader, main, mlp, rank_world, snapshot,
                       write_checkpoint as _write)

ROOT_CAUSE = "replicas_out_of_sync"
LOCATION = {"parameters": ["4.bias"]}  # the parameter triage should name


def _setup(ignore_bias: bool) -> triage.Setup:
    data = loader(digits_dataset(), sharded=True, shuffle=True)
    torch.manual_seed(0)
    model = mlp()
    if ignore_bias:
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["4.bias"])
    if rank_world()[1] > 1:
        model = nn.parallel.DistributedDataParallel(model)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data))


def setup() -> triage.Setup:
    return _setup(ignore_bias=True)


def fixed_setup() -> triage.Setup:
    return _setup(ignore_bias=False)


def write_checkpoint(path):
    return _write(setup, path, steps=5)


if __name__ == "__main__":
    main(globals(), steps=5)
