"""Shared pieces of the fault zoo: small datasets made in code (or bundled with scikit-learn),
a stock PyTorch training loop, and checkpoint writing. Nothing here is downloaded."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import torch

import triage


def digits_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0,
                   offset: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's bundled 8x8 digits (1797 images, no download), standardised, as (x, y) batches."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    return [(x[i:i + batch_size], y[i:i + batch_size])
            for i in range(offset, offset + batch_size * n_batches, batch_size) if i + batch_size <= len(x)]


def train_plain(setup: triage.Setup, steps: int) -> list[float]:
    """The stock loop a user would write: zero_grad, forward under autocast, backward, clip, step.

    Uses the setup's own train_step when it has one. Stops at the first non-finite loss.
    """
    model, opt = setup.model, setup.optimizer
    model.train()
    losses = []
    for step in range(steps):
        batch = setup.batches[step % len(setup.batches)]
        if setup.train_step is not None:
            loss = setup.train_step(model, opt, batch)
            losses.append(float(loss))
        else:
            opt.zero_grad()
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = setup.loss_fn(model, batch)
            loss.backward()
            if setup.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), setup.grad_clip)
            opt.step()
            losses.append(float(loss.detach().float()))
        if setup.scheduler is not None:
            setup.scheduler.step()
        if not math.isfinite(losses[-1]):
            break
    return losses


def write_run_checkpoint(setup_fn: Callable[[], triage.Setup], path: Path, steps: int) -> Path:
    """Train the faulty run `steps` steps (seeded) and save the checkpoint it would have written."""
    torch.manual_seed(0)
    setup = setup_fn()
    history = train_plain(setup, steps) if steps else []
    return triage.save_checkpoint(path, setup.model, setup.optimizer, scheduler=setup.scheduler,
                                  scaler=setup.scaler, step=len(history), history=history)


def cross_entropy(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)
