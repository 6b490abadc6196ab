"""The speed machinery: what triage does only to be faster, named in one record.

Each part changes seconds: on one torch thread, a walk with every part on and one with none measure the same
figures, take the same decisions and draw the same figures on the page (tests/walk/test_speedups.py), but for
one thing the fork changes by design: where a fork is allowed, a search's trials are raced two at a time, a
trial not against the one just before it (experiments/lanes.py), so a trial may run longer than one at a time
would run it, and a verdict can differ only where that race would have stopped a trial that wins
(tests/walk/test_ahead.py). Whether a fork is allowed depends on the machine (triage/forks.can_fork), so two
machines can differ there; one machine gives the same figures every time. With torch on two threads the fork
runs a differential on one, so its figures can differ from a walk without it in their last digits.
`benchmarks/speedups.py` prints the seconds each part saves; `triage run --no-speedups` turns them all off.

- fork (walk/forked.py, experiments/alongside.py): a differential's candidates two at a time, in the walk's
  process and a forked copy of it, each on one torch thread; and a fix that goes on past the run it is paired
  with has the run replayed as long in a forked copy while it trains (where this process runs one thread); a
  search's trials two at a time (experiments/lanes.py); a candidate measured while the copy measures a lower
  tier that may outrank it (TwoAtOnce.ahead).
  Only where a fork is safe and pays (triage/forks.py): Linux, a CPU run, one rank, two cores or more,
  training state under 256 MiB.
- draw_ahead (report/ahead.py): a second process draws the report's figures while the walk runs, into
  the figure cache, so the page at the end draws next to nothing.
- figure_cache (report/figure_cache.py, report/carried.py): a figure drawn before, kept by a hash of what
  it shows, is taken instead of drawn: from this user's cache, or from the page beside a report.json
  that `triage report` re-renders (checked to be what triage's drawing writes). Without it every figure
  is drawn, and drawing ahead has nowhere to put what it drew.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

from pydantic import BaseModel, ConfigDict, model_validator


class Speedups(BaseModel):
    """Which parts of the speed machinery a walk, or a re-render, may use (all, by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fork: bool = True
    draw_ahead: bool = True
    figure_cache: bool = True

    @model_validator(mode="after")
    def _drawing_ahead_needs_the_cache(self) -> "Speedups":
        if self.draw_ahead and not self.figure_cache:
            raise ValueError("expected draw_ahead=False where figure_cache=False (the drawer draws into the figure "
                             "cache), found draw_ahead=True; turn both off")
        return self

    @classmethod
    def none(cls) -> "Speedups":
        return cls(fork=False, draw_ahead=False, figure_cache=False)


# What the figures drawn in this context may use: set around a walk and a re-render (`using`), read where a
# figure is drawn (report/plots.py), which is too deep for a parameter to reach without every view carrying it.
_ACTIVE: ContextVar[Speedups] = ContextVar("speedups", default=Speedups())


def active() -> Speedups:
    return _ACTIVE.get()


@contextlib.contextmanager
def using(speedups: Speedups) -> Iterator[Speedups]:
    token = _ACTIVE.set(speedups)
    try:
        yield speedups
    finally:
        _ACTIVE.reset(token)
