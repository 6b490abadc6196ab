"""Where the watcher puts a capture's report, and the way back from a report folder to its capture.

Reports go to a sibling of the captures folder, `captures-reports/<capture name>/`, not beside each
capture inside it: a setup() that finds the newest capture with `glob("captures/capture-*")` (or lists
`captures/` at all) must only ever meet captures. The recorder owns `captures/`, the watcher owns
`captures-reports/`; the watcher's state stays hidden in `captures/.triage-watch/`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

REPORTS_SUFFIX = "-reports"      # captures/ -> captures-reports/
OLD_REPORT_SUFFIX = ".report"    # before 0.2.0: captures/capture-<step>-<trigger>.report/
LAUNCH_LOG = "launch.log"        # triage_on_capture's log of the watcher it started, in the report folder
_REPORT_FILES = ("report.json", "report.html", "summary.md", "triage.log", LAUNCH_LOG)


def reports_root(captures: Path) -> Path:
    """The default folder for the reports of the captures under `captures`: its sibling `<name>-reports`."""
    folder = Path(os.path.abspath(captures))  # abspath folds '..' and '.', so the name is a real one
    return folder.parent / f"{folder.name}{REPORTS_SUFFIX}"


def report_dir(capture: Path, out: Optional[Path] = None) -> Path:
    """The report folder of one capture: `out/<capture name>` where given, else in the sibling folder."""
    capture = Path(capture)
    return (Path(out) if out is not None else reports_root(capture.parent)) / capture.name


def is_report_folder(folder: Path) -> bool:
    folder = Path(folder)
    return folder.is_dir() and (folder.name.endswith(OLD_REPORT_SUFFIX) or folder.parent.name.endswith(REPORTS_SUFFIX)
                                or any((folder / name).is_file() for name in _REPORT_FILES))


def capture_of_report(folder: Path) -> Optional[Path]:
    """The capture a watcher's report folder belongs to, where it can still be found; None otherwise."""
    folder = Path(os.path.abspath(folder))
    candidates = []
    written = _checkpoint_in_report(folder / "report.json")
    if written is not None:
        candidates += [written, written.parent]  # the capture folder, or a checkpoint inside it
    if folder.name.endswith(OLD_REPORT_SUFFIX):
        candidates.append(folder.parent / folder.name[: -len(OLD_REPORT_SUFFIX)])
    if folder.parent.name.endswith(REPORTS_SUFFIX):
        candidates.append(folder.parent.parent / folder.parent.name[: -len(REPORTS_SUFFIX)] / folder.name)
    # manifest.json is manifest.MANIFEST, spelt out: manifest imports this module
    return next((c for c in candidates if (c / "manifest.json").is_file()), None)


def _checkpoint_in_report(path: Path) -> Optional[Path]:
    """report.json's checkpoint path (absent while the triage has not written it yet, e.g. in setup())."""
    try:
        written = json.loads(path.read_text())["checkpoint"]["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(written) if isinstance(written, str) else None
