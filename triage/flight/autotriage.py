"""Triage a capture from the training process itself, opt-in (`triage_on_capture=`).

After the recorder writes a capture, it starts `triage watch ROOT --once --only CAPTURE` in a detached,
low-priority process (its own session: it outlives the training process). That is the same sidecar
`triage watch` runs, so the report lands where the watcher would put it, a watcher running beside the
run never triages the capture a second time, and `then` gets the same environment.

Nothing happens before a capture: a healthy run pays nothing. `when="exit"` (the default) starts the
triage when the training process exits, once it has released its memory and accelerator; `when="now"`
starts it at once, beside the run (use it with `device=` naming a spare accelerator, or on a CPU run
that stops at the capture). Distributed: only rank 0 launches; the other ranks log that it does.
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from triage.errors import TriageError
from triage.flight.places import LAUNCH_LOG, report_dir

log = logging.getLogger("triage.recorder")


class AutoTriage(BaseModel):
    """How the training process triages its own capture."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    when: Literal["exit", "now"] = Field(
        default="exit", description="exit: when the training process exits (it has released its memory and "
        "device); now: at once, beside the run.")
    entry: Optional[str] = Field(default=None, description="The --entry that rebuilds the run (default: the "
                                                           "recorder's).")
    out: Optional[Path] = Field(default=None, description="Folder for the reports (default: the captures "
                                                          "folder's sibling, captures-reports/).")
    then: Optional[str] = Field(default=None, description="A shell command run after the report is written "
                                                          "(see `triage watch --then`).")
    threads: Optional[int] = Field(default=None, ge=1, description="CPU threads the triage may use.")
    device: Optional[str] = Field(default=None, description="The accelerator the triage may see (a CUDA "
                                                            "index), or 'cpu' to hide them all.")
    nice: int = Field(default=10, ge=0, le=19, description="How much lower the triage's priority is.")


OnCapture = Union[bool, str, AutoTriage, None]


def auto_triage(setting: OnCapture, entry: Optional[str]) -> Optional[AutoTriage]:
    """The recorder's `triage_on_capture`: False/None (off), True, an entry string, or an AutoTriage.
    `entry` is the recorder's own; a triage needs one of the two."""
    if setting is None or setting is False:
        return None
    if setting is True:
        chosen = AutoTriage()
    elif isinstance(setting, str):
        chosen = AutoTriage(entry=setting)
    elif isinstance(setting, AutoTriage):
        chosen = setting
    else:
        raise TriageError(f"Expected triage_on_capture to be True, an entry string or triage.AutoTriage, found "
                          f"{type(setting).__name__}. Pass one of those.")
    if not (chosen.entry or entry):
        raise TriageError("Expected an entry for triage_on_capture (the setup() that rebuilds this run, as "
                          "'mymod:setup'), found none. Pass entry= to the recorder, or triage_on_capture='mymod:setup'.")
    return chosen


def watch_argv(capture: Path, entry: Optional[str], setting: AutoTriage) -> list[str]:
    """`triage watch` for this one capture, as the detached process runs it."""
    capture = Path(capture).absolute()
    argv = [sys.executable, "-m", "triage", "watch", str(capture.parent), "--once", "--only", capture.name,
            "--nice", str(setting.nice)]  # the watcher nices its triage; nothing runs in the training process
    if entry:
        argv += ["--entry", entry]
    if setting.out is not None:
        argv += ["--out", str(Path(setting.out).absolute())]
    if setting.then:
        argv += ["--then", setting.then]
    if setting.threads:
        argv += ["--threads", str(setting.threads)]
    if setting.device:
        argv += ["--device", setting.device]
    return argv


def launch(capture: Path, entry: Optional[str], setting: AutoTriage, rank: Optional[int]) -> None:
    """Start (or, for when="exit", arrange) the detached triage of `capture`. Never raises: the training
    run goes on whatever happens here."""
    if rank not in (None, 0):
        log.warning("triage: rank %d captured %s; rank 0 starts the triage of this failure", rank, capture)
        return
    argv = watch_argv(capture, entry, setting)
    if setting.when == "now":
        _start(argv, capture, setting.out)
    else:
        atexit.register(_start, argv, capture, setting.out)
        log.warning("triage: the triage of %s starts when this process exits", capture)


def _start(argv: list[str], capture: Path, reports: Optional[Path] = None) -> None:
    log_path = report_dir(Path(capture).absolute(), reports) / LAUNCH_LOG  # not in captures/: a glob would find it
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            # no preexec_fn: it would run in the (multi-threaded) training process between fork and exec
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=os.getcwd())
    except OSError as exc:
        log.error("triage: could not start the triage of %s (%s); run it by hand: %s", capture,
                  exc.strerror or exc, shlex.join(argv[2:]))
        return
    log.warning("triage: triaging %s in process %d (log: %s)", capture, process.pid, log_path)
