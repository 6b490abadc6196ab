"""Opening the session on every rank: setup() called after the process group is up, the checkpoint
loaded on each rank, each rank's own data snapshot, then the snapshots cut to the same length (every
experiment runs the same number of steps on every rank, in lockstep).

A rank that cannot open its session (its setup() raised, its checkpoint is missing) makes every rank
stop with that rank's message, within the rank timeout, rather than leaving the others waiting in
setup()'s collectives (DDP's broadcast, FSDP's init) for ever.
"""

from __future__ import annotations

import logging
from typing import Callable

from triage.errors import TriageError
from triage.load.ranks import Ranks, is_collective_failure
from triage.load.session import Session

log = logging.getLogger(__name__)


def open_on_every_rank(ranks: Ranks, open_session: Callable[[], Session]) -> Session:
    """`open_session()` on this rank; in a distributed run, its failure is posted for the other ranks."""
    if not ranks.distributed:
        return open_session()
    try:
        session = open_session()
    except TriageError as exc:
        ranks.post(f"open/{ranks.rank}", f"{type(exc).__name__}: {exc}")
        raise
    except Exception as exc:  # a collective inside setup() gave up: was a peer the cause?
        ranks.post(f"open/{ranks.rank}", f"{type(exc).__name__}: {exc}")
        raise _peer_failure(ranks) or exc
    try:
        _align(ranks, session)
    except Exception as exc:
        if not is_collective_failure(str(exc)):
            raise
        raise _peer_failure(ranks) or exc
    return session


def _peer_failure(ranks: Ranks) -> TriageError | None:
    for rank in range(ranks.world_size):
        message = ranks.read(f"open/{rank}") if rank != ranks.rank else None
        if message is not None:
            return TriageError(f"Expected every rank to open its session, found rank {rank} could not:\n{message}")
    return None


def _align(ranks: Ranks, session: Session) -> None:
    """Every rank keeps as many snapshot batches as the rank with the fewest (a DistributedSampler pads
    its shards to the same length; lists of unequal length are cut, with a warning)."""
    counts = ranks.gather_floats([len(session.batches), len(session.val_batches)])
    train, val = (int(min(c[i] for c in counts)) for i in (0, 1))
    if train == 0:
        empty = [r for r, c in enumerate(counts) if c[0] == 0]
        raise TriageError(f"Expected every rank's Setup.batches to hold at least one batch, found none on rank "
                          f"{empty[0]}. Give each rank its shard of the failing run's data.")
    if train < len(session.batches) or val < len(session.val_batches):
        log.warning("rank %d: keeping %d of %d batches (and %d of %d validation batches), as many as the "
                    "rank with the fewest", ranks.rank, train, len(session.batches), val, len(session.val_batches))
    session.batches = session.batches[:train]
    session.val_batches = session.val_batches[:val]
