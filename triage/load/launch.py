"""Launching triage on every rank with torchrun, and what a distributed run's report says about it.

    torchrun --nproc-per-node N -m triage run --checkpoint CKPT --entry mymod:setup
    triage run --nproc-per-node N --checkpoint CKPT --entry mymod:setup      # the same, torchrun started here

The shorthand runs torchrun itself (`torch.distributed.run`, standalone rendezvous on this machine) with
the same arguments, less `--nproc-per-node`. Its exit code is the ranks' own: 2 for bad input on any
rank, 3 when the walk stopped because a rank raised or stopped responding, else torchrun's.
"""

from __future__ import annotations

import os
import shlex
from typing import Optional

from triage.load.ranks import Ranks, launched_by_torchrun

EXIT_STOPPED = 3  # a distributed walk stopped before a leaf: rank 0 wrote the report with what was measured

_NEEDS_GROUP = ("process group has not been initialized", "env:// rendezvous", "init_process_group",
                "Default process group", "expected, but not set")


def without_nproc(argv: list[str]) -> list[str]:
    """The command's arguments less `--nproc-per-node N` (each rank runs the rest)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            out.append(arg)
    return out


def launch(nproc_per_node: int, argv: list[str]) -> int:
    """Run `triage <argv>` on `nproc_per_node` ranks under torchrun; returns the exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run as torchrun

    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc_per_node}", "-m", "triage", *without_nproc(argv)])
    try:
        torchrun(args)
    except ChildFailedError as exc:
        codes = {failure.exitcode for failure in exc.failures.values()}
        return 2 if 2 in codes else EXIT_STOPPED if EXIT_STOPPED in codes else 1
    return 0


def launch_command(argv: list[str], world_size: int = 1) -> str:
    """How this rank was launched, as a command to reproduce the triage: torchrun with the run's shape
    (under torchrun, or in a process group of `world_size` ranks started some other way), else triage."""
    if not launched_by_torchrun() and world_size <= 1:
        return shlex.join(["triage", *argv])
    world = int(os.environ.get("WORLD_SIZE", world_size))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(1, world // max(per_node, 1))
    shape = ["--nnodes", str(nodes)] if nodes > 1 else []
    return shlex.join(["torchrun", *shape, "--nproc-per-node", str(per_node), "-m", "triage", *argv])


def needs_process_group(exc: BaseException, ranks: Ranks) -> Optional[str]:
    """The message for a setup() that needs a process group triage was not started with (else None)."""
    text = f"{type(exc).__name__}: {exc}"
    if ranks.distributed or not any(marker in text for marker in _NEEDS_GROUP):
        return None
    return (f"Expected setup() to run on its own, found it needs a torch.distributed process group and triage "
            f"was started as a single process ({text.splitlines()[0][:200]}). Launch triage on every rank: "
            "`torchrun --nproc-per-node N -m triage run --checkpoint CKPT --entry ...`, or the shorthand "
            "`triage run --nproc-per-node N ...`; triage starts the process group before it calls setup(), "
            "so setup() must not call init_process_group itself (or only when dist.is_initialized() is False).")


def started_twice(exc: BaseException) -> Optional[str]:
    """The message for a setup() that starts the process group triage already started."""
    if "initialize the default process group twice" not in str(exc):
        return None
    return ("Expected setup() to use the process group triage started (under torchrun triage calls "
            "init_process_group before setup()), found setup() calls init_process_group again. Guard it: "
            "`if not dist.is_initialized(): dist.init_process_group(...)`.")
