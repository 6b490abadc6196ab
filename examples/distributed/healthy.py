"""healthy (distributed): the digits MLP trained data-parallel as it should be: wrapped in DDP, a
DistributedSampler giving each rank its shard, set_epoch called every epoch, SGD with momentum at lr=0.05.
Nothing to fix. fsdp_setup() is the same run sharded with FSDP2 (its checkpoint a DCP folder).

    torchrun --nproc-per-node 2 examples/distributed/healthy.py ckpt.pt
    triage run --nproc-per-node 2 --checkpoint ckpt.pt --entry examples/distributed/healthy.py:setup
"""

from __future__ import annotations

import torch

import triage
from _dist_zoo import cross_entropy, digits_dataset, loader, main, mlp, snapshot, wrap, write_checkpoint as _write

ROOT_CAUSE = "healthy"


def _setup(how: str) -> triage.Setup:
    data = loader(digits_dataset(), sharded=True, shuffle=True)
    torch.manual_seed(0)
    model = wrap(mlp(), how)

    def epoch_batches(epoch: int):
        data.sampler.set_epoch(epoch)
        return data

    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=snapshot(data), epoch_batches=epoch_batches)


def setup() -> triage.Setup:
    return _setup("ddp")


def fsdp_setup() -> triage.Setup:
    return _setup("fsdp2")


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return _write(setup, path, steps=5)  # early: most of the progress is still ahead


def write_fsdp_checkpoint(path):
    return _write(fsdp_setup, path, steps=5, layout="dcp")


if __name__ == "__main__":
    main(globals(), steps=5)
