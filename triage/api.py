"""`triage.run`: the main job as a function (the CLI is a thin layer over it)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import shlex
from pathlib import Path
from typing import Optional

from triage.engine import Listener, walk
from triage.playbook import Playbook, load_playbook
from triage.report import Report, write_report
from triage.report.build import build_report
from triage.session import open_session


def run(entry: str, checkpoint: Optional[Path] = None, *, out: Optional[Path] = None,
        playbook: Optional[Path] = None, steps: Optional[int] = None, seed: int = 0,
        history: Optional[Path] = None, trust_checkpoint: bool = False,
        listener: Optional[Listener] = None, command: Optional[str] = None) -> tuple[Report, dict[str, Path]]:
    """Triage one run: load, walk the playbook, write the report. Returns it and the files written."""
    book = with_steps(load_playbook(playbook), steps)  # validate the playbook before anything runs
    session = open_session(entry, checkpoint, seed=seed, history_path=history, trust_checkpoint=trust_checkpoint)
    result = walk(session, book, listener)
    report = build_report(result, session, book, command or _command(entry, checkpoint, playbook, steps, seed),
                          str(checkpoint) if checkpoint else None)
    return report, write_report(report, Path(out) if out else default_out_dir())


def with_steps(book: Playbook, steps: Optional[int]) -> Playbook:
    """Override the length of every experiment that has a `steps` parameter."""
    if steps is None:
        return book
    params = {node: p.model_copy(update={"steps": steps}) if "steps" in type(p).model_fields else p
              for node, p in book.params.items()}
    return dataclasses.replace(book, params=params)


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
