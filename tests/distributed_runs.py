"""Running code on the ranks of a gloo process group on CPU, as torchrun runs triage: one process per rank,
forked from the test (torch is imported once), each with torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so that triage starts the process group itself as under torchrun.

`on_ranks(fn, ...)` returns what each rank's `fn` returned (or the traceback it raised, or None for a
rank that was still running when the others were done and was stopped)."""

from __future__ import annotations

import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.multiprocessing as mp

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "distributed"


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error: Optional[str] = None  # the traceback, when fn raised
    finished: bool = True  # False: still running when the others were done (it was stopped)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def on_ranks(fn: Callable[..., Any], *args: Any, world: int = 2, timeout_s: float = 180.0,
             grace_s: float = 20.0) -> list[RankResult]:
    """Run fn(*args) on `world` ranks; wait for them (rank 0 at most `timeout_s`, the others `grace_s` more)."""
    port = free_port()
    context = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        procs = [context.Process(target=_rank_main, args=(rank, world, port, tmp, fn, args)) for rank in range(world)]
        for p in procs:
            p.start()
        procs[0].join(timeout_s)
        deadline = time.monotonic() + grace_s
        for p in procs[1:]:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():  # a rank made to hang: the processes this function started are stopped
                p.kill()
                p.join()
        return [_result(Path(tmp), rank) for rank in range(world)]


def _result(tmp: Path, rank: int) -> RankResult:
    path = tmp / f"{rank}.pkl"
    if not path.exists():
        return RankResult(rank, finished=False)
    kind, payload = pickle.loads(path.read_bytes())
    return RankResult(rank, value=payload) if kind == "ok" else RankResult(rank, error=payload)


def _rank_main(rank: int, world: int, port: int, tmp: str, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    try:
        result = ("ok", fn(*args))
    except BaseException:  # noqa: BLE001 - reported to the test, which asserts on it
        result = ("error", traceback.format_exc())
    (Path(tmp) / f"{rank}.pkl").write_bytes(pickle.dumps(result))
