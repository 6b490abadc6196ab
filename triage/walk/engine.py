"""The engine: walks the playbook's graph (a Walker), from node to node on what each measured. A run node
measures (walk/measuring.py: from the restored snapshot, the judge reading a counterfactual), a decision
node decides on what was measured, a differential node tries its candidate fixes (walk/differential.py).

Every decision is counted in steps of the run (each experiment's parameters), so the verdict does not
depend on how fast the machine is. The one clock is the user's ceiling on the whole walk
(`--max-minutes`): the experiment it catches is cut, and the walk stops there with no verdict, naming what
it cut, rather than read a cut-short experiment as a ruled-out one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from triage.experiments import Outcome
from triage.experiments.levels import loss_levels
from triage.judge.decay import decay_reach
from triage.load.ranks import current as current_ranks
from triage.load.session import Session
from triage.records import Clause, Confidence, Decision, ExperimentRun, SetupFacts
from triage.walk import differential
from triage.walk.differential import Controls
from triage.walk.figures import shown
from triage.walk.forked import Candidates
from triage.walk.listener import Listener, SilentListener
from triage.walk.measuring import Measurer
from triage.walk.playbook import Playbook
from triage.walk.playbook.schema import DecisionNode, LeafNode, RunNode
from triage.walk.reads import names_read
from triage.walk.stops import STOPPED, CeilingReached, StopWalk, cut_leaf, cut_reason

__all__ = ["CONFIDENCE_ORDER", "Listener", "SilentListener", "Walk", "Walker", "lookup", "setup_facts", "walk"]

log = logging.getLogger(__name__)

CONFIDENCE_ORDER = ("low", "medium", "high")


@dataclass
class Walk:
    """Everything the walk measured and decided, ready for the report.

    `status` is "complete" when it reached a leaf; "incomplete" for what the journal is handed while the
    walk goes on; "interrupted" when Ctrl-C ended it (no leaf: what finished before is all here)."""

    path: list[str]
    leaf: Optional[LeafNode]
    runs: dict[str, ExperimentRun]
    outcomes: dict[str, Outcome]
    decisions: list[Decision]
    setup_facts: SetupFacts
    seconds: float = 0.0
    status: str = "complete"
    stopped: Optional[str] = None  # why the walk ended before a leaf (a rank, or the --max-minutes ceiling)
    silent_ranks: list[int] = field(default_factory=list)  # ranks that stopped responding
    cut: list[str] = field(default_factory=list)  # experiments the ceiling stopped part way or before they began

    def lookup(self, node: str, name: str) -> Any:
        return lookup(node, name, self.setup_facts, self.runs, self.outcomes)

    @property
    def confidence(self) -> Confidence:
        """The leaf's stated confidence, capped by any branch on the path that says so (a symptom read near
        its threshold) and by the measured confidence of the differential node whose winner led here (a
        verdict cannot claim more than its differential showed)."""
        if self.leaf is None:
            return "low"
        stated = min([self.leaf.confidence] + [d.cap for d in self.decisions if d.cap is not None],
                     key=CONFIDENCE_ORDER.index)
        for decision in reversed(self.decisions):
            if decision.confidence is not None and any(c.winner for c in decision.candidates):
                return min(stated, decision.confidence, key=CONFIDENCE_ORDER.index)
        return stated


def setup_facts(session: Session) -> SetupFacts:
    s = session.setup
    return SetupFacts(
        precision=s.precision, grad_clip=s.grad_clip, has_scheduler=s.scheduler is not None,
        weight_decay=max((float(g.get("weight_decay") or 0.0) for g in s.optimizer.param_groups), default=0.0),
        decay_reach=decay_reach(s.optimizer, session.checkpoint.step if session.checkpoint else None),
        has_train_step=s.train_step is not None, auxiliary_term_count=len(s.auxiliary_terms),
        has_val=bool(session.val_batches),
        total_steps=s.total_steps, device_type=session.device.type,
        checkpoint_step=session.checkpoint.step if session.checkpoint else None,
        batch_count=len(session.batches),
        optimizer_count=len(getattr(s.optimizer, "optimizers", None) or [s.optimizer]),
    )


def lookup(node: str, name: str, facts: SetupFacts, runs: dict[str, ExperimentRun],
           outcomes: dict[str, Outcome]) -> Any:
    """The value a condition's `node.name` reads: None when it was not measured."""
    if node == "setup":
        return getattr(facts, name)
    run = runs.get(node)
    if run is None:
        return None
    if name in ("status", "seconds", "error"):
        return getattr(run, name)
    if run.status != "ok":  # a partial measurement would make the verdict depend on machine speed
        return None
    return getattr(outcomes.get(node), name, None)


