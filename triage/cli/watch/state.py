"""What `triage watch` has done, kept across restarts: one record per capture, in a JSON file written
atomically (triage/atomic.py) under a short lock, so a watcher and a training process's own launch
(flight/autotriage.py) can share it.

A capture is `running` from before its triage starts until its report is written (`reported`), then
`done` once the --then command has run (`failed`, where the triage failed, with --then run after it too). A
watcher that restarts re-runs a capture left `running` (it was killed in the middle), and runs --then for
one left `reported`, or `failed` before its --then finished (again, where it was stopped while --then
ran: at least once); it never starts a `done` one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from triage import atomic
from triage.errors import TriageError

STATE_DIR = ".triage-watch"
Status = Literal["running", "reported", "done", "failed"]
MAX_ATTEMPTS = 3  # a capture whose triage kills the watcher every time is given up after this many starts


class CaptureRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    status: Status
    attempts: int = Field(default=0, description="Triages started (more than one: a watcher was killed in one).")
    report: Optional[str] = Field(default=None, description="The report folder.")
    root_cause: Optional[str] = None
    confidence: Optional[str] = None
    error: Optional[str] = Field(default=None, description="Why the triage failed, when it did.")
    then_started: bool = Field(default=False, description="--then was started (it may not have finished).")
    then_exit: Optional[int] = Field(default=None, description="The --then command's exit status.")


class WatchState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal["triage-watch"] = "triage-watch"
    captures: dict[str, CaptureRecord] = Field(default_factory=dict, description="By capture folder name.")


class StateFile:
    """The state of the watcher whose reports go to `folder` (state, lock and per-capture locks inside
    `folder/.triage-watch/`)."""

    def __init__(self, folder: Path):
        self.dir = Path(folder) / STATE_DIR
        self.path = self.dir / "state.json"

    def open(self) -> "StateFile":
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TriageError(f"Expected to keep the watcher's state in '{self.dir}', found it cannot be created "
                              f"({exc.strerror or exc}). Pass --out to a folder triage can write.") from None
        self.read()  # a corrupt file fails at start, not after the first triage
        return self

    def read(self) -> WatchState:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return WatchState()
        try:
            return WatchState.model_validate_json(text)
        except ValidationError:
            raise TriageError(f"Expected '{self.path}' to be triage watch's state, found it unreadable. Move it "
                              "aside to start afresh (every capture without a report is then triaged again).") from None

    def get(self, name: str) -> Optional[CaptureRecord]:
        return self.read().captures.get(name)

    def update(self, name: str, **changes) -> CaptureRecord:
        """Change one capture's record (read, change, write atomically, under the state lock)."""
        with self._locked(self.dir / "state.lock"):
            state = self.read()
            old = state.captures.get(name)
            record = old.model_copy(update=changes) if old else CaptureRecord(**changes)
            captures = {**state.captures, name: CaptureRecord.model_validate(record.model_dump())}
            atomic.write_text(self.path, WatchState(captures=captures).model_dump_json(indent=1))
        return captures[name]

    @contextlib.contextmanager
    def claim(self, name: str) -> Iterator[bool]:
        """Hold this capture's lock while it is triaged: True when taken, False when another process
        (a second watcher, a training process's own launch) holds it now. Released when the holder dies."""
        handle = open(self.dir / f"{name}.lock", "a")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            handle.close()

    @staticmethod
    @contextlib.contextmanager
    def _locked(path: Path) -> Iterator[None]:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
