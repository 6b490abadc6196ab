"""Setups whose rank 1 raises, or hangs, in the middle of the walk (test fixtures, not faults of a run):
the healthy distributed example, with a loss function that misbehaves on rank 1 from its 13th training
step on, in the baseline replay (the session opens normally: its one check of the loss runs without
gradients; the replica check replays 10 steps)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import triage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "distributed"))
from healthy import setup as healthy_setup  # noqa: E402

MISBEHAVE_AFTER = 12  # training steps before rank 1 misbehaves: the replicas check passes, the baseline fails


def _misbehaving(setup: triage.Setup, how: str) -> triage.Setup:
    calls = {"n": 0}

    def loss_fn(model, batch):
        if torch.is_grad_enabled() and dist.is_initialized() and dist.get_rank() == 1:
            calls["n"] += 1
            if calls["n"] > MISBEHAVE_AFTER:
                if how == "raise":
                    raise ValueError("a rank-local bug in the loss")
                time.sleep(float(os.environ.get("TRIAGE_TEST_HANG_S", "3600")))
        return setup.loss_fn(model, batch)

    return setup.model_copy(update={"loss_fn": loss_fn})


def raising_setup() -> triage.Setup:
    return _misbehaving(healthy_setup(), "raise")


def hanging_setup() -> triage.Setup:
    return _misbehaving(healthy_setup(), "hang")


def needs_group_setup() -> triage.Setup:
    """A setup() written for torchrun: it asks the process group for its rank."""
    rank = dist.get_rank()
    return healthy_setup() if rank >= 0 else None
