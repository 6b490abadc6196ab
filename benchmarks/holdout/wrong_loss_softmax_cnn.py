"""wrong_loss (double softmax in a CNN): a CNN without normalisation whose forward returns softmax probabilities
(so that inference code gets probabilities), trained with nn.CrossEntropyLoss, which applies log_softmax again:
the loss cannot go below ln(e + 9) - 1 ~ 1.46 and its gradients are squashed. Fix: return logits."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch
from torch import nn

import triage
from _holdout import PlainCNN
from _zoo import digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "wrong_loss"
criterion = nn.CrossEntropyLoss()


def loss_fn(model, batch):
    x, y = batch
    return criterion(model(x), y)


def _setup(softmax_output: bool) -> triage.Setup:
    model = PlainCNN(softmax_output=softmax_output)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=loss_fn, batches=digits_image_batches(batch_size=32, n_batches=24))


def setup() -> triage.Setup:
    return _setup(softmax_output=True)


def fixed_setup() -> triage.Setup:
    return _setup(softmax_output=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=200)
