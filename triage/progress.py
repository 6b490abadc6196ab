"""What the terminal shows while triage runs: a live view, JSON lines for CI logs, or nothing."""

from __future__ import annotations

import json
import sys
from typing import Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from triage.records import Decision, ExperimentRun

_STATUS_MARK = {"ok": "[green]✓[/]", "error": "[red]✗[/]", "oom": "[red]✗ OOM[/]", "timeout": "[yellow]⏱[/]"}


def outcome_line(run: ExperimentRun, decision: Decision) -> str:
    """One line per finished experiment: its figures that decided, and the branch taken."""
    figures = ", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in decision.figures.items()
                        if k.startswith(run.node + "."))
    why = decision.when or "otherwise"
    return f"{run.node} ({run.experiment}, {run.seconds:.1f}s) {figures} → {decision.goto} [{why}]"


class LiveView:
    """rich: one live progress bar for the experiment running; a line above it for each one finished."""

    def __init__(self, console: Optional[Console] = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                  console=self.console, transient=True)
        self._task = None

    def started(self, node: str, experiment: str, title: Optional[str]) -> None:
        self._progress.start()  # a no-op once started
        self._task = self._progress.add_task(f"{node}: {title or experiment}", total=None)

    def progress(self, done: int, total: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=done, total=total)

    def finished(self, run: ExperimentRun, decision: Decision) -> None:
        self._progress.remove_task(self._task)
        self._task = None
        mark = _STATUS_MARK[run.status]
        self._progress.console.print(f"{mark} {escape(outcome_line(run, decision))}", highlight=False)

    def decided(self, decision: Decision) -> None:
        if not decision.candidates:  # a decision node
            self._progress.console.print(f"[cyan]⇒[/] {escape(decision.node)} → {escape(decision.goto)} "
                                         f"[{escape(decision.when or 'otherwise')}]", highlight=False)
            return
        tried = [c for c in decision.candidates if c.tried and c.then]
        winner = next((c.id for c in tried if c.winner), None)
        verdict = f"{winner} works best ({decision.confidence} confidence)" if winner else "no candidate fix works"
        self._progress.console.print(f"[cyan]⇒[/] {escape(decision.node)}: {len(tried)} candidates tried, "
                                     f"{escape(verdict)} → {escape(decision.goto)}", highlight=False)

    def close(self) -> None:
        self._progress.stop()


class JsonLines:
    """One JSON object per event on stdout, for CI logs."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout

    def _emit(self, **event) -> None:
        self.stream.write(json.dumps(event, default=str) + "\n")
        self.stream.flush()

    def started(self, node, experiment, title):
        self._emit(event="started", node=node, experiment=experiment)

    def progress(self, done, total):
        pass

    def close(self):
        pass

    def finished(self, run, decision):
        self._emit(event="finished", node=run.node, status=run.status, seconds=run.seconds,
                   figures=decision.figures, goto=decision.goto, when=decision.when)

    def decided(self, decision):
        self._emit(event="decided", node=decision.node, goto=decision.goto, confidence=decision.confidence,
                   candidates=[c.model_dump(mode="json") for c in decision.candidates])
