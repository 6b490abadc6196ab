"""healthy (transformer, warmup + cosine): a post-norm transformer classifier on synthetic topic sequences, AdamW at
a peak lr of 1e-3 with 50 steps of linear warmup then a cosine over a 2000-step run, with dropout-free layers and
a disjoint validation set; checkpointed during warmup: it trains normally. Nothing to fix."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import math

import torch

import triage
from _holdout import PostNormTransformer
from _zoo import cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"
WARMUP, TOTAL_STEPS = 50, 2000


def warmup_cosine(step: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL_STEPS - WARMUP)))


def setup() -> triage.Setup:
    model = PostNormTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return triage.Setup(model=model, optimizer=optimizer,
                        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(batch_size=48),
                        val_batches=topic_sequence_batches(batch_size=48, n_batches=4, seed=7),
                        total_steps=TOTAL_STEPS)


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=20)
