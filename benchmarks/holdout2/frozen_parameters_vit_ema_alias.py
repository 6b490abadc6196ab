"""frozen_parameters: a patch transformer on the digits with an EMA "copy" made as `ema = model` instead of
copy.deepcopy(model), then `ema.requires_grad_(False)`: the training model itself is frozen, AdamW gets no
gradients and the loss does not move. Fix: deep-copy the model for the EMA."""

from __future__ import annotations

import _holdout2  # noqa: F401
import copy

import torch

import triage
from _holdout2 import PatchTransformer
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "frozen_parameters"


def _setup(deep_copy: bool) -> triage.Setup:
    model = PatchTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ema = copy.deepcopy(model) if deep_copy else model  # the bug: an alias, not a copy
    ema.requires_grad_(False)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits_image_batches())


def setup() -> triage.Setup:
    return _setup(deep_copy=False)


def fixed_setup() -> triage.Setup:
    return _setup(deep_copy=True)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=30)
