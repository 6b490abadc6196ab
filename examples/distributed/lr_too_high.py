"""lr_too_high (distributed): the zoo's lr_too_high run (the digits MLP, SGD with momentum at lr=1.0) trained
with DDP and a DistributedSampler, each rank taking its share of the same global batch of 64. A single
process and 2 ranks must get the same verdict from the same checkpoint. Fix: lr=0.1 (fixed_setup)."""

from __future__ import annotations

import torch

import triage
from _dist_zoo import cross_entropy, digits_dataset, loader, main, mlp, snapshot, wrap, write_checkpoint as _write

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 1.0, 0.1


def _setup(lr: float, how: str = "ddp") -> triage.Setup:
    data = loader(digits_dataset(), sharded=True, shuffle=True)
    torch.manual_seed(0)
    model = wrap(mlp(), how)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data, 16))


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def fsdp_setup() -> triage.Setup:
    return _setup(FAULTY_LR, "fsdp2")


def write_checkpoint(path):
    return _write(setup, path, steps=3)


if __name__ == "__main__":
    main(globals(), steps=3)
