"""frozen_parameters (convolutional family): a BatchNorm CNN on 8x8 digits whose conv stack was frozen with
requires_grad_(False) (a linear-probe recipe, but nothing was pretrained): only the head learns. Fix: unfreeze."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_image_batches, write_run_checkpoint

ROOT_CAUSE = "frozen_parameters"
LOCATION = {"parameters": [f"features.{i}.{p}" for i in (0, 1, 3, 4) for p in ("weight", "bias")]}  # what the report must name


class SmallCNN(nn.Module):
    """(B, 1, 8, 8) -> two conv-BN-ReLU blocks -> global average pool (B, 16) -> logits (B, 10)."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        return self.head(self.features(x))


def _setup(freeze_features: bool) -> triage.Setup:
    model = SmallCNN()
    if freeze_features:
        model.features.requires_grad_(False)  # the bug
    trainable = [p for p in model.parameters() if p.requires_grad]
    return triage.Setup(model=model, optimizer=torch.optim.Adam(trainable, lr=1e-2),
                        loss_fn=cross_entropy, batches=digits_image_batches())


def setup() -> triage.Setup:
    return _setup(freeze_features=True)


def fixed_setup() -> triage.Setup:
    return _setup(freeze_features=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=150)
