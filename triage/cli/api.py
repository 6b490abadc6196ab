"""`triage.run`: the main job as a function (the CLI is a thin layer over it)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import math
from pathlib import Path
from typing import Any, Optional, Union

import pydantic

from triage.errors import Interrupted, TriageError
from triage.load.entry import SetupFactory, entry_name
from triage.load.every_rank import open_on_every_rank
from triage.load.launch import launch_command
from triage.load.ranks import DEFAULT_RANK_TIMEOUT_S, joined
from triage.load.session import open_session
from triage.report import Report, write_report
from triage.report.ahead import Ahead
from triage.report.build import build_report
from triage.report.render import write_json
from triage.speedups import Speedups, using
from triage.walk.engine import Listener, walk
from triage.walk.playbook import Playbook, load_playbook

log = logging.getLogger(__name__)


def run(entry: Union[str, SetupFactory], checkpoint: Optional[Path] = None, *, out: Optional[Path] = None,
        playbook: Optional[Path] = None, steps: Optional[int] = None, seed: int = 0,
        history: Optional[Path] = None, trust_checkpoint: bool = False, trust_playbook: bool = False,
        history_loss: Optional[str] = None, history_val: Optional[str] = None,
        snapshot_dir: Optional[Path] = None, listener: Optional[Listener] = None, command: Optional[str] = None,
        rank_timeout: float = DEFAULT_RANK_TIMEOUT_S, ahead: Optional[Ahead] = None,
        speedups: Optional[Speedups] = None, max_minutes: Optional[float] = None,
        race: bool = True) -> tuple[Report, dict[str, Path]]:
    """Triage one run: load, walk the playbook, write the report. Returns it and the files written.

    `entry` is a spec like "mymod:setup" (as `--entry`) or the setup function itself (or a LightningModule
    class, or a function returning a LightningModule or a transformers.Trainer).
    `history_loss` / `history_val` name the loss columns or tags of `history` when they have other names.
    `trust_checkpoint` unpickles the checkpoint fully; `trust_playbook` lets the playbook's `imports:` run
    (both run code from those files: only for files you trust). `snapshot_dir` keeps the state snapshot in
    a memory-mapped file there instead of in memory.

    Under torchrun (or inside a torch.distributed process group) every rank calls this: each opens its own
    session and the walk runs in lockstep; rank 0 alone writes the report (the other ranks get no files).
    `rank_timeout` bounds how long a rank may stay silent in a collective before the walk stops naming it.
    `speedups` says which parts of the speed machinery the walk may use (triage/speedups.py). By default a
    library call uses the figure cache, and the drawer `ahead` where one is given: a caller running walks
    side by side has no core to spare for a forked copy. `speedups.fork` measures a differential's
    candidates two at a time (walk/forked.py). `ahead` is the drawer (report/ahead.py) the command line
    starts before it imports torch; it is closed when this returns (at once where `speedups` turns drawing
    ahead off).
    `max_minutes` is a ceiling on the walk (none by default): every experiment runs its steps, however fast
    the machine, until the ceiling cuts one; the walk then stops with no verdict, `report.cut` naming the
    experiment it cut, and `report.stopped` saying so (a cut experiment is unmeasured, not ruled out).
    `race`: a candidate fix stops once it can no longer change the verdict (judge/race.py); False runs every
    candidate to its last step.
    """
    if speedups is None:
        speedups = Speedups(fork=False, draw_ahead=ahead is not None)
    if not speedups.draw_ahead and ahead is not None:
        ahead.close()
        ahead = None
    with ahead or contextlib.nullcontext(), using(speedups):  # the drawer is closed however this ends
        _check_seed(seed)
        max_seconds = _ceiling_seconds(max_minutes)
        # The folders used after setup() runs, fixed before it does: a setup() that calls os.chdir must not move
        # them (the checkpoint, history and playbook are read before it; a DCP folder is kept absolute).
        started_in = Path.cwd()
        shown_out = Path(out) if out else default_out_dir()
        out, snapshot_dir = started_in / shown_out, _absolute(snapshot_dir)
        # the playbook is validated before anything runs
        book = with_steps(load_playbook(playbook, trust_imports=trust_playbook), steps)
        with joined(rank_timeout) as ranks:  # under torchrun: the process group, up before setup() runs
            session = open_on_every_rank(ranks, lambda: open_session(
                entry, checkpoint, seed=seed, history_path=history, trust_checkpoint=trust_checkpoint,
                history_keys=(history_loss, history_val), snapshot_dir=snapshot_dir))
            if ranks.writes_report:
                out = _writable_dir(out, shown_out)
                _retire_previous_report(out)
            name = entry if isinstance(entry, str) else entry_name(entry)
            command = command or _command(name, checkpoint, playbook, steps, seed, ranks.world_size, max_minutes, race)
            where = str(checkpoint) if checkpoint else None
            journal = Journal(session, book, command, where, out, ahead) if ranks.writes_report else None
            result = walk(session, book, listener, journal=journal, parallel=speedups.fork, max_seconds=max_seconds,
                          race=race)
            report = build_report(result, session, book, command, where)
            writes = ranks.rank == min(set(range(ranks.world_size)) - set(result.silent_ranks))
            if writes and journal is not None:
                journal.finish(report)
            files = write_report(report, _writable_dir(out, shown_out)) if writes else {}
            if Path.cwd() == started_in:  # the paths as the user gave them (absolute where setup() moved away)
                files = {name: shown_out / path.relative_to(out) for name, path in files.items()}
    if result.status == "interrupted":
        raise Interrupted(report, files)
    return report, files


@dataclasses.dataclass
class Journal:
    """report.json rewritten (atomically) after every experiment, status "incomplete": a crash, a kill or
    a full disk later on cannot take what was measured with it. A journal write that fails is logged
    and the walk goes on; the final report says whether it could be written."""

    session: Any
    book: Playbook
    command: str
    checkpoint: Optional[str]
    out: Path
    ahead: Optional[Ahead] = None  # draws the figures of each report.json written, while the walk goes on
    failed: bool = False

    def __call__(self, partial) -> None:
        try:
            path = write_json(build_report(partial, self.session, self.book, self.command, self.checkpoint),
                              self.out)
        except Exception as exc:  # noqa: BLE001  (the walk matters more than its journal)
            if not self.failed:
                log.warning("could not save report.json after an experiment (%s: %s); going on",
                            type(exc).__name__, exc)
            self.failed = True
            return
        if self.ahead is not None:
            self.ahead.follow(path)

    def finish(self, report: Report) -> None:
        """The final report.json, its figures drawn by the drawer (if any) before the page is rendered."""
        if self.ahead is None:
            return
        try:
            write_json(report, self.out)
        except OSError:  # write_report says so next, with what to do
            self.ahead.close()
            return
        self.ahead.finish()


# the experiments whose `steps` is the replay's length
REPLAYING = ("replay", "locate_nonfinite", "lr_search", "init_search")


def with_steps(book: Playbook, steps: Optional[int]) -> Playbook:
    """Override the length of every replay (`--steps`), validated like the playbook's own values."""
    if steps is None:
        return book
    params = dict(book.params)
    for node, p in book.params.items():
        if book.experiments[node] in REPLAYING:
            try:
                params[node] = type(p).model_validate({**p.model_dump(), "steps": steps})
            except pydantic.ValidationError as exc:
                raise TriageError(f"Expected --steps to be a valid replay length, found {steps} "
                                  f"({exc.errors()[0]['msg']}). Pass a number like 40.") from None
    return dataclasses.replace(book, params=params)


