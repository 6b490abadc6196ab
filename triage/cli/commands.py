"""The command line: `triage run`, `triage demo`, `triage report`, `triage watch`, `triage read-history`.

Exit codes: 0 when triage finished (whatever the verdict), 2 for bad usage or bad input, 3 when a distributed
walk stopped because a rank raised or stopped responding (rank 0 still wrote the report).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape

from triage.errors import Interrupted, TriageError
from triage.load import DEFAULT_RANK_TIMEOUT_S

# Plain help (rich_markup_mode=None): typer's rich help shows a bare flag as `--verbose <bool>` under click 8.5,
# which the parser then refuses; click's own help shows what the parser takes.
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Diagnose a failed training run by experiment.")
SPEEDUPS_HELP = ("Turn off what triage does only to be faster (the forked copy measuring candidates, drawing "
                 "figures ahead, the figure cache): the same report, slower. For checking they change nothing.")
# Piped into a file or a ticket, lines are not hard-wrapped at 80 columns (a fix line cut mid-value).
console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())


def _version(shown: bool) -> None:
    if shown:
        from triage import __version__

        print(f"triage {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="Print triage's version and exit.")) -> None:
    """Diagnose a failed training run by experiment."""


class Output(str, Enum):
    live = "live"
    quiet = "quiet"
    jsonl = "jsonl"


def _listener(output: Output, silent: bool = False, verbose: bool = False):
    from triage.cli.progress import JsonLines, LiveView
    from triage.walk.engine import SilentListener

    if silent or output is Output.quiet:  # ranks other than 0: rank 0 shows the walk
        return SilentListener()
    return LiveView(verbose=verbose) if output is Output.live else JsonLines()


def _finish(report, files, output: Output) -> None:
    if output is Output.jsonl:
        print(json.dumps({"event": "verdict", "root_cause": report.root_cause, "report": str(files["html"])}))
        return
    if output is Output.quiet:
        print(files["html"])
        return
    from triage.cli.verdict import verdict_lines

    console.print(f"\n[bold]{escape(report.title)}[/] ([cyan]{report.root_cause}[/], {report.confidence} confidence)",
                  highlight=False)
    for label, text in [*verdict_lines(report), ("Report", str(files["html"]))]:
        console.print(f"[bold]{label + ':':<9}[/] {escape(text)}", highlight=False)


@app.command()
def run(
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", "-c", help="The failing run's checkpoint (.pt, .ckpt, HF or capture folder); required."),
    entry: str = typer.Option(..., "--entry", "-e", help="mymod:setup or path/to/file.py:setup"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Report folder (default: reports/<time>)."),
    playbook: Optional[Path] = typer.Option(None, "--playbook", "-p", help="A playbook YAML (default: the shipped one)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Steps per replay (default: the playbook's)."),
    seed: int = typer.Option(0, "--seed", help="Seed for every experiment (0 to 4294967295: numpy's seeds are 32-bit)."),
    max_minutes: Optional[float] = typer.Option(
        None, "--max-minutes", help="A ceiling on the whole walk (default: none). Reached, it cuts the experiment "
                                    "in flight and the walk stops with no verdict, naming what it cut; below it, "
                                    "every experiment runs its steps whatever the machine's speed."),
    history: Optional[Path] = typer.Option(None, "--history", help="Loss history: CSV (Lightning metrics.csv), JSONL, trainer_state.json or a TensorBoard log folder."),
    history_loss: Optional[str] = typer.Option(None, "--history-loss", help="The history's training-loss column or tag, when not a usual name."),
    history_val: Optional[str] = typer.Option(None, "--history-val", help="The history's validation-loss column or tag."),
    trust_checkpoint: bool = typer.Option(False, "--trust-checkpoint", help="Unpickle the checkpoint fully (runs code in it: only files you trust)."),
    trust_playbook: bool = typer.Option(False, "--trust-playbook", help="Let the playbook's `imports:` run (Python modules: only code you trust)."),
    snapshot_dir: Optional[Path] = typer.Option(None, "--snapshot-dir", help="Keep the state snapshot in a memory-mapped file here instead of in memory (large checkpoints)."),
    output: Output = typer.Option(Output.live, "--output", help="live view, quiet, or jsonl events for CI logs."),
    nproc_per_node: Optional[int] = typer.Option(
        None, "--nproc-per-node", min=1, help="A distributed run: start torchrun with N ranks on this machine, "
                                              "each running this command (as `torchrun --nproc-per-node N -m triage run ...`)."),
    rank_timeout: float = typer.Option(
        DEFAULT_RANK_TIMEOUT_S, "--rank-timeout", min=1,
        help="Distributed runs: seconds a rank may stay silent in a collective before the walk stops naming it."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Under each node's answer, every figure its "
                                                                 "conditions read and the branch condition."),
    no_speedups: bool = typer.Option(False, "--no-speedups", help=SPEEDUPS_HELP),
    no_race: bool = typer.Option(False, "--no-race", help="Run every candidate fix to its last step, even one that "
                                                          "can no longer change the verdict (by default it stops "
                                                          "there: racing)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Triage a run from its checkpoint and setup function (under torchrun: every rank of a distributed run)."""
    if checkpoint is None:  # issue 20: a fresh initialisation is a run that never failed
        with _user_errors(debug):
            raise TriageError("Expected --checkpoint: the failing run's checkpoint (a .pt/.ckpt file, a Hugging Face "
                              "checkpoint-N folder, a torch.distributed.checkpoint folder or a flight-recorder "
                              "capture), found none. Pass --checkpoint PATH; without it triage would replay "
                              "setup()'s fresh initialisation, a run that never failed.")
    rank = int(os.environ.get("RANK", "0"))
    speedups = _speedups(no_speedups)
    ahead = _drawer() if speedups.draw_ahead and not nproc_per_node and rank == 0 else None
    from triage.cli.api import run as run_triage
    from triage.load.launch import EXIT_STOPPED, launch, launch_command

    if nproc_per_node:
        raise typer.Exit(launch(nproc_per_node, sys.argv[1:]))
    with _user_errors(debug, rank if "RANK" in os.environ else None), ahead or contextlib.nullcontext():
        report, files = run_triage(entry, checkpoint, out=out, playbook=playbook, steps=steps, seed=seed,
                                   history=history, trust_checkpoint=trust_checkpoint, trust_playbook=trust_playbook,
                                   history_loss=history_loss, history_val=history_val, snapshot_dir=snapshot_dir,
                                   listener=_listener(output, silent=rank != 0, verbose=verbose),
                                   command=launch_command(sys.argv[1:]), rank_timeout=rank_timeout,
                                   ahead=ahead, speedups=speedups, max_minutes=max_minutes, race=not no_race)
    if files:  # the rank that wrote the report (rank 0 of a distributed run)
        _finish(report, files, output)
    if report.stopped:
        console.print(f"[bold red]triage:[/] the walk stopped: {escape(report.stopped)}", highlight=False)
        raise typer.Exit(EXIT_STOPPED)


