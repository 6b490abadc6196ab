"""What the terminal shows while triage runs: a live view, JSON lines for CI logs, or nothing.

The live view gives each node a line: its question and the answer in words, with the figure that
settled it. A node whose branch found something is marked `!`, one that found nothing `✓`, a candidate
fix `+` (it works) or `-`; `--verbose` adds the raw figures and the branch condition under each line.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from triage.records import Decision, ExperimentRun
from triage.report import labels
from triage.report.words import format_figure

_FAILED = {"error": "[red]✗ error[/]", "oom": "[red]✗ out of memory[/]", "timeout": "[yellow]⏱ cut by --max-minutes[/]",
           "not_applicable": "[dim]– not applicable[/]"}
_CANDIDATE = "candidate of "  # the engine's `when` for a differential's candidate
SHOWN_FIGURES = 3  # the most figures a line shows without --verbose


def figure(value: Any) -> str:
    """A figure as the report writes it (4 significant digits, true/false), "unknown" for not measured."""
    return "unknown" if value is None else format_figure(value)


def figure_words(decision: Decision, node: Optional[str] = None, limit: Optional[int] = SHOWN_FIGURES) -> str:
    """The figures that settled the branch, named in words ("loss ratio 1.448"): the node's own first,
    at most `limit`. Figures not measured, and a status of "ok", say nothing and are left out ("not
    measured" when that leaves none)."""
    deciding = [k for k in decision.deciding if k in decision.figures]
    keys = [k for k in deciding if decision.figures[k] is not None
            and not (k.endswith(".status") and decision.figures[k] == "ok")]
    if deciding and not keys and all(decision.figures[k] is None for k in deciding):
        return "not measured"
    if node:
        keys.sort(key=lambda k: not k.startswith(node + "."))
    shown = [_words(k, decision.figures[k], node) for k in keys[:limit]]
    return ", ".join(shown) + (", …" if limit is not None and len(keys) > limit else "")


def _words(key: str, value: Any, node: Optional[str]) -> str:
    """"loss ratio 1.448"; a flag is its name when true ("grads accumulate"), "finite: no" when false."""
    name = labels.words(key, node)  # the one table of labels report.html and summary.md use
    if isinstance(value, bool):
        return name if value else f"{name}: no"
    return f"{name} {figure(value) if value is None else labels.value(key, value)}"


def answer_line(decision: Decision) -> str:
    """The branch taken, in the playbook's words where it has them, with the figures that settled it."""
    figures = figure_words(decision, decision.node)
    answer = decision.answer or f"→ {decision.goto}"
    return f"{answer} ({figures})" if figures else answer


def raw_line(run: Optional[ExperimentRun], decision: Decision) -> str:
    """Everything behind a line (--verbose): every figure the conditions read, the branch and its condition."""
    figures = ", ".join(f"{k}={figure(v)}" for k, v in decision.figures.items())
    head = f"{run.experiment}, {run.seconds:.2f}s; " if run else ""
    return f"{head}{figures or 'no figures read'} → {decision.goto} [{decision.when or 'otherwise'}]"


class _Count(ProgressColumn):
    """done/total, or nothing while the experiment has not said how many steps it takes."""

    def render(self, task) -> Text:
        return Text(f"{task.completed:.0f}/{task.total:.0f}" if task.total else "", style="progress.download")


class LiveView:
    """rich: one live progress bar for the experiment running; a line above it for each node answered."""

    def __init__(self, console: Optional[Console] = None, verbose: bool = False) -> None:
        self.console = console or Console(stderr=True, soft_wrap=not sys.stderr.isatty())
        self.verbose = verbose
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), _Count(), TimeElapsedColumn(),
                                  console=self.console, transient=True)
        self._task = None
        self._titles: dict[str, str] = {}

    def started(self, node: str, experiment: str, title: Optional[str]) -> None:
        self._progress.start()  # a no-op once started
        self._titles[node] = title or experiment
        self._task = self._progress.add_task(escape(f"{node}: {title or experiment}"), total=None)

    def progress(self, done: int, total: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=done, total=total)

    def finished(self, run: ExperimentRun, decision: Decision) -> None:
        self._progress.remove_task(self._task)
        self._task = None
        title = self._titles.get(run.node, run.experiment)
        if decision.when and decision.when.startswith(_CANDIDATE):
            line = self._candidate(run, decision, title)
        else:
            mark = _FAILED.get(run.status) or ("[bold red]![/]" if decision.when else "[green]✓[/]")
            line = f"{mark} [bold]{escape(run.node)}[/]  {escape(title)}  {escape(answer_line(decision))}"
        self._print(f"{line} [dim]{run.seconds:.1f}s[/]", run, decision)

    def _candidate(self, run: ExperimentRun, decision: Decision, title: str) -> str:
        works = next((v for k, v in decision.figures.items() if k.endswith(".fix_works")), None)
        end = next((v for k, v in decision.figures.items() if not k.endswith(".fix_works")), None)
        if run.status != "ok":
            mark, verdict = _FAILED[run.status], "not measured"
        else:
            mark, verdict = {True: ("[green]+[/]", "works"), False: ("[dim]-[/]", "does not work")}.get(
                works, ("[dim]·[/]", "a control"))
        tail = f", loss at the end {figure(end)}" if isinstance(end, (int, float)) else ""
        return f"  {mark} {escape(run.node)}  {escape(title)}: {verdict}{escape(tail)}"

    def decided(self, decision: Decision) -> None:
        if not decision.candidates:  # a decision node: its answer says what it decided
            line = f"[cyan]⇒[/] [bold]{escape(decision.node)}[/]  {escape(answer_line(decision))}"
        else:
            tried = [c for c in decision.candidates if c.tried and c.then]
            measured = [c for c in tried if c.status in (None, "ok")]
            winner = next((c.id for c in tried if c.winner), None)
            unfinished = len(tried) - len(measured)
            verdict = (f"{winner} works best ({decision.confidence} confidence)" if winner else
                       f"no candidate fix works ({len(measured)} measured"
                       + (f", {unfinished} failed)" if unfinished else ")"))
            line = f"[cyan]⇒[/] [bold]{escape(decision.node)}[/]  {escape(verdict)} → {escape(decision.goto)}"
        self._print(line, None, decision)

    def _print(self, line: str, run: Optional[ExperimentRun], decision: Decision) -> None:
        self._progress.console.print(line, highlight=False)
        if self.verbose:
            self._progress.console.print(f"    [dim]{escape(raw_line(run, decision))}[/]", highlight=False)

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
                   answer=decision.answer, figures=decision.figures, deciding=decision.deciding,
                   goto=decision.goto, when=decision.when)

    def decided(self, decision):
        self._emit(event="decided", node=decision.node, goto=decision.goto, answer=decision.answer,
                   confidence=decision.confidence,
                   candidates=[c.model_dump(mode="json") for c in decision.candidates])
