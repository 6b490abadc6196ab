"""Drawing the report's figures while the walk runs, in a second process, so that the page at the end
takes most of them from the figure cache (figure_cache.py) instead of drawing them all then.

The walk runs torch in its own process and rewrites report.json after every experiment (api.Journal);
`Ahead` starts `python -m triage.report.ahead REPORT_JSON`, which draws every view of report.json each
time it changes (a figure already drawn is a cache hit) and stops when the walk closes its stdin. Most
figures of a finished experiment never change again; those that depend on the verdict (the proof's
"as the run vs with the fix") are drawn at the end as before. It changes no byte of the report: the
cache is keyed by what a figure shows. Where the second process cannot start, nothing is drawn ahead.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

_POLL_S = 0.2
_FINISH_S = 10.0  # the longest the walk's end waits for a drawing in progress (a few figures)


class Ahead:
    """The drawing process for one walk: `started(report_json)` once report.json exists, `finish()` at the end."""

    def __init__(self) -> None:
        self._process: Optional[subprocess.Popen] = None

    def started(self, report_json: Path) -> None:
        if self._process is not None or os.name == "nt":  # select() on a pipe: POSIX only
            return
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "triage.report.ahead", str(report_json)], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.debug("figures not drawn ahead: %s", exc)

    def finish(self) -> None:
        """Tell it the walk is over and wait for the drawing in progress (its figures are then cached)."""
        if self._process is None:
            return
        try:
            self._process.stdin.close()
            self._process.wait(timeout=_FINISH_S)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        self._process = None


def _draw_while_the_walk_runs(report_json: Path) -> None:
    from triage.report.render import read_report
    from triage.report.views import build_views

    drawn_at = None
    while not _walk_over(timeout=_POLL_S):
        try:
            stamp = report_json.stat().st_mtime_ns
            if stamp != drawn_at:
                drawn_at = stamp
                build_views(read_report(report_json))  # every figure goes into the figure cache
        except Exception as exc:  # noqa: BLE001  (drawing ahead is only a head start)
            log.debug("drawing ahead: %s: %s", type(exc).__name__, exc)


def _walk_over(timeout: float) -> bool:
    """True once the walk closed our stdin (end of file), waiting up to `timeout` for it."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and not os.read(sys.stdin.fileno(), 1024)


if __name__ == "__main__":
    _draw_while_the_walk_runs(Path(sys.argv[1]))
