"""epoch_order_repeated: DDP with a DistributedSampler(shuffle=True), but the loop never calls
sampler.set_epoch(epoch): the sampler's order depends on its seed and epoch only, so every epoch repeats
epoch 0's order on every rank. The loop gets each epoch's data from epoch_batches(epoch), which setup()
hands triage too. Fix: set_epoch in epoch_batches (fixed_setup). fsdp_setup(): the same under FSDP2."""

from __future__ import annotations

import torch

import triage
from _dist_zoo import cross_entropy, digits_dataset, loader, main, mlp, snapshot, wrap, write_checkpoint as _write

ROOT_CAUSE = "epoch_order_repeated"


def _setup(calls_set_epoch: bool, how: str = "ddp") -> triage.Setup:
    data = loader(digits_dataset(), sharded=True, shuffle=True)
    torch.manual_seed(0)
    model = wrap(mlp(), how)

    def epoch_batches(epoch: int):  # what the run's loop does at the start of every epoch
        if calls_set_epoch:
            data.sampler.set_epoch(epoch)
        return data

    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data), epoch_batches=epoch_batches)


def setup() -> triage.Setup:
    return _setup(calls_set_epoch=False)


def fixed_setup() -> triage.Setup:
    return _setup(calls_set_epoch=True)


def fsdp_setup() -> triage.Setup:
    return _setup(calls_set_epoch=False, how="fsdp2")


def write_checkpoint(path):
    return _write(setup, path, steps=5)


def write_fsdp_checkpoint(path):
    return _write(fsdp_setup, path, steps=5, layout="dcp")


if __name__ == "__main__":
    main(globals(), steps=5)
