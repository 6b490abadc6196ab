"""A capture folder, as the recorder writes it and triage reads it back:

    capture-<step>-<trigger>/
        manifest.json    this record: step, trigger, where the rest is, the run's settings, versions.
                         Written last and atomically: a folder without it is still being written (or
                         its writer died), and is not a capture.
        checkpoint.pt    the last good state before the failure (or checkpoint.ckpt, or checkpoint-N/)
        batches.pt       the batches in flight, as the run's DataLoader made them
        history.csv      step, loss, lr, grad_norm of every recorded step up to the failure
"""

from __future__ import annotations

import datetime as dt
import platform
import sys
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from triage.contract import Precision
from triage.errors import CheckpointError
from triage.flight.places import capture_of_report, is_report_folder
from triage.flight.triggers import Trigger

MANIFEST = "manifest.json"
BATCHES = "batches.pt"
HISTORY = "history.csv"


class CaptureManifest(BaseModel):
    """What a capture folder holds and how the failing run was set up."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    format: Literal["triage-capture"] = "triage-capture"
    version: Literal[1] = 1
    framework: Literal["torch", "lightning", "transformers"]
    trigger: Trigger
    step: int = Field(description="The failing step (steps counted from 1).")
    checkpoint: str = Field(description="The checkpoint's path inside the folder (a file or an HF folder).")
    checkpoint_layout: Literal["dict", "lightning", "huggingface"]
    checkpoint_step: int = Field(description="Steps the checkpoint had taken: replays start at step+1.")
    batch_steps: list[int] = Field(description="The step each saved batch was used at, in saved order: the "
                                   "batches after the checkpoint first, then older ones the recorder still held.")
    precision: Optional[Precision] = None
    grad_clip: Optional[float] = None
    total_steps: Optional[int] = None
    device: str = "cpu"
    run_settings: dict[str, Any] = Field(default_factory=dict,
                                         description="The framework's own settings as it named them.")
    entry: Optional[str] = Field(default=None, description="The --entry that rebuilds the run, when known.")
    rank: Optional[int] = Field(default=None, description="The rank that wrote this capture (distributed runs).")
    world_size: Optional[int] = Field(default=None, description="The run's number of ranks (distributed runs).")
    command: str = Field(description="The triage command that triages this capture.")
    versions: dict[str, str] = Field(default_factory=dict)
    created: str = Field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))


def versions() -> dict[str, str]:
    """Python, torch, triage, and each framework the run had imported."""
    import triage

    found = {"python": platform.python_version(), "torch": torch.__version__, "triage": triage.__version__}
    for name in ("lightning", "pytorch_lightning", "transformers", "accelerate"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            found[name] = str(module.__version__)
    return found


def is_capture(path: Path) -> bool:
    """A finished capture: its manifest, written last, is there."""
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def read_manifest(folder: Path) -> CaptureManifest:
    path = Path(folder) / MANIFEST
    try:
        return CaptureManifest.model_validate_json(path.read_text())
    except OSError as exc:
        if is_report_folder(folder):
            raise CheckpointError(_report_not_capture(Path(folder))) from None
        raise CheckpointError(f"Expected a capture folder with {MANIFEST} at '{folder}', found it unreadable "
                              f"({exc.strerror or exc}). Pass the folder the recorder printed.") from None
    except ValidationError as exc:
        raise CheckpointError(
            f"Expected '{path}' to be a triage capture manifest, found {exc.error_count()} problems "
            f"(first: {'.'.join(map(str, exc.errors()[0]['loc']))}: {exc.errors()[0]['msg']}). "
            "Was it written by another triage version? Re-capture, or pass the checkpoint inside it directly."
        ) from None


def _report_not_capture(folder: Path) -> str:
    capture = capture_of_report(folder)
    if capture is not None:
        return (f"Expected a capture folder with {MANIFEST}, found '{folder}' is the report triage watch wrote for "
                f"the capture '{capture}'. Pass the capture: triage.load_batches('{capture}'), or "
                "triage.load_batches() with no path inside the triage of it.")
    return (f"Expected a capture folder with {MANIFEST}, found '{folder}' is a triage report folder, and its "
            "capture is no longer beside it. Pass the capture folder the recorder printed "
            "(captures/capture-<step>-<trigger>).")


_triaged: Optional[Path] = None  # the capture this process is triaging (set before setup() is called)


def triaging(folder: Optional[Path]) -> None:
    """Name the capture this process triages: `load_batches()` without a path then loads its batches (None:
    no capture, so a second triage in the same process never reads the first one's)."""
    global _triaged
    _triaged = Path(folder) if folder is not None else None


def load_batches(capture_dir: Optional[Path] = None, trusted: bool = False) -> list[Any]:
    """The batches a capture saved, in the order the manifest lists them (those after the checkpoint
    first). Use them as `Setup.batches` in a setup() that triages the capture. Without `capture_dir`,
    the capture being triaged (`triage run --checkpoint CAPTURE`, or the capture `triage watch` is on).

    Loaded with `torch.load(weights_only=True)`; `trusted=True` unpickles other objects (files you trust).
    """
    if capture_dir is None and _triaged is None:
        raise CheckpointError("Expected load_batches() to be called while triage opens a capture (triage run "
                              "--checkpoint CAPTURE, or triage watch), found none being opened. Pass the capture "
                              "folder: triage.load_batches('captures/capture-...').")
    folder = Path(capture_dir) if capture_dir is not None else _triaged
    manifest = read_manifest(folder)
    path = folder / BATCHES
    if not path.is_file():
        raise CheckpointError(f"Expected the capture '{folder}' to hold {BATCHES}, found none. The recorder "
                              "writes it when it kept batches (keep_batches > 0); re-capture with batches.")
    try:
        batches = torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as exc:
        raise CheckpointError(
            f"Expected '{path}' to load with weights_only=True, found it cannot ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}). If you trust it, pass trusted=True."
        ) from None
    if not isinstance(batches, list) or len(batches) != len(manifest.batch_steps):
        raise CheckpointError(f"Expected '{path}' to hold {len(manifest.batch_steps)} batches as its manifest "
                              f"says, found {type(batches).__name__} of {len(batches) if isinstance(batches, list) else '?'}. "
                              "The capture is incomplete: re-capture.")
    return batches
