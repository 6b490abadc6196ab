"""identical_rank_data: DDP on the digits, but the loader has no DistributedSampler: a plain
DataLoader(shuffle=True) seeded alike on every rank, so every rank draws the very same batches and N
ranks train on one rank's data (at N times the cost). Fix: a DistributedSampler (fixed_setup).
fsdp_setup() is the same fault under FSDP2."""

from __future__ import annotations

import torch

import triage
from _dist_zoo import cross_entropy, digits_dataset, loader, main, mlp, wrap, write_checkpoint as _write

ROOT_CAUSE = "identical_rank_data"


def _setup(sharded: bool, how: str = "ddp") -> triage.Setup:
    data = loader(digits_dataset(), sharded=sharded, shuffle=True, seed=0)
    torch.manual_seed(0)
    model = wrap(mlp(), how)
    # The DataLoader itself as the snapshot (triage reads its first batches): triage can then try the fix,
    # a DistributedSampler over the same dataset.
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=data)


def setup() -> triage.Setup:
    return _setup(sharded=False)


def fixed_setup() -> triage.Setup:
    return _setup(sharded=True)


def fsdp_setup() -> triage.Setup:
    return _setup(sharded=False, how="fsdp2")


def write_checkpoint(path):
    return _write(setup, path, steps=5)


def write_fsdp_checkpoint(path):
    return _write(fsdp_setup, path, steps=5, layout="dcp")


if __name__ == "__main__":
    main(globals(), steps=5)
