"""triage: diagnose a failed training run by experiment.

    import triage
    def setup() -> triage.Setup: ...
    report, files = triage.run("mymod:setup", "ckpt.pt")
"""

__version__ = "0.1.0"

from triage.api import run
from triage.capture import save_checkpoint
from triage.contract import Setup
from triage.errors import (CheckpointError, EntryError, Interrupted, PlaybookError, ReportError, SetupError,
                           TriageError)
from triage.experiments import Context, Experiment, Outcome, Params
from triage.flight.manifest import load_batches
from triage.flight.recorder import Recorder, RecorderSettings
from triage.report import Report

__all__ = [
    "Setup", "run", "save_checkpoint", "Report", "Recorder", "RecorderSettings", "load_batches",
    "TriageError", "EntryError", "SetupError", "CheckpointError", "PlaybookError", "ReportError", "Interrupted",
    "Experiment", "Params", "Outcome", "Context",
]
