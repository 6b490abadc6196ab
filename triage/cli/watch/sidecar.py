"""`triage watch DIR`: triage each finished capture under DIR, one at a time, and write its report in DIR-reports/.

A capture is finished when its manifest.json is there (the recorder writes it last, atomically); a folder
without one is being written and is left alone. Each triage is `triage run` in a child process at lower
priority, with the CPU threads and the device it was given; the child dies with the watcher (Linux), and
a restarted watcher triages again the capture it was killed in (state.py). After the report, `--then` runs
with the verdict in its environment (hook.py).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from triage.load.launch import EXIT_STOPPED  # `triage run` stopped before a leaf: the report is still written
from triage.errors import TriageError
from triage.flight.manifest import MANIFEST, CaptureManifest, is_capture, read_manifest
from triage.flight.places import report_dir
from triage.cli.watch.hook import run_then
from triage.cli.watch.state import MAX_ATTEMPTS, StateFile

log = logging.getLogger("triage.cli.watch")


@dataclass(frozen=True)
class WatchOptions:
    root: Path
    entry: Optional[str] = None
    out: Optional[Path] = None
    then: Optional[str] = None
    threads: Optional[int] = None
    device: Optional[str] = None
    nice: int = 10
    steps: Optional[int] = None
    playbook: Optional[Path] = None
    only: Optional[str] = None

    def report_dir(self, capture: Path) -> Path:
        """--out/<capture>, else DIR-reports/<capture> (never inside DIR, where a capture glob would find it)."""
        return report_dir(capture, self.out)


def check_options(options: WatchOptions) -> None:
    """Bad input fails before the first capture, with what to do."""
    if not options.root.is_dir():
        found = "a file" if options.root.exists() else "nothing"
        raise TriageError(f"Expected DIR '{options.root}' to be the folder the recorder writes captures to, found "
                          f"{found} there. Pass the recorder's dir= (create it first if the run has not started).")
    if options.entry is not None:
        check_entry(options.entry)
    if options.playbook is not None and not options.playbook.is_file():
        raise TriageError(f"Expected --playbook '{options.playbook}' to be a YAML file, found none. Check the path.")
    if options.only is not None and "/" in options.only:
        raise TriageError(f"Expected --only to name a capture folder inside DIR, found '{options.only}'.")


def check_entry(spec: str) -> None:
    """The entry's form, and that its file or module exists (it is imported by each triage, not here:
    the watcher stays free of the user's code)."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise TriageError(f"Expected --entry as 'module:function' or 'path/to/file.py:function', found '{spec}'. "
                          "Example: --entry mymod:setup")
    if module.endswith(".py") or "/" in module:
        if not Path(module).is_file():
            raise TriageError(f"Expected the file '{module}' named in --entry '{spec}', found no such file. Check "
                              "the path (relative to the folder triage watch runs in).")
        return
    if str(Path.cwd()) not in sys.path and "" not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise TriageError(f"Expected a module '{module}' importable from {Path.cwd()}, found none. Run triage "
                          "watch from the folder that holds it, or pass a file path: --entry path/to/mymod.py:setup")


def finished_captures(root: Path, only: Optional[str] = None) -> list[Path]:
    """Capture folders directly under `root` whose manifest is written, oldest first."""
    try:
        folders = [root / only] if only else [p for p in root.iterdir() if p.name.startswith("capture-")]
    except OSError as exc:
        raise TriageError(f"Expected to list DIR '{root}', found it unreadable ({exc.strerror or exc}).") from None
    done = [p for p in folders if is_capture(p)]
    return sorted(done, key=lambda p: (_written_at(p), p.name))


def _written_at(capture: Path) -> float:
    """When the capture's manifest was written; a capture deleted meanwhile sorts last (and is skipped later)."""
    try:
        return (capture / MANIFEST).stat().st_mtime
    except OSError:
        return float("inf")


