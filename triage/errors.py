"""The exceptions triage raises on bad input.

    TriageError                  every error a user can act on; the CLI exits 2
    ├── EntryError               --entry cannot be imported, or setup() failed
    ├── SetupError               setup() returned something that is not a valid Setup
    ├── CheckpointError          the checkpoint is missing, unreadable or does not fit the model
    ├── PlaybookError            a playbook file is malformed (names file, node, line)
    └── ReportError              a report.json cannot be read back, or the report cannot be written

    Interrupted (a KeyboardInterrupt) Ctrl-C during the experiments: the report of what finished was
                                 written (status "interrupted"); the CLI exits 130

Every message says what was expected, what was found, and what to do.
"""

from __future__ import annotations


class TriageError(Exception):
    """Base of every error caused by the user's input; the CLI prints it and exits 2."""


class EntryError(TriageError):
    pass


class SetupError(TriageError):
    pass


class CheckpointError(TriageError):
    pass


class PlaybookError(TriageError):
    pass


class ReportError(TriageError):
    pass


class Interrupted(KeyboardInterrupt):
    """Ctrl-C ended the walk; `report` (status "interrupted") holds what was measured, written to `files`."""

    def __init__(self, report, files) -> None:
        super().__init__(f"interrupted; the report of what finished is at {files.get('html')}")
        self.report, self.files = report, files
