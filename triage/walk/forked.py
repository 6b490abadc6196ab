"""Measuring a differential's candidates: one by one in the walk's process, or two at a time with a copy
of it made by fork() measuring some while the walk's process measures the others.

The copy has everything the walk built (the session, its snapshot, the figures measured once) at no
cost, measures each candidate it is sent exactly as the walk would (the experiment restores the snapshot,
RNG included, before it starts), and sends back its ExperimentRun and Outcome, pickled, through a pipe.
Both processes run torch on one thread while they share the candidates (an OpenMP pool does not survive
a fork, and a candidate's figures must not depend on which process took it), so the figures are those
of one at a time on one thread. Used only where a fork is safe and pays: Linux, a CPU run (a CUDA context
cannot cross a fork), one rank, two cores or more, torch on at most two threads (with more, one process
using them all is no slower). An experiment reads other nodes' outcomes through its parameters
(`against: restart`): the engine waits for those, and sends the copy what it lacks. A copy that dies, or
that has sent no answer and used no CPU for STUCK_S (waiting on a lock held across the fork, say), is
stopped, and the walk's process measures the rest: a slow candidate is never taken for a stuck one, and
whichever process measures it, its figures are the same.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Protocol

import torch

from triage.experiments.base import Abandoned
from triage.forks import POLL_S, STUCK_S, Forked
from triage.walk.stops import CeilingReached

log = logging.getLogger(__name__)


class Candidates(Protocol):
    """How the engine has its candidates measured: `submit` one (`done(run)` is called once it is
    recorded), `wait` until those named are recorded, `close` at the end of the differential. While the
    copy measures candidates that may outrank one, that one may be measured `ahead` here, unrecorded, and
    `adopt`ed once it is known to be wanted (`measuring`: which of those named are still being measured)."""

    def submit(self, cid: str, title: Optional[str], done: Callable[[Any], None]) -> None: ...
    def wait(self, ids: list[str]) -> None: ...
    def measuring(self, ids: list[str]) -> list[str]: ...
    def ahead(self, cid: str, outranked: Callable[[], bool]) -> Optional[tuple[Any, Any]]: ...
    def adopt(self, cid: str, title: Optional[str], measured: tuple[Any, Any], done: Callable[[Any], None]) -> None: ...
    def close(self) -> None: ...


class OneByOne:
    """Each candidate measured in the walk's process, at once."""

    def __init__(self, measure: Callable[[str, Optional[str]], Any]) -> None:
        self.measure = measure

    def submit(self, cid, title, done) -> None:
        done(self.measure(cid, title))

    def wait(self, ids) -> None:
        pass

    def measuring(self, ids) -> list[str]:
        return []  # each is measured at once

    def ahead(self, cid, outranked):
        raise RuntimeError("one by one, nothing is measuring while a candidate waits")

    def adopt(self, cid, title, measured, done):
        raise RuntimeError("one by one, nothing is measured ahead")

    def close(self) -> None:
        pass


class TwoAtOnce:
    """Each candidate sent to the forked copy when it is idle, else measured here; a result from the copy
    is recorded (and shown) between the candidates measured here. `measure(cid, title)` measures and
    records here; `measure_in_copy(cid, new_outcomes)` is what the copy runs; `record(run, outcome)` keeps
    a result the copy sent; `outcomes` is the walk's, read for what the copy lacks."""

    def __init__(self, measure, measure_in_copy, record, outcomes: dict[str, Any], listener,
                 experiments: dict[str, str], measure_ahead=None) -> None:
        self.measure, self.record, self.outcomes, self.listener, self.experiments = (
            measure, record, outcomes, listener, experiments)
        self.measure_ahead = measure_ahead  # (cid, abandon) -> (run, outcome), unrecorded
        self.known = set(outcomes)  # what the copy has: everything measured before it was made
        self.pending: dict[str, tuple[Optional[str], Callable]] = {}  # title, done
        self.orphans: list[str] = []  # pending candidates a lost copy owed, to measure here
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the copy inherits it
        try:
            self.copy: Optional[Forked] = Forked(measure_in_copy)
        except OSError:
            torch.set_num_threads(self.threads)
            raise

    def submit(self, cid, title, done) -> None:
        self._collect(block=False)
        self._measure_orphans()
        if self.copy is not None and self.copy.busy is None:
            new = {k: v for k, v in self.outcomes.items() if k not in self.known}
            try:
                self.copy.send(cid, new)
            except Exception as exc:  # noqa: BLE001  (it died, or an outcome would not pickle)
                self._lost(exc)
            else:
                self.known |= set(new)
                self.pending[cid] = (title, done)
                return
        done(self.measure(cid, title))

    def wait(self, ids) -> None:
        self._measure_orphans()
        while any(i in self.pending for i in ids):
            self._collect(block=True)
            self._measure_orphans()

    def measuring(self, ids) -> list[str]:
        return [i for i in ids if i in self.pending]

    def ahead(self, cid, outranked) -> Optional[tuple[Any, Any]]:
        """`cid` measured here while the copy measures what may outrank it, unrecorded; None where the copy's
        answer, looked at between its steps, outranked it (it stopped there). A ceiling met while recording
        the copy's answer stops it too, and is raised once it has stopped."""
        reached: list[Exception] = []

        def abandon() -> bool:
            try:
                self._collect(block=False)
            except CeilingReached as exc:  # (record() raises it) not inside the candidate measured here
                reached.append(exc)
            return bool(reached) or outranked()
        try:
            return self.measure_ahead(cid, abandon)
        except Abandoned:
            if reached:
                raise reached[0] from None
            return None

    def adopt(self, cid, title, measured, done) -> None:
        """A candidate measured `ahead`, recorded (and shown) as if measured now."""
        self.listener.started(cid, self.experiments[cid], title)
        self.record(*measured)
        done(measured[0])

    def _collect(self, block: bool) -> None:
        if self.copy is None or self.copy.busy is None:
            return
        cid = self.copy.busy
        title, done = self.pending[cid]
        while not self.copy.ready(POLL_S if block else 0):
            if not block:
                return
            if self.copy.stuck():  # a lock held across the fork, say
                self._lost(TimeoutError(f"no answer for '{cid}' and no CPU time used in {STUCK_S:.0f} s"), cid)
                return
        try:
            run, outcome = self.copy.receive()
        except Exception as exc:  # noqa: BLE001  (it died before it answered, or its answer is unreadable)
            self._lost(exc, cid)
            if block:
                self._measure_orphans()
            return
        del self.pending[cid]
        self.listener.started(cid, self.experiments[cid], title)
        self.record(run, outcome)
        self.known.add(cid)
        done(run)

    def _lost(self, exc: Exception, cid: Optional[str] = None) -> None:
        """The copy is gone; `cid`, the candidate it owed, is measured here, but never from inside another
        candidate's steps (TwoAtOnce.ahead looks at the copy there): at the next wait or submit."""
        log.warning("the forked copy measuring candidates ended (%s); measuring them here instead", exc)
        self.copy.close()
        self.copy = None
        if cid is not None:
            self.orphans.append(cid)

    def _measure_orphans(self) -> None:
        while self.orphans:
            cid = self.orphans.pop(0)
            title, done = self.pending.pop(cid)
            done(self.measure(cid, title))

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None
        torch.set_num_threads(self.threads)
