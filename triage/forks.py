"""A copy of this process made by fork(), that measures what it is sent and sends back the result.

The copy has everything this process built (the session, its snapshot, the figures measured once) at no
cost, measures what it is sent exactly as this process would, and sends back its answer, pickled, through a
pipe. It runs torch on one thread (an OpenMP pool does not survive a fork). Used only where a fork is safe
and pays: Linux, a CPU run (a CUDA context cannot cross a fork), one rank, two cores or more, torch on at
most two threads, and a training state small enough to double (`can_fork`). A copy that dies, or that has sent
no answer and used no CPU for STUCK_S (waiting on a lock held across the fork, say), is stopped by whoever
waits on it, and the work is done here instead: the figures are the same whichever process measures them.
Its users: the walk's candidates two at a time (walk/forked.py), and a reference replayed alongside the fix
that needs it (experiments/alongside.py).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
import time
import weakref
from typing import Any, Callable, Optional

import torch

_HEADER = struct.Struct(">Q")  # each message: its length, then the pickle
STUCK_S = 120.0  # no answer and no CPU time used for this long: the copy waits on something that never comes
POLL_S = 5.0  # how often a wait for the copy looks at its CPU time


# The copy trains its own copy of the model and optimizer state (every page a replay writes is copied): past
# this much state the memory it doubles costs more than the time it saves (issue 26: peak memory within 2x
# the checkpoint at every size), and the work is done in this process.
MAX_FORKED_STATE_BYTES = 256 * 2**20


# The copies this process made that may owe an answer, and whether this process is itself a copy: what
# busy_elsewhere() reads.
_LIVE: "weakref.WeakSet[Forked]" = weakref.WeakSet()
_IN_COPY = False


def is_copy() -> bool:
    """Whether this process is a copy measuring for the process that forked it."""
    return _IN_COPY


def busy_elsewhere(but: Optional["Forked"] = None) -> bool:
    """Whether another process of this walk is measuring now: this process is a copy measuring for the walk,
    or a copy it made (other than `but`) owes an answer it has not sent yet. Work measured ahead of time
    (experiments/lanes.py) pays only on a core nothing else uses."""
    return _IN_COPY or any(c is not but and c.busy is not None and not c.ready(0) for c in list(_LIVE))


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
    """The copy: `send(run_id, outcomes)` one job at a time, `receive()` its answer; `close()` ends it.
    `run_one(run_id, outcomes)` is what the copy calls for each job, and its return value the answer."""

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
        except OSError:  # no fork (a process or memory limit): this process does the work
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
        self.busy: Optional[str] = None  # the job it is on
        self._cpu: Optional[int] = None  # its CPU time (clock ticks) when last looked at, and when it last grew
        self._active = time.monotonic()
        _LIVE.add(self)

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
        """The busy job's answer; raises EOFError where the copy died before it answered."""
        message = _read(self._in)
        if message is None:
            raise EOFError(f"the forked process measuring '{self.busy}' ended without an answer")
        self.busy = None
        return message

    def close(self) -> None:
        _LIVE.discard(self)
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)  # it may be mid-job: its answer is not wanted
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def _serve(run_one, inbox: int, outbox: int) -> None:
    global _IN_COPY
    _IN_COPY = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it closes this copy
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