@app.command()
def demo(
    name: str = typer.Argument("lr_too_high", help="A zoo example (see `triage demo --list`)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o"),
    list_: bool = typer.Option(False, "--list", help="List the zoo examples."),
    output: Output = typer.Option(Output.live, "--output"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Every figure each node read, and its condition."),
    debug: bool = typer.Option(False, "--debug"),
    no_speedups: bool = typer.Option(False, "--no-speedups", help=SPEEDUPS_HELP),
) -> None:
    """Run the full triage on a shipped fault example (its checkpoint is made if missing)."""
    from triage.cli.zoo import (
        demo_checkpoint,
        example_names,
        example_path,
        example_summary,
    )

    if list_:  # without importing torch: each example's summary is read from its docstring
        names = example_names()
        width = max(map(len, names))
        print("\n".join(f"{n:<{width}}  {example_summary(n)}" for n in names))
        return
    speedups = _speedups(no_speedups)
    ahead = _drawer() if speedups.draw_ahead else None
    from triage.cli.api import run as run_triage

    with _user_errors(debug), ahead or contextlib.nullcontext():
        checkpoint = _shown(demo_checkpoint(name))
        entry = f"{_shown(example_path(name))}:setup"
        report, files = run_triage(entry, checkpoint, out=out, listener=_listener(output, verbose=verbose),
                                   command=shlex.join(["triage", "run", "--checkpoint", str(checkpoint), "--entry", entry]),
                                   ahead=ahead, speedups=speedups)
    _finish(report, files, output)


@app.command("report")
def rerender(
    report_json: Path = typer.Argument(..., help="A report.json written by triage."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the new files (default: beside it)."),
    debug: bool = typer.Option(False, "--debug"),
    no_speedups: bool = typer.Option(False, "--no-speedups", help="Draw every figure again: take none from the "
                                                                   "figure cache or from the page beside report.json."),
) -> None:
    """Re-render report.html and summary.md from report.json, without re-running anything."""
    from triage.report import carried, read_report, write_report
    from triage.speedups import using

    with _user_errors(debug), using(_speedups(no_speedups)):
        report = read_report(report_json)
        with carried.figures_from(report_json.parent / "report.html"):  # not drawn again if they pass
            files = write_report(report, out or report_json.parent)
    print(files["html"])


@app.command()
def watch(
    folder: Path = typer.Argument(..., metavar="DIR", help="The folder the recorder writes captures to."),
    entry: Optional[str] = typer.Option(None, "--entry", "-e", help="mymod:setup (default: the entry each capture's manifest names)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for the reports, one sub-folder per capture (default: DIR-reports/<capture>, beside DIR, so a glob of DIR finds captures only)."),
    then: Optional[str] = typer.Option(None, "--then", help="A shell command run after each triage, with TRIAGE_REPORT, TRIAGE_ROOT_CAUSE, TRIAGE_CONFIDENCE, ... in its environment."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="CPU threads each triage may use (default: torch's own choice)."),
    device: Optional[str] = typer.Option(None, "--device", help="The CUDA device each triage may see (an index such as 1), or cpu to hide them all."),
    nice: int = typer.Option(10, "--nice", min=0, max=19, help="How much lower each triage's CPU priority is than the watcher's."),
    interval: float = typer.Option(10.0, "--interval", min=0.05, help="Seconds between looks at DIR."),
    once: bool = typer.Option(False, "--once", help="Triage the finished captures there now, then exit."),
    only: Optional[str] = typer.Option(None, "--only", help="Only this capture folder (a name inside DIR)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Steps per replay (default: the playbook's)."),
    playbook: Optional[Path] = typer.Option(None, "--playbook", "-p", help="A playbook YAML (default: the shipped one)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """Triage each finished capture under DIR, one at a time, and write its report in DIR-reports/.

    A capture is finished when the recorder has written its manifest (last, atomically). Restarted, the
    watcher never triages a capture twice and triages again the one it was stopped in (its state is in
    DIR/.triage-watch/, or in --out). Exit codes: 0 stopped, or done (--once); 1 a triage failed (--once);
    2 bad input.
    """
    from triage.cli.watch.sidecar import Watcher, WatchOptions

    with _user_errors(debug):
        options = WatchOptions(root=folder, entry=entry, out=out, then=then, threads=threads, device=device,
                               nice=nice, steps=steps, playbook=playbook, only=only)
        watcher = Watcher(options)
        try:
            watcher.run(once=once, interval=interval)
        except KeyboardInterrupt:
            console.print("[bold yellow]triage watch:[/] stopped; a capture in the middle of its triage is "
                          "triaged again when the watcher restarts.", highlight=False)
            raise typer.Exit(130)
        if once and watcher.failed:  # a scheduled `--once` must not report success over a failed triage
            console.print(f"[bold red]triage watch:[/] the triage of {', '.join(watcher.failed)} failed; "
                          f"its log (triage.log) is in its report folder, and its state in .triage-watch/.", highlight=False)
            raise typer.Exit(1)


@app.command("read-history")
def read_history(
    file: Path = typer.Argument(..., metavar="FILE", help="A loss log: CSV (Lightning metrics.csv), JSONL, trainer_state.json or a TensorBoard log folder."),
    loss_key: Optional[str] = typer.Option(None, "--loss", help="The training-loss column or tag, when not a usual name."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", "-c", help="For the verify command: the run's checkpoint or capture."),
    entry: Optional[str] = typer.Option(None, "--entry", "-e", help="For the verify command: mymod:setup."),
    as_json: bool = typer.Option(False, "--json", help="Print the reading as one JSON object."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks."),
) -> None:
    """An unverified reading of a loss log alone: diverged, plateau, oscillating or healthy, and the step it
    started. No experiment runs: it names a symptom, not a cause (`triage run` finds that, by experiment).

    Exit codes, for a CI gate: 0 healthy, 1 a symptom was read, 2 bad input (no such file, no loss in it,
    fewer than 10 points).
    """
    from triage.cli.watch.reading import MIN_POINTS, read_curve
    from triage.load.history import read_history_file

    with _user_errors(debug):
        points = read_history_file(file, loss_key)
        reading = read_curve(points)
        if reading is None:
            found = sum(p.loss is not None for p in points)
            raise TriageError(f"Expected at least {MIN_POINTS} training-loss points in '{file}' to read a curve, found "
                              f"{found}. Pass a longer log (or name its loss with --loss).")
    verify = shlex.join(["triage", "run", "--checkpoint", checkpoint or "CHECKPOINT", "--entry", entry or "mymod:setup",
                         "--history", str(file)])
    if as_json:
        print(json.dumps({**reading.model_dump(mode="json"), "verified": False, "verify": verify}))
    else:
        where = f", from step {reading.started}" if reading.started is not None else ""
        print(f"Unverified reading of {file} (the loss log alone; no experiment ran)")
        print(f"Symptom: {reading.symptom}{where}: {reading.detail}.")
        print(f"Verify:  {verify}")
        print("A log shows what happened, not why: the experiments of `triage run` find the cause and test the fix.")
    raise typer.Exit(0 if reading.symptom == "healthy" else 1)


@app.command()
def bench(
    names: Optional[list[str]] = typer.Argument(None, help="Zoo examples (default: all)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1),
    folder: Optional[Path] = typer.Option(None, "--folder", help="Another folder of fault modules (default: the zoo)."),
    keep: Optional[Path] = typer.Option(None, "--keep", help="Keep every checkpoint and report here."),
) -> None:
    """Triage every zoo example; print the confusion table, accuracy, false alarms and seconds per case."""
    from triage.cli.bench import print_table, run_cases

    logging.basicConfig(level=logging.ERROR)
    print_table(run_cases(names or None, steps, folder=folder, keep=keep), sys.stdout)


def _speedups(off: bool):
    """All of the speed machinery, or (--no-speedups) none of it."""
    from triage.speedups import Speedups

    return Speedups.none() if off else Speedups()


def _drawer():
    """The process that draws the report's figures while the walk runs, started before torch is imported
    (report/ahead.py): the page at the end then draws next to nothing."""
    from triage.report.ahead import Ahead

    return Ahead()


def _shown(path: Path) -> Path:
    """A path as the reproduce command should show it: relative when it lies under the current folder."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


class _user_errors:
    """Print a TriageError as its message and exit 2; tracebacks only with --debug. Under torchrun, every
    line names the rank that printed it."""

    def __init__(self, debug: bool, rank: Optional[int] = None) -> None:
        self.debug = debug
        self.prefix = f"[rank {rank}] " if rank is not None else ""
        logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                            format=f"%(levelname)s {self.prefix}%(name)s: %(message)s")

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, Interrupted):
            console.print(f"[bold yellow]triage:[/] interrupted after {len(exc.report.experiments)} experiments; "
                          f"the report of what finished (status interrupted) is at {escape(str(exc.files.get('html', 'the output folder of the rank that writes it')))}",
                          highlight=False)
            raise typer.Exit(code=130)
        if isinstance(exc, KeyboardInterrupt):
            console.print("[bold yellow]triage:[/] interrupted outside the experiments (while loading, or while "
                          "writing the report): a report.json in the output folder, if there is one, holds the "
                          "experiments that finished.", highlight=False)
            raise typer.Exit(code=130)
        if exc is None or not isinstance(exc, TriageError):
            return False
        if self.debug:
            console.print_exception()
        console.print(f"[bold red]triage:[/] {escape(self.prefix + str(exc))}", highlight=False)
        raise typer.Exit(code=2)


def main() -> None:
    try:
        app()
    except SystemExit as done:  # typer ends every command this way
        code = done.code
    else:
        code = 0
    _exit_now(code)


def _exit_now(code) -> NoReturn:
    """Exit without Python's teardown, which frees every module and object one by one: with torch and
    its compiler stack imported that takes ~0.8 s on a small machine, after the report is written. Exit
    handlers still run (a user's own too) and output is flushed; not done: joining threads a setup()
    left running, and closing files it left open without flushing them."""
    if isinstance(code, str):  # sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # `triage ... | head` closed the pipe; a closed stream
            pass
    os._exit(code or 0)