Journal = Callable[[Walk], None]


class Walker:
    """One walk of a playbook over one session. What it has measured and decided so far is its state
    (`runs`, `outcomes`, `decisions`, `path`); `walk()` goes node by node from the entry to a leaf."""

    def __init__(self, session: Session, playbook: Playbook, listener: Optional[Listener] = None,
                 journal: Optional[Journal] = None, parallel: bool = False, max_seconds: Optional[float] = None,
                 race: bool = True) -> None:
        self.session, self.playbook, self.journal, self.max_seconds = session, playbook, journal, max_seconds
        self.listener = listener or SilentListener()
        self.facts = setup_facts(session)
        self.runs: dict[str, ExperimentRun] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.decisions: list[Decision] = []
        self.path = [playbook.entry]
        self.started = time.perf_counter()
        self.deadline = self.started + max_seconds if max_seconds is not None else None
        self.stop: Optional[StopWalk] = None  # why it ended before a leaf
        self.cut: list[str] = []  # what the ceiling cut
        self.measurer = Measurer(session, playbook, parallel=parallel, race=race, deadline=self.deadline)
        self.controls = Controls(self.measure)

    def read(self, node: str, name: str) -> Any:
        return lookup(node, name, self.facts, self.runs, self.outcomes)

    def so_far(self, status: str, leaf: Optional[LeafNode] = None) -> Walk:
        stop = self.stop
        return Walk(path=list(self.path), leaf=leaf, runs=dict(self.runs), outcomes=dict(self.outcomes),
                    decisions=list(self.decisions), setup_facts=self.facts,
                    seconds=time.perf_counter() - self.started, status=status,
                    stopped=stop.reason if stop else None, silent_ranks=stop.silent_ranks if stop else [],
                    cut=list(self.cut))

    def record(self, run: ExperimentRun, outcome: Optional[Outcome]) -> None:
        self.runs[run.node] = run
        if outcome is not None:
            self.outcomes[run.node] = outcome
        if self.journal is not None:
            self.journal(self.so_far("incomplete"))
        if run.status == "timeout":  # cut by the ceiling: its figures decide nothing, and nothing after it runs
            raise CeilingReached(run.node, run)

    def measure(self, run_id: str, title: Optional[str]) -> ExperimentRun:
        if self.deadline is not None and current_ranks().any(time.perf_counter() >= self.deadline):
            raise CeilingReached(run_id, None)
        self.listener.started(run_id, self.playbook.experiments[run_id], title)
        run, outcome = self._measured_before(run_id) or self.measurer.run(run_id, self.outcomes, self.listener)
        self.record(run, outcome)
        return run

    def _measured_before(self, run_id: str) -> Optional[tuple[ExperimentRun, Optional[Outcome]]]:
        """An earlier node's figures where it measured exactly what `run_id` would (from the same snapshot and
        seed: the very figures, not worth a second run)."""
        same = self.measurer.same_as(run_id, self.runs, self.facts.has_val)
        if same is None:
            return None
        return self.runs[same].model_copy(update={
            "node": run_id, "params": self.playbook.params[run_id].model_dump(mode="json"), "seconds": 0.0,
            "same_as": same}), self.outcomes[same]

    def measure_in_copy(self, run_id: str, new: dict[str, Outcome]) -> tuple[ExperimentRun, Optional[Outcome]]:
        """What a forked copy does for one candidate: its own copy of `outcomes`, brought up to date."""
        self.outcomes.update(new)
        run, outcome = self.measurer.run(run_id, self.outcomes, SilentListener())
        if outcome is not None:
            self.outcomes[run_id] = outcome
        return run, outcome

    def measure_ahead(self, run_id: str, abandon: Callable[[], bool]) -> tuple[ExperimentRun, Optional[Outcome]]:
        """A candidate measured before it is known to be wanted (differential.decide): not recorded, and
        stopped (Abandoned) once `abandon` says it is outranked."""
        if self.deadline is not None and current_ranks().any(time.perf_counter() >= self.deadline):
            raise CeilingReached(run_id, None)
        return self._measured_before(run_id) or self.measurer.run(run_id, self.outcomes, SilentListener(),
                                                                  abandon=abandon)

    def new_pool(self) -> Candidates:
        return self.measurer.pool(self.measure, self.measure_in_copy, self.record, self.outcomes, self.listener,
                                  self.measure_ahead)

    def walk(self) -> Walk:
        """From the entry to a leaf. Ctrl-C ends it with status "interrupted"; a rank that fails, or the
        ceiling, ends it before a leaf, with a leaf that says why."""
        session, playbook = self.session, self.playbook
        node = playbook.entry
        session.restore()
        loss_levels(session)  # the levels every replay is judged against, measured at the checkpoint
        try:
            while not isinstance(spec := playbook.spec(node), LeafNode):
                decision = self._step(node, spec)
                self.decisions.append(decision)
                node = decision.goto
                self.path.append(node)
        except KeyboardInterrupt:  # the experiment in flight is lost; every finished one is kept
            log.warning("interrupted at node %s: %d experiments finished", node, len(self.runs))
            return self.so_far("interrupted")
        except StopWalk as stopped:  # a rank raised or stopped responding (triage/walk/settle.py)
            self.stop = stopped
            self.runs[stopped.run.node] = stopped.run
            spec = stopped.leaf
            self.path.append(STOPPED)
        except CeilingReached as reached:
            self.cut.append(reached.node)
            reason = cut_reason(reached, self.max_seconds)
            self.stop = StopWalk(cut_leaf(reached, reason, self.max_seconds), reached.run, reason, [])
            spec = self.stop.leaf
            self.path.append(STOPPED)
        finally:
            self.listener.close()
            session.restore()  # leave the user's objects as they were handed to us
        return self.so_far("complete", leaf=spec)

    def _step(self, node: str, spec) -> Decision:
        """Measure what `node` runs (its controls first, where it reads any), and decide where to go."""
        playbook, listener = self.playbook, self.listener
        if isinstance(spec, RunNode):
            self.controls.ensure(names_read(playbook, node))
            run = self.measure(node, spec.title)
            decision = _decide(playbook, node, self.read)
            listener.finished(run, decision)
        elif isinstance(spec, DecisionNode):
            self.controls.ensure(names_read(playbook, node))
            decision = _decide(playbook, node, self.read)
            listener.decided(decision)
        else:
            decision = differential.decide(playbook, node, spec, self.read, self.new_pool, listener, self.controls)
            for cid, *_ in playbook.candidates(node):  # the report lists them as written, however they ran
                if cid in self.runs:
                    self.runs[cid] = self.runs.pop(cid)
            listener.decided(decision)
        return decision


