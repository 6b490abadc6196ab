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
import os
import pickle
import select
import signal
import struct
import sys
import time
from typing import Any, Callable, Optional, Protocol

import torch

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">Q")  # each message: its length, then the pickle
STUCK_S = 120.0  # no answer and no CPU time used for this long: the copy waits on something that never comes
_POLL_S = 5.0  # how often a wait for the copy looks at its CPU time


# The copy trains its own copy of the model and optimizer state (every page a replay writes is copied): past
# this much state the memory it doubles costs more than the time it saves (issue 26: peak memory within 2x
# the checkpoint at every size), and the candidates are measured one by one.
MAX_FORKED_STATE_BYTES = 256 * 2**20


def can_fork(device: torch.device, world_size: int, state_bytes: int = 0) -> bool:
    return (sys.platform.startswith("linux") and device.type == "cpu" and world_size == 1
            and not torch.cuda.is_initialized() and len(os.sched_getaffinity(0)) >= 2
            and torch.get_num_threads() <= 2 and state_bytes <= MAX_FORKED_STATE_BYTES)


def training_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The bytes a replay writes at every step: the weights, their gradients and the optimizer's state."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(v.numel() * v.element_size() for one in getattr(optimizer, "optimizers", {"": optimizer}).values()
                for per_param in one.state.values() for v in per_param.values() if isinstance(v, torch.Tensor))
    return 2 * weights + state


class Forked:
    """The copy: `send(run_id, outcomes)` one candidate at a time, `receive()` its (run, outcome);
    `close()` ends it. `run_one(run_id, outcomes)` is what the copy calls for each candidate."""

    def __init__(self, run_one: Callable[[str, dict[str, Any]], tuple[Any, Any]]) -> None:
        to_child, from_parent = os.pipe()[::-1]
        to_parent, from_child = os.pipe()[::-1]
        sys.stdout.flush()
        sys.stderr.flush()
        walk, code = os.getpid(), 1
        try:
            pid = os.fork()
            if pid == 0:
                os.close(to_child)
                os.close(from_child)
                _serve(run_one, from_parent, to_parent)
                code = 0
        except OSError:  # no fork (a process or memory limit): the walk measures every candidate
            if os.getpid() == walk:  # (in the copy, the `finally` ends it whatever the error)
                for fd in (to_child, from_parent, to_parent, from_child):
                    os.close(fd)
            raise
        finally:
            if os.getpid() != walk:  # the copy, however it got here (a Ctrl-C included): never returns
                os._exit(code)
        os.close(from_parent)
        os.close(to_parent)
        self.pid, self._out, self._in = pid, to_child, from_child
        self.busy: Optional[str] = None  # the candidate it is measuring
        self._cpu: Optional[int] = None  # its CPU time (clock ticks) when last looked at, and when it last grew
        self._active = time.monotonic()

    def send(self, run_id: str, outcomes: dict[str, Any]) -> None:
        _write(self._out, (run_id, outcomes))
        self.busy = run_id
        self._cpu, self._active = _cpu_ticks(self.pid), time.monotonic()

    def stuck(self) -> bool:
        """No CPU time used for STUCK_S while it owes an answer (call it between waits)."""
        cpu, now = _cpu_ticks(self.pid), time.monotonic()
        if cpu != self._cpu:
            self._cpu, self._active = cpu, now
        return now - self._active > STUCK_S

    def ready(self, timeout: float) -> bool:
        """Its answer has arrived (or it ended), waiting up to `timeout` seconds."""
        return bool(select.select([self._in], [], [], timeout)[0])

    def receive(self) -> tuple[Any, Any]:
        """The busy candidate's (run, outcome); raises EOFError where the copy died before it answered."""
        message = _read(self._in)
        if message is None:
            raise EOFError(f"the forked process measuring '{self.busy}' ended without an answer")
        self.busy = None
        return message

    def close(self) -> None:
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)  # it may be mid-candidate: its result is not wanted
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


class Candidates(Protocol):
    """How the engine has its candidates measured: `submit` one (`done(run)` is called once it is
    recorded), `wait` until those named are recorded, `close` at the end of the differential."""

    def submit(self, cid: str, title: Optional[str], done: Callable[[Any], None]) -> None: ...
    def wait(self, ids: list[str]) -> None: ...
    def close(self) -> None: ...


class OneByOne:
    """Each candidate measured in the walk's process, at once."""

    def __init__(self, measure: Callable[[str, Optional[str]], Any]) -> None:
        self.measure = measure

    def submit(self, cid, title, done) -> None:
        done(self.measure(cid, title))

    def wait(self, ids) -> None:
        pass

    def close(self) -> None:
        pass


class TwoAtOnce:
    """Each candidate sent to the forked copy when it is idle, else measured here; a result from the copy
    is recorded (and shown) between the candidates measured here. `measure(cid, title)` measures and
    records here; `measure_in_copy(cid, new_outcomes)` is what the copy runs; `record(run, outcome)` keeps
    a result the copy sent; `outcomes` is the walk's, read for what the copy lacks."""

    def __init__(self, measure, measure_in_copy, record, outcomes: dict[str, Any], listener,
                 experiments: dict[str, str]) -> None:
        self.measure, self.record, self.outcomes, self.listener, self.experiments = (
            measure, record, outcomes, listener, experiments)
        self.known = set(outcomes)  # what the copy has: everything measured before it was made
        self.pending: dict[str, tuple[Optional[str], Callable]] = {}  # title, done
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the copy inherits it
        try:
            self.copy: Optional[Forked] = Forked(measure_in_copy)
        except OSError:
            torch.set_num_threads(self.threads)
            raise

    def submit(self, cid, title, done) -> None:
        self._collect(block=False)
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
        while any(i in self.pending for i in ids):
            self._collect(block=True)

    def _collect(self, block: bool) -> None:
        if self.copy is None or self.copy.busy is None:
            return
        cid = self.copy.busy
        title, done = self.pending[cid]
        while not self.copy.ready(_POLL_S if block else 0):
            if not block:
                return
            if self.copy.stuck():  # a lock held across the fork, say
                del self.pending[cid]
                self._lost(TimeoutError(f"no answer for '{cid}' and no CPU time used in {STUCK_S:.0f} s"))
                done(self.measure(cid, title))
                return
        del self.pending[cid]
        try:
            run, outcome = self.copy.receive()
        except Exception as exc:  # noqa: BLE001  (it died before it answered, or its answer is unreadable)
            self._lost(exc)
            done(self.measure(cid, title))
            return
        self.listener.started(cid, self.experiments[cid], title)
        self.record(run, outcome)
        self.known.add(cid)
        done(run)

    def _lost(self, exc: Exception) -> None:
        log.warning("the forked copy measuring candidates ended (%s); measuring them here instead", exc)
        self.copy.close()
        self.copy = None

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None
        torch.set_num_threads(self.threads)


def _serve(run_one, inbox: int, outbox: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the walk's: it closes this copy
    torch.set_num_threads(1)
    while (message := _read(inbox)) is not None:
        run_id, outcomes = message
        _write(outbox, run_one(run_id, outcomes))


def _cpu_ticks(pid: int) -> Optional[int]:
    """User + system CPU time of a process, in clock ticks (/proc/PID/stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def _write(fd: int, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd: int) -> Any:
    """The next message, or None at end of file."""
    header = _exactly(fd, _HEADER.size)
    if header is None:
        return None
    data = _exactly(fd, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _exactly(fd: int, n: int) -> Optional[bytes]:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
