"""frozen_parameters: an MLP whose optimizer was built from model.head.parameters() only (a fine-tuning recipe
on a body that was never pretrained): the body never moves and the loss stays high. Fix: optimize all parameters."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "frozen_parameters"
LOCATION = {"parameters": ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"]}  # what the report must name


class BodyHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16), nn.ReLU())  # (B, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.body(x))


def _setup(params_of) -> triage.Setup:
    model = BodyHead()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(params_of(model), lr=3e-3),
                        loss_fn=cross_entropy, batches=digits_batches())


def head_only(model: BodyHead):
    return model.head.parameters()  # the bug: the body's parameters never reach the optimizer


def all_parameters(model: BodyHead):
    return model.parameters()


def setup() -> triage.Setup:
    return _setup(head_only)


def fixed_setup() -> triage.Setup:
    return _setup(all_parameters)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=200)
