"""weight_decay_too_high (AdamW): a transformer classifier trained by AdamW at lr=1e-3 with weight_decay=100 (a
config meant 1e-2; the exponent's sign was lost): decoupled decay removes 10% of every weight per step, far
faster than Adam's steps of ~lr can rebuild it; the weights collapse and the loss sits at chance.
Fix: weight_decay=1e-2."""

from __future__ import annotations

import _holdout  # noqa: F401  (puts the zoo's helpers on sys.path)

import torch

import triage
from _holdout import PostNormTransformer
from _zoo import cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "weight_decay_too_high"
FAULTY_WD, FIXED_WD = 100.0, 1e-2


def _setup(weight_decay: float) -> triage.Setup:
    model = PostNormTransformer()
    return triage.Setup(model=model,
                        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=weight_decay),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(batch_size=48))


def setup() -> triage.Setup:
    return _setup(FAULTY_WD)


def fixed_setup() -> triage.Setup:
    return _setup(FIXED_WD)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=60)
