"""A tiny Lightning run (tests/lightning_tiny.py: its LR jumps x20 at step 40) with the TriageCallback's
opt-in `triage_on_capture`: the callback stops the run at the capture, and the capture is triaged in a
detached process once this one exits.

    python -m tests.watch_lightning ROOT THEN_COMMAND
"""

from __future__ import annotations

import sys

import torch

import triage
from tests.lightning_tiny import LitMLP, fit
from triage.integrations.lightning import TriageCallback

if __name__ == "__main__":
    torch.set_num_threads(1)
    root, then = sys.argv[1], sys.argv[2]
    callback = TriageCallback(dir=f"{root}/captures", settings=triage.RecorderSettings(snapshot_every=25),
                              stop_on_capture=True, triage_on_capture=triage.AutoTriage(threads=1, then=then))
    trainer = fit(LitMLP(), root, [callback])
    print(f"captured {callback.captures[0]} at step {trainer.global_step}" if callback.captures else "no capture",
          flush=True)
