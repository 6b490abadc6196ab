"""no_gradient_flow: an MLP whose forward detaches the encoder's output before the head, so only the 8->10 head
learns (the encoder gets grad None) and the loss creeps along far above what the net can do. Fix: drop .detach()."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import cross_entropy, digits_batches, write_run_checkpoint

ROOT_CAUSE = "no_gradient_flow"
LOCATION = {"parameters": ["encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"]}  # what the report must name


class EncoderClassifier(nn.Module):
    """digits (B, 64) -> an 8-d embedding -> logits (B, 10)."""

    def __init__(self, detach_embedding: bool):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8), nn.ReLU())
        self.head = nn.Linear(8, 10)
        self.detach_embedding = detach_embedding

    def forward(self, x):
        z = self.encoder(x)
        if self.detach_embedding:
            z = z.detach()  # the bug: meant to keep a (never pretrained) encoder fixed; cuts its gradient
        return self.head(z)


def _setup(detach_embedding: bool) -> triage.Setup:
    model = EncoderClassifier(detach_embedding)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=cross_entropy, batches=digits_batches())


def setup() -> triage.Setup:
    return _setup(detach_embedding=True)


def fixed_setup() -> triage.Setup:
    return _setup(detach_embedding=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=200)
