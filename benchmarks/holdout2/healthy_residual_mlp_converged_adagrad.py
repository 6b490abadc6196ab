"""healthy: a residual MLP (LayerNorm blocks) on the breast-cancer table, Adagrad lr=0.02, checkpointed at step
400 when it has converged: the training loss is small and flat, as a finished run's is. Nothing is wrong."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch

import triage
from _holdout2 import ResidualMLP, table_batches
from _zoo import cross_entropy, write_run_checkpoint

ROOT_CAUSE = "healthy"


def setup() -> triage.Setup:
    model = ResidualMLP(30, 2, width=32, depth=2)
    return triage.Setup(model=model, optimizer=torch.optim.Adagrad(model.parameters(), lr=0.02),
                        loss_fn=cross_entropy, batches=table_batches("breast_cancer", stop=448),
                        val_batches=table_batches("breast_cancer", start=448))


fixed_setup = setup


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=400)
