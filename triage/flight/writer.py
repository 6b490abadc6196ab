"""Writing a capture folder (layout in manifest.py). The checkpoint itself is written by a function the
recorder is given, so each framework keeps its own checkpoint format."""

from __future__ import annotations

import csv
import logging
import math
import os
import shlex
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from triage import atomic
from triage.batches import map_tensors
from triage.flight.manifest import BATCHES, HISTORY, MANIFEST, CaptureManifest, versions
from triage.flight.memory import History
from triage.flight.triggers import Trigger

log = logging.getLogger("triage.recorder")

# (capture folder, the CPU state the recorder kept, its step) -> (path inside the folder, layout)
CheckpointWriter = Callable[[Path, Any, int], tuple[str, str]]

# What --entry names when the recorder was not told: a setup(), the LightningModule, make_trainer().
PLACEHOLDERS = {"torch": "YOUR_MODULE:setup", "lightning": "YOUR_MODULE:YourLightningModule",
                "transformers": "YOUR_MODULE:make_trainer"}


def new_capture_dir(root: Path, step: int, trigger: Trigger) -> Path:
    root = Path(root)
    folder = root / f"capture-{step:07d}-{trigger.kind}"
    n = 1
    while folder.exists():
        n += 1
        folder = root / f"capture-{step:07d}-{trigger.kind}-{n}"
    folder.mkdir(parents=True)
    return folder


def triage_command(folder: Path, entry: str) -> str:
    return shlex.join(["triage", "run", "--checkpoint", str(folder), "--entry", entry])


def ordered_batches(batches: list[tuple[int, Any]], checkpoint_step: int) -> list[tuple[int, Any]]:
    """The batches after the checkpoint first (a replay from it sees them in the run's order), then the
    older ones still held."""
    after = [(s, b) for s, b in batches if s > checkpoint_step]
    before = [(s, b) for s, b in batches if s <= checkpoint_step]
    return after + before


def write_history(path: Path, history: History) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["step", "loss", "lr", "grad_norm"])
        for step, loss, lr, grad_norm in history:
            out.writerow([step, _cell(loss), _cell(lr), _cell(grad_norm)])


def _cell(value: Optional[float]) -> str:
    if value is None:
        return ""
    return repr(float(value)) if math.isfinite(value) else str(float(value))


def rank_and_world_size() -> dict[str, Optional[int]]:
    """This process's rank and the world size: from torch.distributed when it is up, else torchrun's
    environment; None for a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size()}
    try:
        return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    except (KeyError, ValueError):
        return {"rank": None, "world_size": None}


def write_capture(root: Path, trigger: Trigger, state: Any, checkpoint_step: int, write_checkpoint: CheckpointWriter,
                  batches: list[tuple[int, Any]], history: History, *, framework: str, entry: Optional[str],
                  run_settings: dict[str, Any], precision: Optional[str] = None, grad_clip: Optional[float] = None,
                  total_steps: Optional[int] = None, device: str = "cpu") -> Path:
    """Write the capture folder and log the command that triages it. Returns the folder."""
    folder = new_capture_dir(root, trigger.step, trigger)
    checkpoint, layout = write_checkpoint(folder, state, checkpoint_step)
    kept = ordered_batches(batches, checkpoint_step)
    if kept:  # compact copies: a batch sliced from a big tensor would otherwise save all of it
        torch.save([map_tensors(b, lambda t: t.detach().cpu().clone()) for _, b in kept], folder / BATCHES)
    if len(history):
        write_history(folder / HISTORY, history)
    placeholder = PLACEHOLDERS.get(framework, PLACEHOLDERS["torch"])
    command = triage_command(folder, entry or placeholder)
    manifest = CaptureManifest(
        framework=framework, trigger=trigger, step=trigger.step, checkpoint=checkpoint, checkpoint_layout=layout,
        checkpoint_step=checkpoint_step, batch_steps=[s for s, _ in kept], precision=precision,
        grad_clip=grad_clip, total_steps=total_steps, device=device, run_settings=run_settings, entry=entry,
        command=command, versions=versions(), **rank_and_world_size())
    # Last and atomic: the manifest is the mark that the folder is complete (`triage watch` reads only those).
    atomic.write_text(folder / MANIFEST, manifest.model_dump_json(indent=2))
    hint = "" if entry else (f"\n    (name in place of {placeholder} what rebuilds this run: a setup(), the "
                             "LightningModule class, or a function returning the Trainer)")
    log.warning("triage: %s at step %d; captured to %s (checkpoint from step %d, %d batches). Triage it with:\n"
                "    %s%s", trigger.kind.replace("_", " "), trigger.step, folder, checkpoint_step, len(kept),
                command, hint)
    return folder
