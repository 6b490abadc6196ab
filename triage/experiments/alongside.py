"""The run replayed alongside a fix that may outgrow it. A fix that goes on past the length of the run it is
paired with (`extend_to`) is judged against the run replayed as long; measured after the fix, that replay
adds its whole length to the wait. Measured alongside, it costs none of it: a copy of this process, forked
at the fix's start (the snapshot restored, nothing applied yet), waits; the moment the fix decides to go
on, the copy replays the run over the fix's longer window while the fix trains, and hands its outcome over
when the fix ends.

Part of the speed machinery (Speedups.fork, triage/speedups.py): it changes seconds, never a figure. The copy
replays exactly as this process would (the same restore, the same steps, torch on one thread, as here:
it is used only where this process runs on one thread). Where a fork is not safe or pays nothing (see
triage/forks.can_fork), or the copy fails, this process replays the run itself, after the fix.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

from triage.forks import POLL_S, Forked, can_fork, training_state_bytes
from triage.load.ranks import current as current_ranks
from triage.load.session import Session
from triage.speedups import active

log = logging.getLogger(__name__)


class Alongside:
    """A forked copy holding one replay for `key`: `start()` it, then `result()` (None where the copy failed:
    the caller replays it itself), or `close()` it unused."""

    def __init__(self, key: str, copy: Forked) -> None:
        self.key, self.copy, self.started = key, copy, False

    def start(self) -> None:
        try:
            self.copy.send(self.key, {})
            self.started = True
        except OSError as exc:
            log.warning("the copy that would replay '%s' alongside is gone (%s); it is replayed after", self.key, exc)
            self.close()

    def result(self) -> Optional[Any]:
        if not self.started:
            return None
        try:
            while not self.copy.ready(POLL_S):
                if self.copy.stuck():
                    raise TimeoutError("no answer and no CPU time used")
            return self.copy.receive()
        except Exception as exc:  # noqa: BLE001  (it died, was stuck, or its answer is unreadable)
            log.warning("the copy replaying '%s' alongside failed (%s); it is replayed here instead", self.key, exc)
            return None
        finally:
            self.close()

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None
        self.started = False


def ready_alongside(session: Session, key: str, replay: Callable[[], Any]) -> Optional[Alongside]:
    """A copy forked now, that will run `replay()` once started; None where the speed machinery is off, a
    fork is not safe, this process runs torch on more than one thread, or `key` is measured already."""
    if (not active().fork or key in session.memo or torch.get_num_threads() != 1
            or not can_fork(session.device, current_ranks().world_size,
                            training_state_bytes(session.setup.model, session.setup.optimizer))):
        return None
    try:
        return Alongside(key, Forked(lambda run_id, outcomes: replay()))
    except OSError:
        return None
