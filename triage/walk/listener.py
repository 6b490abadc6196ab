"""What the terminal view (or a test) hears while the walk goes on."""

from __future__ import annotations

from typing import Optional, Protocol

from triage.records import Decision, ExperimentRun


class Listener(Protocol):
    """What the terminal view (or a test) hears while the walk goes on."""

    def started(self, node: str, experiment: str, title: Optional[str]) -> None: ...
    def progress(self, done: int, total: int) -> None: ...
    def finished(self, run: ExperimentRun, decision: Decision) -> None: ...
    def decided(self, decision: Decision) -> None: ...  # a decision or differential node chose
    def close(self) -> None: ...


class SilentListener:
    def started(self, node, experiment, title): pass
    def progress(self, done, total): pass
    def finished(self, run, decision): pass
    def decided(self, decision): pass
    def close(self): pass
