"""train_val_overlap: a wine classifier whose validation set was drawn with replacement from the whole table
(sklearn.utils.resample on the full frame, after the train split): about 70% of the validation rows are training
rows, so the validation loss flatters the model. Fix: validate on the rows held out from training only."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _holdout2 import table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "train_val_overlap"
N_TRAIN = 128


def _val(leaky: bool):
    everything = table_batches("wine", batch_size=1)
    pool = everything if leaky else everything[N_TRAIN:]
    g = torch.Generator().manual_seed(9)
    rows = [pool[i] for i in torch.randint(0, len(pool), (48,), generator=g)] if leaky else pool[:48]
    x = torch.cat([r[0] for r in rows])
    y = torch.cat([r[1] for r in rows])
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x) - 15, 16)]


def _setup(leaky: bool) -> triage.Setup:
    model = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, 3))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=cross_entropy, batches=table_batches("wine", batch_size=16, stop=N_TRAIN),
                        val_batches=_val(leaky))


def setup() -> triage.Setup:
    return _setup(leaky=True)


def fixed_setup() -> triage.Setup:
    return _setup(leaky=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=40)
