"""lr_too_high (transformer): a small pre-norm transformer on synthetic topic sequences, trained by Adam at
lr=0.1 (no warmup): the loss leaps from 1.4 to tens within a few steps and stays there.
Fix: lr=0.01 (x0.1) trains."""

from __future__ import annotations

import torch

import triage
from _zoo import TopicTransformer, cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_high"
FAULTY_LR, FIXED_LR = 0.1, 0.01


def _setup(lr: float) -> triage.Setup:
    model = TopicTransformer()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(batch_size=64))


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    # The run blows up on its first updates: the checkpoint is the one written at step 0, just before.
    return write_run_checkpoint(setup, path, steps=0)