class Watcher:
    def __init__(self, options: WatchOptions):
        check_options(options)
        self.options = options
        self.state = StateFile(options.out or options.root).open()
        self._child: Optional[subprocess.Popen] = None
        self.failed: list[str] = []  # captures whose triage failed while this watcher ran (`--once` exits 1)

    def run(self, once: bool, interval: float) -> int:
        """Poll until stopped (or, with `once`, until what is there now is done). Returns the number of
        captures triaged."""
        where = f"; reports under {self.options.out}" if self.options.out else ""
        log.warning("watching %s for captures%s", self.options.root, where)
        count = 0
        while True:
            for capture in finished_captures(self.options.root, self.options.only):
                count += self.process(capture)
            if once:
                return count
            time.sleep(interval)

    def process(self, capture: Path) -> int:
        """Triage one capture unless it is done or another process holds it. Returns 1 when it ran."""
        name = capture.name
        if _settled(self.state.get(name)):
            return 0
        with self.state.claim(name) as mine:
            if not mine:
                return 0
            record = self.state.get(name)  # re-read under the claim: the holder before us may have finished
            if _settled(record):
                return 0
            if record is not None and record.status == "running" and record.attempts >= MAX_ATTEMPTS:
                self._failed(name, f"{record.attempts} triages were started and none finished; giving up on it")
            elif record is None or record.status == "running":
                if record is not None:
                    log.warning("%s: a watcher stopped in the middle of its triage; triaging it again",
                                name)
                self._triage(capture)
            record = self.state.get(name)
            if record.status == "reported" or (record.status == "failed" and record.then_exit is None):
                self._then(capture)
            return 1

    def _triage(self, capture: Path) -> None:
        name = capture.name
        attempts = (self.state.get(name).attempts if self.state.get(name) else 0) + 1
        out = self.options.report_dir(capture)
        self.state.update(name, status="running", attempts=attempts, report=str(out))
        try:
            manifest = read_manifest(capture)
        except TriageError as exc:
            self._failed(name, str(exc))
            return
        entry = self.options.entry or manifest.entry
        if not entry:
            self._failed(name, "no --entry was given and the capture's manifest names none; pass --entry mymod:setup")
            return
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._failed(name, f"the report folder '{out}' cannot be created ({exc.strerror or exc}); pass --out "
                               "to a folder triage can write")
            return
        argv = self._argv(capture, entry, out)
        log.warning("triaging %s (%s at step %d) -> %s", name, manifest.trigger.kind, manifest.step, out)
        started = time.monotonic()
        code = self._run_child(argv, out / "triage.log")
        report = _read_report(out)
        seconds = time.monotonic() - started
        if code in (0, EXIT_STOPPED) and report is not None:
            log.warning("%s: %s (%s confidence) in %.0f s; report: %s", name, report.get("root_cause"),
                        report.get("confidence"), seconds, out / "report.html")
            self.state.update(name, status="reported", root_cause=report.get("root_cause"),
                              confidence=report.get("confidence"))
        else:
            self._failed(name, f"`triage run` exited with status {code} after {seconds:.0f} s; its log: {out / 'triage.log'}")

    def _failed(self, name: str, error: str) -> None:
        log.error("%s: %s", name, error)
        self.state.update(name, status="failed", error=error)
        self.failed.append(name)

    def _argv(self, capture: Path, entry: str, out: Path) -> list[str]:
        argv = [sys.executable, "-m", "triage", "run", "--checkpoint", str(capture.absolute()), "--entry", entry,
                "--out", str(out.absolute()), "--output", "jsonl"]
        if self.options.steps:
            argv += ["--steps", str(self.options.steps)]
        if self.options.playbook:
            argv += ["--playbook", str(self.options.playbook.absolute())]
        return argv

    def _run_child(self, argv: list[str], log_path: Path) -> int:
        env = child_env(os.environ, self.options.threads, self.options.device)
        nice = self.options.nice
        with open(log_path, "ab") as out:
            self._child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           env=env, preexec_fn=lambda: _child_setup(nice))
            try:
                return self._child.wait()
            finally:
                if self._child.poll() is None:  # the watcher is being stopped: its triage stops with it
                    self._child.terminate()
                    self._child.wait()
                self._child = None

    def _then(self, capture: Path) -> None:
        """--then, at least once: marked started before it runs, so a watcher stopped while it ran runs it
        again on restart, telling it so (TRIAGE_THEN_REPEAT=1) rather than losing the on-call's notice."""
        record = self.state.get(capture.name)
        if record.then_started and self.options.then:
            log.warning("%s: a watcher stopped while --then ran; running it again (TRIAGE_THEN_REPEAT=1)", capture.name)
        repeat = record.then_started
        record = self.state.update(capture.name, then_started=True)
        manifest = _manifest_or_none(capture)
        code = run_then(self.options.then, capture, Path(record.report) if record.report else None, record, manifest,
                        repeat=repeat)
        self.state.update(capture.name, status="done" if record.status == "reported" else "failed",
                          then_exit=code if code is not None else 0)


def _settled(record) -> bool:
    """Nothing is left to do for this capture: --then has run after its report (or after its failure). A
    capture given up on by a watcher before --then ran after failures too is settled, not notified late."""
    if record is None or record.status not in ("done", "failed"):
        return False
    return (record.status == "done" or record.then_exit is not None
            or (record.attempts >= MAX_ATTEMPTS and not record.then_started))


def child_env(environ, threads: Optional[int], device: Optional[str]) -> dict[str, str]:
    """The triage's environment: its CPU threads and the one device it may see."""
    env = dict(environ)
    if threads:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = "" if device == "cpu" else device.removeprefix("cuda:")
    return env


def _child_setup(nice: int) -> None:
    """In the child before exec: lower its priority, and have the kernel kill it if the watcher dies (so a
    killed watcher leaves no triage writing the report the restarted one will write)."""
    if nice:
        os.nice(nice)
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _read_report(out: Path) -> Optional[dict]:
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def _manifest_or_none(capture: Path) -> Optional[CaptureManifest]:
    try:
        return read_manifest(capture)
    except TriageError:
        return None
