"""dead_relu (an MLP after an lr blow-up): a 64-256-256-256-10 ReLU MLP on the digits first ran with Adam at lr=0.3
(a typo for 3e-3) for 10 steps, which drove most hidden pre-activations negative for every input; it was resumed
at lr=3e-3, but a ReLU that never fires gets no gradient, so the dead units stay dead and the loss stalls far
above what the net can do. Fix: lr=3e-3 from the start."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import mlp
from _zoo import cross_entropy, digits_batches, train_plain

ROOT_CAUSE = "dead_relu"
BLOWUP_LR, LR = 0.3, 3e-3
BLOWUP_STEPS, RESUMED_STEPS = 10, 150


def _setup() -> triage.Setup:
    model = mlp([64, 256, 256, 256, 10])
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=LR),
                        loss_fn=cross_entropy, batches=digits_batches(batch_size=128, n_batches=8))


def setup() -> triage.Setup:
    return _setup()


def fixed_setup() -> triage.Setup:
    return _setup()  # the same run, never blown up: what a fresh start at the intended lr gives


def write_checkpoint(path):
    """The run's history: BLOWUP_STEPS at BLOWUP_LR, then resumed at LR (what setup() builds) until noticed."""
    torch.manual_seed(0)
    run = setup()
    for group in run.optimizer.param_groups:
        group["lr"] = BLOWUP_LR
    history = train_plain(run, BLOWUP_STEPS)
    for group in run.optimizer.param_groups:
        group["lr"] = LR
    history += train_plain(run, RESUMED_STEPS)
    return triage.save_checkpoint(path, run.model, run.optimizer, step=len(history), history=history)
