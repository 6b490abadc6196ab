"""The end of every experiment of a distributed walk: every rank's outcome, reduced to one.

Each rank brings what it measured; `settle` exchanges it and hands every rank the same reduced outcome
(triage/walk/reduce.py), so that every rank's conditions, differential choice and report read the
same figures and take the same branch. When the ranks did not all succeed:

- every rank raised the same exception (type and message): the experiment failed as it would in a single
  process, and the walk goes on with it recorded as an error;
- otherwise the ranks can no longer run in lockstep, and the walk stops (`RankFailure`) naming the rank
  whose error came first and is not a collective giving up on a peer; or, when a rank never reported,
  the rank that stopped responding. Either is known within the rank timeout T (plus the store's round
  trip), and rank 0 still writes the report with what was measured.

What a rank posts to the store survives when the collectives do not: a rank left waiting in a collective
by a peer that raised learns of it there, and a peer that posted nothing is the one that hangs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from triage.load.ranks import Ranks, is_collective_failure
from triage.walk.reduce import reduce_outcomes


@dataclass(frozen=True)
class RankRecord:
    """One rank's end of an experiment, as exchanged (it is pickled)."""

    rank: int
    status: str
    error: Optional[str]
    seconds: float
    at: float  # wall clock when it finished or raised: which failure came first
    outcome: Any = None


@dataclass(frozen=True)
class Settled:
    """The experiment as every rank now sees it."""

    outcome: Any
    status: str
    error: Optional[str]
    seconds: float  # the slowest rank's
    per_rank: dict[str, list[Any]] = field(default_factory=dict)  # figures that differed between ranks


class RankFailure(Exception):
    """A rank raised where the others did not, or stopped responding: the walk cannot go on in lockstep."""

    def __init__(self, node: str, ranks: list[int], summary: str, error: Optional[str], silent: bool) -> None:
        self.node, self.ranks, self.summary, self.error, self.silent = node, ranks, summary, error, silent
        super().__init__(summary)



def settle(ranks: Ranks, node: str, outcome: Any, status: str, error: Optional[str], seconds: float) -> Settled:
    """Called by every rank at the end of every experiment (a single process gets its own back)."""
    if not ranks.distributed:
        return Settled(outcome, status, error, seconds)
    mine = RankRecord(ranks.rank, status, error, seconds, time.time(), outcome if status == "ok" else None)
    ranks.post(f"{node}/{ranks.rank}", RankRecord(mine.rank, status, error, seconds, mine.at))
    if status != "ok" and is_collective_failure(error):
        silent = [r for r in range(ranks.world_size) if ranks.read(f"{node}/{r}") is None]
        if silent:  # left waiting by a peer that never got here: it hangs (or died)
            raise _silent(ranks, node, silent)
    try:
        records = ranks.gather_settled(mine)
    except Exception:  # a peer raised and left, or hangs: what it posted says which
        posted = [ranks.read(f"{node}/{r}") for r in range(ranks.world_size)]
        silent = [r for r, p in enumerate(posted) if p is None]
        if silent:
            raise _silent(ranks, node, silent) from None
        raise _first_failure(node, [p for p in posted if p.status != "ok"] or posted) from None
    return _agree(node, records)


def _agree(node: str, records: list[RankRecord]) -> Settled:
    slowest = max(r.seconds for r in records)
    if all(r.status == "ok" for r in records):
        outcome, per_rank = reduce_outcomes([r.outcome for r in records])
        return Settled(outcome, "ok", None, slowest, per_rank)
    failed = [r for r in records if r.status != "ok"]
    same = len(failed) == len(records) and len({_last_line(r.error) for r in failed}) == 1
    if same and not is_collective_failure(failed[0].error):  # as a single process would have failed
        return Settled(None, failed[0].status, f"(every rank raised this) {failed[0].error}", slowest)
    raise _first_failure(node, failed)


def _first_failure(node: str, failed: list[RankRecord]) -> RankFailure:
    culprits = [r for r in failed if not is_collective_failure(r.error)] or failed
    first = min(culprits, key=lambda r: r.at)
    what = _last_line(first.error) or first.status
    summary = f"rank {first.rank} raised {what} in experiment '{node}'"
    return RankFailure(node, [first.rank], summary, f"rank {first.rank}:\n{first.error}", silent=False)


def _silent(ranks: Ranks, node: str, silent: list[int]) -> RankFailure:
    which = f"rank {silent[0]}" if len(silent) == 1 else f"ranks {', '.join(map(str, silent))}"
    summary = (f"{which} stopped responding in experiment '{node}' (no word for {ranks.timeout_s:.0f} s, "
               "the rank timeout)")
    return RankFailure(node, silent, summary, None, silent=True)


def _last_line(error: Optional[str]) -> str:
    """A traceback's exception line (the notes triage adds after it, "triage: ... raised on batch N", skipped)."""
    lines = [line.strip() for line in (error or "").strip().splitlines()
             if line.strip() and not line.startswith("triage: ")]
    return lines[-1][:300] if lines else ""
