"""frozen_parameters: a patch transformer on the digits trained from scratch with a config flag
freeze_encoder=True left on from a linear-probe experiment: model.encoder.requires_grad_(False) freezes the
transformer blocks (most of the weights); only the patch embedding, norm and head learn, and the loss creeps
along near chance. Fix: freeze_encoder=False."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import PatchTransformer
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "frozen_parameters"


def _setup(freeze_encoder: bool) -> triage.Setup:
    model = PatchTransformer()
    if freeze_encoder:
        model.encoder.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits_image_batches())


def setup() -> triage.Setup:
    return _setup(freeze_encoder=True)


def fixed_setup() -> triage.Setup:
    return _setup(freeze_encoder=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
