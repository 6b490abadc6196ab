"""What an experiment is, and what the engine gives it.

An experiment writes one function, `measure(ctx, params) -> Outcome`. The engine owns the rest:
restoring the snapshot, seeding, the user's time ceiling, timing and turning exceptions into a failed run.
`Outcome`s are measurements only; playbook conditions judge them.

An experiment's length is counted in steps of the run (its parameters), never in seconds, so that two
machines, or one machine under two loads, give the same verdict. Seconds enter only as the user's ceiling
on the whole walk (`--max-minutes`): an experiment that meets it stops where it is and is reported as cut
(its figures are not read: cut short is not ruled out).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict

from triage.load.ranks import Ranks, current as current_ranks
from triage.load.session import Session
from triage.outcomes.base import Outcome  # declared torch-free, in triage/outcomes/; re-exported here
from triage.views import View


class NotApplicable(Exception):
    """Raised by an experiment that cannot run in this setup (an intervention the run's loop, schedule or
    optimizer gives no way to apply): the engine records it as `not_applicable` with this message as the
    reason. Such an experiment was never tried, so it rules nothing out."""


class Abandoned(Exception):
    """Raised by a replay whose Context.abandon says its figures are no longer wanted (a search's trial or a
    differential's candidate measured ahead of time: experiments/lanes.py, walk/forked.TwoAtOnce.ahead):
    nothing of it is kept."""


class Params(BaseModel):
    """An experiment's parameters; unknown keys in a playbook are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass
class Context:
    """The engine's services to a running experiment."""

    session: Session
    # Seconds left of the user's ceiling on the whole walk (--max-minutes) when this experiment began;
    # None: no ceiling. Never a budget of its own: what an experiment measures is bounded by its steps.
    budget_s: Optional[float] = None
    outcomes: dict[str, "Outcome"] = field(default_factory=dict)  # earlier nodes' measurements
    params: dict[str, "Params"] = field(default_factory=dict)  # every node's parameters, as the playbook sets them
    progress: Callable[[int, int], None] = lambda done, total: None
    started: float = field(default_factory=time.perf_counter)
    # The other ranks of a distributed run (a world of one otherwise): every decision that ends a loop
    # early must be the same on every rank, or the next collective waits for a rank that has left.
    ranks: Ranks = field(default_factory=current_ranks)
    # Set once the ceiling stopped this experiment part way (out_of_time() said so, or a loop that agrees
    # it across ranks itself set it): the engine reports the experiment as cut, and nothing reads it.
    cut: bool = False
    # A differential's candidate that may stop once it can no longer change the verdict (judge/race.py): set
    # by the walk for candidates nothing else reads; an experiment that replays passes it on to its replays.
    race: bool = False
    # Racing is on in this walk: a search may stop a trial that can no longer change what it chooses, even
    # where another node reads its choice.
    racing: bool = False
    # Asked between a replay's steps: True once its figures are no longer wanted (a search's trial measured
    # ahead of time, and the search settled before it; a candidate measured while a lower tier that works
    # outranked it). The replay raises Abandoned.
    abandon: Optional[Callable[[], bool]] = None

    def past_budget(self) -> bool:
        """Past the ceiling on this rank: a loop that agrees it across ranks itself (with its own figures)
        and sets `cut` when it stops for it."""
        return self.budget_s is not None and time.perf_counter() - self.started > self.budget_s

    def out_of_time(self) -> bool:
        """Past the ceiling on any rank (agreed: every rank stops at the same step). True marks the
        experiment cut: call it only where the loop then stops."""
        if self.ranks.any(self.past_budget()):
            self.cut = True
        return self.cut

    def restart(self) -> None:
        """Back to the snapshot (weights, optimizer, RNG, ...): for an experiment that runs several
        trials, each from the same state. The engine does this before every experiment."""
        self.session.restore()


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: its name, what it does, its parameter and outcome models, and the views
    the report draws of its outcome (triage/views.py). Registering it checks each view's fields against
    the outcome model, so a renamed field fails at registration, not when a report is drawn."""

    name: str
    summary: str
    params: type[Params]
    outcome: type[Outcome]
    measure: Callable[[Context, Any], Outcome]
    views: tuple[View, ...] = ()
    # Parameters that change nothing in a session without validation data (a replay's val_every): two
    # nodes whose parameters differ only there measure the same thing, and the engine runs it once.
    idle_without_val: tuple[str, ...] = ()

    def acting_params(self, params: Params, has_val: bool) -> dict[str, Any]:
        """The parameters as they act in a session: what makes two runs of it the same measurement."""
        acting = params.model_dump(mode="json")
        return acting if has_val else {k: v for k, v in acting.items() if k not in self.idle_without_val}
