"""The ranks of a distributed run as triage sees them: which one this process is, and the few
collectives the walk needs to keep every rank on the same branch.

A single process is a world of one (`Ranks`): every collective returns its own input, so the engine and
the experiments run the same code with and without torch.distributed.

Under torchrun, `joined()` starts the process group before setup() runs and opens two gloo groups of
triage's own, apart from the run's, so that DDP's or FSDP's collectives never interleave with triage's:

- `steps`: agreement inside an experiment (a replay's per-step figures, the --max-minutes ceiling), with the
  rank timeout T: a rank that raised or hangs leaves the others waiting at most T here;
- `settle`: the end of each experiment (every rank's outcome, triage/walk/settle.py), with a
  timeout of 2T, so that a rank left waiting T in a `steps` or a DDP collective still meets the others.

The store (the process group's key-value store, over TCP) carries what must get through when a
collective cannot: which rank raised, with its traceback, and which ranks finished an experiment.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import pickle
import re
from typing import Any, Iterator, Optional, Sequence

import torch

from triage.load import DEFAULT_RANK_TIMEOUT_S

log = logging.getLogger(__name__)

# What a collective's error looks like when a peer raised or hangs (gloo, NCCL, the store).
_COLLECTIVE_FAILURE = re.compile(
    r"Timed out waiting|Connection closed by peer|Connection reset by peer|DistBackendError|DistNetworkError|"
    r"NCCL (error|communicator)|Socket Timeout|wait timeout|Broken pipe|ProcessGroupNCCL", re.IGNORECASE)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class Ranks:
    """A world of one: this process alone. The distributed subclass overrides every collective."""

    rank = 0
    local_rank = 0
    world_size = 1
    backend: Optional[str] = None
    timeout_s = DEFAULT_RANK_TIMEOUT_S

    @property
    def distributed(self) -> bool:
        """True under a process group (even a world of one started by torchrun)."""
        return False

    @property
    def writes_report(self) -> bool:
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (any picklable object), in rank order."""
        return [value]

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        """Every rank's few numbers, in rank order (a tensor all_gather: cheap enough for every step)."""
        return [[float(v) for v in values]]

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on some rank."""
        return bool(flag)

    def all(self, flag: bool) -> bool:
        return not self.any(not flag)

    def mean(self, value: float) -> float:
        """The mean over ranks (NaN or Inf on any rank makes it non-finite)."""
        rows = self.gather_floats([value])
        return sum(r[0] for r in rows) / len(rows)

    def spread(self, tensor: torch.Tensor) -> float:
        """max over elements of (max over ranks - min over ranks): 0.0 when every rank holds the same."""
        return 0.0

    # the store: a side channel that works when collectives do not
    def post(self, key: str, value: Any) -> None:
        pass

    def read(self, key: str) -> Optional[Any]:
        return None


class GroupRanks(Ranks):
    """This process as one rank of a torch.distributed process group."""

    def __init__(self, timeout_s: float) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.backend = str(dist.get_backend())
        self.timeout_s = timeout_s
        # Collective: every rank opens the same groups in the same order.
        self.steps = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout_s))
        self.settle_group = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=2 * timeout_s))
        self.store = dist.distributed_c10d._get_default_store()
        self.world_group = dist.group.WORLD  # the process group these were opened in
        self.walks = 0  # walks started in this group: a prefix for the store's keys, the same on every rank

    @property
    def distributed(self) -> bool:
        return True

    def gather(self, value: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, value, group=self.steps)
        return out

    def gather_floats(self, values: Sequence[float]) -> list[list[float]]:
        mine = torch.tensor([float(v) for v in values], dtype=torch.float64)
        out = [torch.empty_like(mine) for _ in range(self.world_size)]
        self._dist.all_gather(out, mine, group=self.steps)
        return [row.tolist() for row in out]

    def any(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.steps)
        return bool(t.item())

    def spread(self, tensor: torch.Tensor) -> float:
        local = _local(tensor).detach().to("cpu", torch.float64).contiguous()
        high, low = local.clone(), local.clone()
        self._dist.all_reduce(high, op=self._dist.ReduceOp.MAX, group=self.steps)
        self._dist.all_reduce(low, op=self._dist.ReduceOp.MIN, group=self.steps)
        return float((high - low).max().item()) if local.numel() else 0.0

    def gather_settled(self, value: Any) -> list[Any]:
        """`gather` on the settle group (its longer timeout): the end-of-experiment exchange."""
        out: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(out, value, group=self.settle_group)
        return out

    def post(self, key: str, value: Any) -> None:
        self.store.set(f"triage/{self.walks}/{key}", pickle.dumps(value))

    def read(self, key: str) -> Optional[Any]:
        full = f"triage/{self.walks}/{key}"
        if not self.store.check([full]):
            return None
        return pickle.loads(self.store.get(full))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


_current: Ranks = Ranks()
_opened: Optional[GroupRanks] = None  # triage's groups in the current process group, kept across walks


def current() -> Ranks:
    """The ranks of the walk in progress (a world of one outside `joined()`)."""
    return _current


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def default_backend() -> str:
    import torch.distributed as dist

    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


@contextlib.contextmanager
def joined(timeout_s: float = DEFAULT_RANK_TIMEOUT_S, backend: Optional[str] = None) -> Iterator[Ranks]:
    """The ranks of this process for one triage: a world of one, or a rank of the process group.

    The group is the caller's when one is up (the Python API inside a distributed program); under
    torchrun without one, triage starts it here (before setup() runs) with `timeout_s` on every
    collective, and ends it afterwards.
    """
    global _current, _opened
    import torch.distributed as dist

    started = False
    if not dist.is_available() or (not dist.is_initialized() and not launched_by_torchrun()):
        yield _current
        return
    if not dist.is_initialized():
        chosen = backend or default_backend()
        if chosen == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(chosen, timeout=dt.timedelta(seconds=timeout_s))
        started = True
    if _opened is None or _opened.world_group is not dist.group.WORLD:
        _opened = GroupRanks(timeout_s)
    ranks = _opened
    ranks.walks += 1
    previous, _current = _current, ranks
    clean = False
    try:
        yield ranks
        clean = True
    finally:
        _current = previous
        # After a rank failed the groups may be stuck mid-collective: leave them to the process's exit.
        if started and clean:
            _opened = None
            dist.destroy_process_group()


def is_collective_failure(error: Optional[str]) -> bool:
    return bool(error) and bool(_COLLECTIVE_FAILURE.search(error))
