"""lr_too_low (Adam at 1e-6): a post-norm transformer classifier on synthetic topic sequences trained by Adam at
lr=1e-6 (a fine-tuning value reused for training from scratch): the loss hardly moves in hundreds of steps.
Fix: lr=1e-3."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PostNormTransformer
from _zoo import cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "lr_too_low"
FAULTY_LR, FIXED_LR = 1e-6, 1e-3


def _setup(lr: float) -> triage.Setup:
    model = PostNormTransformer()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=lr),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(batch_size=48))


def setup() -> triage.Setup:
    return _setup(FAULTY_LR)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_LR)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=100)
