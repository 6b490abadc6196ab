"""`triage.run`: the main job as a function (the CLI is a thin layer over it)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import shlex
from pathlib import Path
from typing import Optional, Union

import pydantic

from triage.distributed.ranks import DEFAULT_RANK_TIMEOUT_S, joined
from triage.distributed.session import open_on_every_rank
from triage.engine import Listener, walk
from triage.entry import SetupFactory, entry_name
from triage.errors import TriageError
from triage.playbook import Playbook, load_playbook
from triage.report import Report, write_report
from triage.report.build import build_report
from triage.session import open_session


def run(entry: Union[str, SetupFactory], checkpoint: Optional[Path] = None, *, out: Optional[Path] = None,
        playbook: Optional[Path] = None, steps: Optional[int] = None, seed: int = 0,
        history: Optional[Path] = None, trust_checkpoint: bool = False,
        history_loss: Optional[str] = None, history_val: Optional[str] = None,
        listener: Optional[Listener] = None, command: Optional[str] = None,
        rank_timeout: float = DEFAULT_RANK_TIMEOUT_S) -> tuple[Report, dict[str, Path]]:
    """Triage one run: load, walk the playbook, write the report. Returns it and the files written.

    `entry` is a spec like "mymod:setup" (as `--entry`) or the setup function itself (or a LightningModule
    class, or a function returning a LightningModule or a transformers.Trainer).
    `history_loss` / `history_val` name the loss columns or tags of `history` when they have other names.

    Under torchrun (or inside a torch.distributed process group) every rank calls this: each opens its own
    session and the walk runs in lockstep; rank 0 alone writes the report (the other ranks get no files).
    `rank_timeout` bounds how long a rank may stay silent in a collective before the walk stops naming it.
    """
    book = with_steps(load_playbook(playbook), steps)  # validate the playbook before anything runs
    with joined(rank_timeout) as ranks:  # under torchrun: the process group, up before setup() runs
        session = open_on_every_rank(ranks, lambda: open_session(
            entry, checkpoint, seed=seed, history_path=history, trust_checkpoint=trust_checkpoint,
            history_keys=(history_loss, history_val)))
        out = Path(out) if out else default_out_dir()
        if ranks.writes_report:
            out = _writable_dir(out)
        result = walk(session, book, listener)
        name = entry if isinstance(entry, str) else entry_name(entry)
        report = build_report(result, session, book, command or _command(name, checkpoint, playbook, steps, seed),
                              str(checkpoint) if checkpoint else None)
        writes = ranks.rank == min(set(range(ranks.world_size)) - set(result.silent_ranks))
        return report, write_report(report, _writable_dir(out)) if writes else {}


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


def _writable_dir(out: Path) -> Path:
    """Fail before the experiments, not after them, when the report cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".triage-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise TriageError(f"Expected --out '{out}' to be a folder triage can write, found it cannot "
                          f"({exc.strerror or exc}). Pass another folder.") from None
    return out


def default_out_dir() -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path("reports") / stamp


def _command(entry, checkpoint, playbook, steps, seed) -> str:
    parts = ["triage", "run", "--entry", entry]
    if checkpoint:
        parts += ["--checkpoint", str(checkpoint)]
    if playbook:
        parts += ["--playbook", str(playbook)]
    if steps:
        parts += ["--steps", str(steps)]
    parts += ["--seed", str(seed)]
    return shlex.join(parts)