def walk(session: Session, playbook: Playbook, listener: Optional[Listener] = None,
         journal: Optional[Journal] = None, parallel: bool = False, max_seconds: Optional[float] = None,
         race: bool = True) -> Walk:
    """Walk the playbook from its entry to a leaf. `journal` is handed the walk so far (status
    "incomplete") after every experiment, so what was measured survives whatever happens next; Ctrl-C
    ends the walk with status "interrupted" instead of losing it. `parallel` measures a differential's
    candidates two at a time where a fork is safe (forked.py), each on one torch thread: the figures of
    one at a time on one thread. `max_seconds` is the user's ceiling on the whole walk (--max-minutes):
    reached, it cuts the experiment in flight and ends the walk without a verdict (Walk.cut names what
    it cut); None, the walk runs every experiment to its last step however long that takes. `race`: a
    candidate that nothing but its differential reads stops once it can no longer change the verdict
    (judge/race.py; walk/reads.raceable); False, every candidate runs every step."""
    return Walker(session, playbook, listener, journal, parallel, max_seconds, race).walk()


def _decide(playbook: Playbook, node: str, read) -> Decision:
    figures: dict[str, Any] = {}
    settled: list[Clause] = []  # of each condition that failed, the clauses that made it fail
    errors: list[str] = []  # conditions that could not be evaluated: unknown, recorded, the walk goes on
    spec = playbook.spec(node)
    for i, (target, condition) in enumerate(playbook.branches(node)):
        if condition is None:
            return Decision(node=node, goto=target, when=None, answer=spec.otherwise_answer, figures=figures,
                            settled=settled, errors=errors)
        figures.update({f"{n}.{name}": shown(read(n, name)) for n, name in sorted(condition.refs)})
        if condition.evaluate(read, errors):
            return Decision(node=node, goto=target, when=condition.text, answer=spec.branches[i].answer,
                            figures=figures, settled=_clauses(condition, read), errors=errors,
                            cap=spec.branches[i].confidence)
        settled += _clauses(condition, read)
    raise AssertionError("a validated run node always has an `otherwise` edge")


def _clauses(condition, read) -> list[Clause]:
    return [Clause(text=text, refs=refs) for text, refs in condition.settled(read)]
