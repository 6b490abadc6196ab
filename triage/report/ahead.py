"""Drawing the report's figures in a second process while the walk runs, so that the page at the end
takes them from the figure cache (figure_cache.py) instead of drawing them then.

`Ahead()` starts `python -m triage.report.ahead` at once, before the walk's own process imports torch:
on the second core the drawer imports what drawing takes (matplotlib, 1-2 s) while the walk's process
imports torch and calls setup(). The walk rewrites report.json after every experiment (api.Journal);
`follow(path)` tells the drawer where, and it draws every view of report.json each time the file
changes (a figure already drawn is a cache hit). `finish()` is called once the final report.json is
written: the drawer draws it (the figures the verdict changed, such as the proof's comparison) and
exits, and the page then draws only what the drawer did not reach within `FINISH_S`. It changes no
byte of the report: the cache is keyed by what a figure shows. Where the second process cannot start,
the machine has one core, or the drawer is late, the page draws what the cache lacks, as it would
without it. The drawer runs at a lower priority (nice 10): the walk's processes come first.
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
FINISH_S = 10.0  # the longest the walk's end waits for the drawer's last pass


class Ahead:
    """The drawing process for one walk: started on construction, `follow(report_json)` once the walk
    writes it, `finish()` when the final report.json is written, `close()` (or leaving its `with`) in
    any case."""

    def __init__(self, finish_s: float = FINISH_S) -> None:
        self._process: Optional[subprocess.Popen] = None
        self._following = False
        self._finish_s = finish_s
        # select() on a pipe is POSIX only; on one core a drawer would only slow the walk down
        if os.name == "nt" or _cores() < 2:
            return
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "triage.report.ahead"], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.debug("figures not drawn ahead: %s", exc)

    def follow(self, report_json: Path) -> None:
        """Where the walk writes report.json (said once: later calls change nothing)."""
        if self._process is None or self._following:
            return
        try:  # a NUL ends the path: the one byte no path can hold
            self._process.stdin.write(os.fsencode(report_json) + b"\0")
            self._process.stdin.flush()
            self._following = True
        except OSError as exc:
            log.debug("figures not drawn ahead: %s", exc)
            self.close()

    def finish(self) -> None:
        """The final report.json is written: wait (up to `finish_s`) while the drawer draws it."""
        if self._process is None:
            return
        try:
            self._process.stdin.close()  # end of file: the drawer's last pass
            self._process.wait(timeout=self._finish_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.close()

    def __enter__(self) -> "Ahead":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the drawer now, wherever it is (the page draws what it did not)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        if self._process.stdin and not self._process.stdin.closed:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        self._process = None


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _draw_while_the_walk_runs() -> None:
    import importlib

    try:  # the walk's processes come first: this one draws on what CPU they leave
        os.nice(10)
    except OSError:
        pass

    from triage.report.render import read_report
    from triage.report.sections import build_views

    importlib.import_module("triage.report.drawing")  # matplotlib: imported now, while the walk imports torch

    report_json = _read_path()
    if report_json is None:  # the walk ended before it wrote a report.json
        return

    def draw() -> None:
        try:
            build_views(read_report(report_json))  # every figure goes into the figure cache
        except Exception as exc:  # noqa: BLE001  (drawing ahead is only a head start)
            log.debug("drawing ahead: %s: %s", type(exc).__name__, exc)

    drawn_at = None
    while not _walk_over(timeout=_POLL_S):
        try:
            stamp = report_json.stat().st_mtime_ns
        except OSError:
            continue
        if stamp != drawn_at:
            drawn_at = stamp
            draw()
    draw()  # the final report.json (figures drawn before are cache hits)


def _read_path() -> Optional[Path]:
    """The report.json path the walk sends, NUL-terminated; None at end of file without one."""
    data = b""
    while not data.endswith(b"\0"):
        chunk = os.read(sys.stdin.fileno(), 4096)
        if not chunk:
            return None
        data += chunk
    return Path(os.fsdecode(data[:-1]))


def _walk_over(timeout: float) -> bool:
    """True once the walk closed our stdin (end of file), waiting up to `timeout` for it."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and not os.read(sys.stdin.fileno(), 1024)


if __name__ == "__main__":
    _draw_while_the_walk_runs()
