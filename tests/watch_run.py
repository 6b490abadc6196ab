"""A tiny plain-loop run with the flight recorder, for the `triage watch` tests: an MLP on scikit-learn's
bundled digits, SGD at lr 0.05, whose schedule jumps x20 at step 40 (a schedule bug: the loss diverges a
few steps later and the recorder captures). `setup()` rebuilds it for triage from the capture.

    python -m tests.watch_run CAPTURES [--auto]      # trains until the capture; --auto: triage_on_capture
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import triage

ENTRY = "tests.watch_run:setup"


def digits(n_batches: int = 16, batch_size: int = 64):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(y)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, n_batches * batch_size, batch_size)]


def build(jump_at: int = 40):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 if s < jump_at else 20.0)
    return model, opt, sched


def cross_entropy(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def setup() -> triage.Setup:
    hold = os.environ.get("WATCH_RUN_HOLD")  # a test holds the triage here, to stop its watcher mid-triage
    if hold:
        Path(f"{hold}.pid").write_text(str(os.getpid()))
        while Path(hold).exists():
            time.sleep(0.05)
    model, opt, sched = build()
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=cross_entropy,
                        batches=triage.load_batches())  # the capture being triaged


def train(captures: str, auto: bool = False, steps: int = 300) -> int:
    """Train until the recorder captures; returns the failing step (0: no capture)."""
    model, opt, sched = build()
    batches = digits()
    recorder = triage.Recorder(model, opt, sched, dir=captures, entry=ENTRY, triage_on_capture=auto,
                               settings=triage.RecorderSettings(snapshot_every=25, keep_batches=32))
    for step in range(1, steps + 1):
        batch = batches[(step - 1) % len(batches)]
        opt.zero_grad()
        loss = cross_entropy(model, batch)
        loss.backward()
        opt.step()
        sched.step()
        if recorder.step(loss, batch):
            print(f"captured at step {step}", flush=True)
            return step
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(0 if train(sys.argv[1], auto="--auto" in sys.argv) else 1)
