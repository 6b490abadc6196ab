"""frozen_parameters (embedding + encoder frozen): a post-norm transformer classifier whose embedding, positions and
encoder were frozen with requires_grad_(False) for "linear probing a pretrained backbone", but the line that loaded
the pretrained weights was commented out: only the CLS token and the head learn, on random features.
Fix: unfreeze (or load the pretrained backbone)."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PostNormTransformer
from _zoo import cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "frozen_parameters"


def _setup(freeze_backbone: bool) -> triage.Setup:
    model = PostNormTransformer()
    if freeze_backbone:
        for part in (model.embed, model.pos, model.encoder):
            part.requires_grad_(False)  # the bug: nothing pretrained was loaded into them
    trainable = [p for p in model.parameters() if p.requires_grad]
    return triage.Setup(model=model, optimizer=torch.optim.AdamW(trainable, lr=1e-3),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(batch_size=48))


def setup() -> triage.Setup:
    return _setup(freeze_backbone=True)


def fixed_setup() -> triage.Setup:
    return _setup(freeze_backbone=False)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=150)