def _ceiling_seconds(max_minutes: Optional[float]) -> Optional[float]:
    if max_minutes is None:
        return None
    if isinstance(max_minutes, bool) or not isinstance(max_minutes, (int, float)) or not 0 < max_minutes < math.inf:
        raise TriageError(f"Expected --max-minutes to be a positive number of minutes, found {max_minutes!r}. "
                          "Pass a number like 30, or leave it out for no ceiling.")
    return float(max_minutes) * 60


def _absolute(path: Optional[Path]) -> Optional[Path]:
    """`path` against the folder triage was started in (None stays None)."""
    return Path.cwd() / Path(path) if path is not None else None


def _check_seed(seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise TriageError(f"Expected the seed to be a whole number from 0 to {2**32 - 1} (numpy's seeds are 32-bit), "
                          f"found {seed!r}. Pass a seed in that range, e.g. 0.")


# What a report folder holds: the previous run's, removed before this run's walk (report.json is rewritten
# after every experiment), so that a run killed half-way never leaves an older verdict looking current.
REPORT_FILES = ("report.html", "summary.md", "report.json")


def _retire_previous_report(out: Path) -> None:
    for name in REPORT_FILES:
        try:
            (out / name).unlink(missing_ok=True)
        except OSError as exc:
            raise TriageError(f"Expected to replace the previous report in --out '{out}', found '{name}' cannot be "
                              f"removed ({exc.strerror or exc}). Pass another --out, or remove it.") from None


def _writable_dir(out: Path, shown: Optional[Path] = None) -> Path:
    """Fail before the experiments, not after them, when the report cannot be written. `shown`: the path as
    the user gave it, for messages."""
    shown = shown or out
    if out.exists() and not out.is_dir():
        raise TriageError(f"Expected --out '{shown}' to be a folder (or not to exist yet), found a file there. "
                          "Pass a folder path; triage creates it.")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".triage-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise TriageError(f"Expected --out '{shown}' to be a folder triage can write, found it cannot "
                          f"({exc.strerror or exc}). Pass another folder.") from None
    return out


def default_out_dir() -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("reports") / stamp


def _command(entry, checkpoint, playbook, steps, seed, world_size: int = 1, max_minutes=None, race: bool = True) -> str:
    """The CLI command that reproduces this triage (torchrun's, in a distributed run)."""
    parts = ["run", "--entry", entry]
    if checkpoint:
        parts += ["--checkpoint", str(checkpoint)]
    if playbook:
        parts += ["--playbook", str(playbook)]
    if steps:
        parts += ["--steps", str(steps)]
    parts += ["--seed", str(seed)]
    if max_minutes is not None:
        parts += ["--max-minutes", f"{max_minutes:g}"]
    if not race:
        parts.append("--no-race")
    return launch_command(parts, world_size)
