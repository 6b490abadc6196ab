"""healthy (transformer): a small pre-norm transformer on synthetic topic sequences, Adam at lr=1e-3: it trains
normally. Nothing to fix; fixed_setup() is the same run."""

from __future__ import annotations

import torch

import triage
from _zoo import TopicTransformer, cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = TopicTransformer()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(batch_size=64))


def fixed_setup() -> triage.Setup:
    return setup()


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=5)  # early: most of the progress is still ahead
