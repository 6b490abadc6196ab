"""triage: diagnose a failed training run by experiment.

    import triage
    def setup() -> triage.Setup: ...
    report, files = triage.run("mymod:setup", "ckpt.pt")

The names below are imported on first use, so that `import triage` (and with it the command line's
`--help`, `demo --list` and `report`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_HOMES = {
    "run": "triage.cli.api",
    "save_checkpoint": "triage.flight.save",
    "Setup": "triage.contract",
    "TriageError": "triage.errors", "EntryError": "triage.errors", "SetupError": "triage.errors",
    "CheckpointError": "triage.errors", "PlaybookError": "triage.errors", "ReportError": "triage.errors",
    "Interrupted": "triage.errors",
    "Experiment": "triage.experiments", "Params": "triage.experiments", "Outcome": "triage.experiments",
    "Context": "triage.experiments",
    "load_batches": "triage.flight.manifest",
    "Recorder": "triage.flight.recorder", "RecorderSettings": "triage.flight.recorder",
    "AutoTriage": "triage.flight.autotriage",
    "Report": "triage.report",
    "Speedups": "triage.speedups",
}

__all__ = [
    "Setup", "run", "save_checkpoint", "Report", "Recorder", "RecorderSettings", "AutoTriage", "load_batches",
    "TriageError", "EntryError", "SetupError", "CheckpointError", "PlaybookError", "ReportError", "Interrupted",
    "Experiment", "Params", "Outcome", "Context", "Speedups",
]

if TYPE_CHECKING:  # what type checkers and editors see; at run time `__getattr__` below imports on use
    from triage.cli.api import run
    from triage.flight.save import save_checkpoint
    from triage.contract import Setup
    from triage.flight.autotriage import AutoTriage
    from triage.errors import (CheckpointError, EntryError, Interrupted, PlaybookError, ReportError, SetupError,
                               TriageError)
    from triage.experiments import Context, Experiment, Outcome, Params
    from triage.flight.manifest import load_batches
    from triage.flight.recorder import Recorder, RecorderSettings
    from triage.report import Report
    from triage.speedups import Speedups


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'triage' has no attribute '{name}'")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
