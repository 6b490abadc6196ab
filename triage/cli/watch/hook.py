"""`--then CMD`: the user's command after a capture is triaged (attach the report to a ticket, post to a
chat). It runs through the shell with the verdict in its environment; its failure is logged and changes
nothing else (the report stays, the capture counts as done).

    TRIAGE_STATUS        complete, incomplete or interrupted (the report's status), or failed (no report)
    TRIAGE_REPORT        the report's HTML file          TRIAGE_REPORT_JSON, TRIAGE_SUMMARY: its JSON and Markdown
    TRIAGE_REPORT_DIR    the folder holding all three    TRIAGE_CAPTURE: the capture folder
    TRIAGE_ROOT_CAUSE    the root-cause id               TRIAGE_CONFIDENCE: high, medium or low
    TRIAGE_TITLE         the verdict in words            TRIAGE_FIX: the fix
    TRIAGE_STEP          the failing step                TRIAGE_TRIGGER: what fired (spike, nonfinite_loss, ...)
    TRIAGE_RANK          the capturing rank              TRIAGE_WORLD_SIZE: the run's ranks (empty: one process)
    TRIAGE_ERROR         why the triage failed (failed only)
    TRIAGE_THEN_REPEAT   1 when a watcher stopped while --then ran for this capture and runs it again (it
                         runs at least once, not exactly once: a hook that must not post twice checks it), else 0
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any, Optional

from triage.cli.watch.state import CaptureRecord
from triage.flight.manifest import CaptureManifest

log = logging.getLogger("triage.cli.watch")
THEN_TIMEOUT_S = 600


def then_env(capture: Path, report_dir: Optional[Path], record: CaptureRecord,
             manifest: Optional[CaptureManifest]) -> dict[str, str]:
    report = _report(report_dir) if report_dir is not None and record.status != "failed" else {}
    has_report = bool(report)
    values: dict[str, Any] = {
        "TRIAGE_STATUS": report.get("status", "complete") if has_report else "failed",
        "TRIAGE_REPORT": report_dir / "report.html" if has_report else "",
        "TRIAGE_REPORT_JSON": report_dir / "report.json" if has_report else "",
        "TRIAGE_SUMMARY": report_dir / "summary.md" if has_report else "",
        "TRIAGE_REPORT_DIR": report_dir if has_report else "",
        "TRIAGE_CAPTURE": capture.absolute(),
        "TRIAGE_ROOT_CAUSE": report.get("root_cause", ""),
        "TRIAGE_CONFIDENCE": report.get("confidence", ""),
        "TRIAGE_TITLE": report.get("title", ""),
        "TRIAGE_FIX": report.get("fix", ""),
        "TRIAGE_STEP": manifest.step if manifest else "",
        "TRIAGE_TRIGGER": manifest.trigger.kind if manifest else "",
        "TRIAGE_RANK": manifest.rank if manifest and manifest.rank is not None else "",
        "TRIAGE_WORLD_SIZE": manifest.world_size if manifest and manifest.world_size is not None else "",
        "TRIAGE_ERROR": (record.error or "") if not has_report else "",
    }
    return {k: str(Path(v).absolute()) if isinstance(v, Path) else str(v) for k, v in values.items()}


def run_then(command: Optional[str], capture: Path, report_dir: Optional[Path], record: CaptureRecord,
             manifest: Optional[CaptureManifest], repeat: bool = False) -> Optional[int]:
    """Run `command` (None: nothing to run). Returns its exit status (None when none ran); never raises."""
    if not command:
        return None
    env = {**os.environ, **then_env(capture, report_dir, record, manifest), "TRIAGE_THEN_REPEAT": str(int(repeat))}
    try:
        done = subprocess.run(command, shell=True, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=THEN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.error("--then did not finish in %d s for %s; stopped it", THEN_TIMEOUT_S, capture.name)
        return -1
    except OSError as exc:
        log.error("--then could not start for %s (%s)", capture.name, exc.strerror or exc)
        return -1
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[-5:]
        log.error("--then exited with status %d for %s (the report stays where it is)%s",
                  done.returncode, capture.name, "".join(f"\n    {line}" for line in tail))
    else:
        log.warning("--then ran for %s", capture.name)
    return done.returncode


def _report(report_dir: Path) -> dict[str, Any]:
    try:
        report = json.loads((report_dir / "report.json").read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}
