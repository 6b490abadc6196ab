"""The engine: walks the playbook's graph, running each node's experiment from the restored snapshot.

It owns what every experiment needs and none should write: restore, seed, the user's time ceiling,
timing, and turning a raising or out-of-memory experiment into an ExperimentRun that says so.

Every decision is counted in steps of the run (each experiment's parameters), so the verdict does not
depend on how fast the machine is. The one clock is the user's ceiling on the whole walk
(`--max-minutes`): the experiment it catches is cut, and the walk stops there with no verdict, naming what
it cut, rather than read a cut-short experiment as a ruled-out one.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Protocol

import torch

from triage.load.ranks import current as current_ranks
from triage.walk.settle import RankFailure, settle
from triage.experiments import Context, NotApplicable, Outcome, Params
from triage.experiments.verify import VerifiedFix, judged
from triage.experiments.levels import loss_levels
from triage.walk.forked import Candidates, OneByOne, TwoAtOnce, can_fork, training_state_bytes
from triage.walk.reads import names_read, raceable
from triage.judge.decay import decay_reach
from triage.judge.differential import far_fetched, judge_candidates, outranked, tier_of
from triage.walk.playbook import Playbook
from triage.records import CandidateResult, Clause, Confidence, Decision, ExperimentRun, SetupFacts
from triage.walk.playbook.schema import DecisionNode, DifferentialNode, LeafNode, RunNode
from triage.load.session import Session

log = logging.getLogger(__name__)


class Listener(Protocol):
    """What the terminal view (or a test) hears while the walk goes on."""

    def started(self, node: str, experiment: str, title: Optional[str]) -> None: ...
    def progress(self, done: int, total: int) -> None: ...
    def finished(self, run: ExperimentRun, decision: Decision) -> None: ...
    def decided(self, decision: Decision) -> None: ...  # a decision or differential node chose
    def close(self) -> None: ...


class SilentListener:
    def started(self, node, experiment, title): pass
    def progress(self, done, total): pass
    def finished(self, run, decision): pass
    def decided(self, decision): pass
    def close(self): pass


CONFIDENCE_ORDER = ("low", "medium", "high")
STOPPED = "stopped"  # the last node of a path whose walk stopped before reaching a leaf


class StopWalk(Exception):
    """Ends the walk before a leaf (the ranks of a distributed run could not go on together): carries
    the leaf the report shows, and the experiment that could not finish."""

    def __init__(self, leaf: LeafNode, run: Optional[ExperimentRun], reason: str, silent_ranks: list[int]) -> None:
        super().__init__(reason)
        self.leaf, self.run, self.reason, self.silent_ranks = leaf, run, reason, silent_ranks


class CeilingReached(Exception):
    """The user's ceiling on the walk (--max-minutes) passed: `node`'s experiment was cut part way (`run`
    says where) or, with `run` None, never began."""

    def __init__(self, node: str, run: Optional[ExperimentRun]) -> None:
        super().__init__(node)
        self.node, self.run = node, run


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
        has_train_step=s.train_step is not None, has_val=bool(session.val_batches),
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


class Controls:
    """A differential's controls (a candidate with no `then`, such as the run restarted as it was) are
    measured only once a node or candidate that reads them is about to run: a control that nothing is
    compared with decides nothing, and costs a replay (40 of the suite's 90 plateaus never used theirs)."""

    def __init__(self, measure: Callable[[str, Optional[str]], ExperimentRun]) -> None:
        self.measure = measure
        self.waiting: dict[str, Optional[str]] = {}  # control id -> its title

    def defer(self, cid: str, title: Optional[str]) -> None:
        self.waiting[cid] = title

    def ensure(self, names: Iterable[str]) -> None:
        """Measure, here and now, each waiting control among `names` (in the order written)."""
        for name in [n for n in self.waiting if n in set(names)]:
            self.measure(name, self.waiting.pop(name))


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
    listener = listener or SilentListener()
    facts = setup_facts(session)
    runs: dict[str, ExperimentRun] = {}
    outcomes: dict[str, Outcome] = {}
    decisions: list[Decision] = []
    path = [playbook.entry]
    node = playbook.entry
    started = time.perf_counter()
    deadline = started + max_seconds if max_seconds is not None else None
    stop: Optional[StopWalk] = None
    cut: list[str] = []
    raced = raceable(playbook) if race else frozenset()

    def read(n: str, name: str) -> Any:
        return lookup(n, name, facts, runs, outcomes)

    def so_far(status: str, leaf: Optional[LeafNode] = None) -> Walk:
        return Walk(path=list(path), leaf=leaf, runs=dict(runs), outcomes=dict(outcomes), decisions=list(decisions),
                    setup_facts=facts, seconds=time.perf_counter() - started, status=status,
                    stopped=stop.reason if stop else None, silent_ranks=stop.silent_ranks if stop else [],
                    cut=list(cut))

    def record(run: ExperimentRun, outcome: Optional[Outcome]) -> None:
        runs[run.node] = run
        if outcome is not None:
            outcomes[run.node] = outcome
        if journal is not None:
            journal(so_far("incomplete"))
        if run.status == "timeout":  # cut by the ceiling: its figures decide nothing, and nothing after it runs
            raise CeilingReached(run.node, run)

    def measure(run_id: str, title: Optional[str]) -> ExperimentRun:
        if deadline is not None and current_ranks().any(time.perf_counter() >= deadline):
            raise CeilingReached(run_id, None)
        listener.started(run_id, playbook.experiments[run_id], title)
        same = _same_measurement(playbook, run_id, runs, facts.has_val)
        if same is not None:  # from the same snapshot and seed: the very figures, not worth a second run
            run, outcome = runs[same].model_copy(update={
                "node": run_id, "params": playbook.params[run_id].model_dump(mode="json"), "seconds": 0.0,
                "same_as": same}), outcomes[same]
        else:
            run, outcome = run_experiment(session, playbook, run_id, outcomes, listener, deadline,
                                          race=run_id in raced, racing=race)
        record(run, outcome)
        return run

    def measure_in_copy(run_id: str, new: dict[str, Outcome]) -> tuple[ExperimentRun, Optional[Outcome]]:
        outcomes.update(new)  # in the forked copy: its own copy of `outcomes`, brought up to date
        run, outcome = run_experiment(session, playbook, run_id, outcomes, SilentListener(), deadline,
                                      race=run_id in raced, racing=race)
        if outcome is not None:
            outcomes[run_id] = outcome
        return run, outcome

    controls = Controls(measure)

    def new_pool() -> Candidates:
        if parallel and can_fork(session.device, current_ranks().world_size,
                                 training_state_bytes(session.setup.model, session.setup.optimizer)):
            try:
                return TwoAtOnce(measure, measure_in_copy, record, outcomes, listener, playbook.experiments)
            except OSError as exc:
                log.warning("no second process for the candidates (%s); measuring them one by one", exc)
        return OneByOne(measure)

    session.restore()
    loss_levels(session)  # the levels every replay is judged against, measured at the checkpoint
    try:
        while not isinstance(spec := playbook.spec(node), LeafNode):
            if isinstance(spec, RunNode):
                controls.ensure(names_read(playbook, node))
                run = measure(node, spec.title)
                decision = _decide(playbook, node, read)
                listener.finished(run, decision)
            elif isinstance(spec, DecisionNode):
                controls.ensure(names_read(playbook, node))
                decision = _decide(playbook, node, read)
                listener.decided(decision)
            else:
                decision = _differential(playbook, node, spec, read, new_pool, listener, controls)
                for cid, *_ in playbook.candidates(node):  # the report lists them as written, however they ran
                    if cid in runs:
                        runs[cid] = runs.pop(cid)
                listener.decided(decision)
            decisions.append(decision)
            node = decision.goto
            path.append(node)
    except KeyboardInterrupt:  # the experiment in flight is lost; every finished one is kept
        log.warning("interrupted at node %s: %d experiments finished", node, len(runs))
        return so_far("interrupted")
    except StopWalk as stopped:  # a rank raised or stopped responding (triage/walk/settle.py)
        stop = stopped
        runs[stop.run.node] = stop.run
        spec = stop.leaf
        path.append(STOPPED)
    except CeilingReached as reached:
        cut.append(reached.node)
        reason = _cut_reason(reached, max_seconds)
        stop = StopWalk(_cut_leaf(reached, reason, max_seconds), reached.run, reason, [])
        spec = stop.leaf
        path.append(STOPPED)
    finally:
        listener.close()
        session.restore()  # leave the user's objects as they were handed to us
    return so_far("complete", leaf=spec)


def run_experiment(session: Session, playbook: Playbook, node: str, outcomes: dict[str, Outcome],
                   listener: Listener, deadline: Optional[float] = None,
                   race: bool = False, racing: bool = False) -> tuple[ExperimentRun, Optional[Outcome]]:
    """Run the experiment of a run node or a candidate (`node` is its id) from the restored snapshot.
    `deadline` (time.perf_counter()) is the walk's ceiling: an experiment still running then is cut
    (status "timeout"); None, it runs to its last step. `race`: its replays may stop once out of
    contention (Context.race); `racing`: racing is on in this walk (Context.racing)."""
    name = playbook.experiments[node]
    experiment = playbook.registry.get(name)
    params = playbook.params[node]
    session.restore()
    left = max(0.0, deadline - time.perf_counter()) if deadline is not None else None
    ctx = Context(session=session, budget_s=left, outcomes=dict(outcomes), progress=listener.progress,
                  params=playbook.params, race=race, racing=racing)
    outcome, status, error = None, "ok", None
    anomaly_was_on = torch.is_anomaly_enabled()
    t0 = time.perf_counter()
    try:
        outcome = _judged(experiment.measure(ctx, params), params)
    except NotApplicable as reason:
        status, error = "not_applicable", str(reason)
        log.info("experiment %s at node %s does not apply: %s", name, node, reason)
    except torch.OutOfMemoryError:
        status, error = "oom", traceback.format_exc()
    except Exception:
        status, error = "error", traceback.format_exc()
        log.warning("experiment %s at node %s raised:\n%s", name, node, error)
    finally:
        torch.autograd.set_detect_anomaly(anomaly_was_on)  # an experiment that raised may have left it on
    try:  # distributed: every rank's outcome reduced to the one all ranks decide on (else unchanged)
        settled = settle(ctx.ranks, node, outcome, status, error, time.perf_counter() - t0)
    except RankFailure as failure:
        failed = ExperimentRun(node=node, experiment=name, summary=experiment.summary,
                               params=params.model_dump(mode="json"), status="error",
                               error=failure.error or failure.summary, seconds=round(time.perf_counter() - t0, 3))
        raise StopWalk(_stopped_leaf(failure), failed, failure.summary,
                       failure.ranks if failure.silent else []) from None
    outcome, status, error, seconds = settled.outcome, settled.status, settled.error, settled.seconds
    if status == "ok" and ctx.cut:  # stopped part way by the ceiling, not by its own steps
        status = "timeout"
    run = ExperimentRun(node=node, experiment=name, summary=experiment.summary,
                        params=params.model_dump(mode="json"), status=status, error=error,
                        seconds=round(seconds, 3),
                        outcome=_as_json(outcome) if outcome is not None else None, per_rank=settled.per_rank)
    return run, outcome


def _same_measurement(playbook: Playbook, node: str, runs: dict[str, ExperimentRun], has_val: bool) -> Optional[str]:
    """An earlier node that measured exactly what `node` would: the same experiment, the same parameters
    as they act in this session (a replay's val_every does nothing without validation data)."""
    name = playbook.experiments[node]
    experiment = playbook.registry.get(name)
    acting = experiment.acting_params(playbook.params[node], has_val)
    return next((other for other, run in runs.items()
                 if run.status == "ok" and run.same_as is None and not _raced_out(run)
                 and playbook.experiments.get(other) == name
                 and experiment.acting_params(playbook.params[other], has_val) == acting), None)


def _raced_out(run: ExperimentRun) -> bool:
    """Some replay of the run stopped before its last step, out of contention: not the full measurement."""
    outcome = run.outcome or {}
    return bool(outcome.get("raced_out")) or any(t.get("raced_out") for t in outcome.get("trials") or [])


def _cut_reason(reached: CeilingReached, max_seconds: Optional[float]) -> str:
    ceiling = f"the --max-minutes ceiling ({_minutes(max_seconds)} min)"
    if reached.run is None:
        return f"{ceiling} passed before '{reached.node}' began"
    steps_run, steps = (reached.run.outcome or {}).get("steps_run"), reached.run.params.get("steps")
    where = f" after {steps_run} of its {steps} steps" if steps_run is not None and steps else ""
    return f"{ceiling} cut '{reached.node}'{where}"


def _cut_leaf(reached: CeilingReached, reason: str, max_seconds: Optional[float]) -> LeafNode:
    return LeafNode(
        diagnosis="inconclusive", title="The walk was cut short by its time ceiling (--max-minutes)",
        confidence="low",
        fix=(f"No verdict: {reason}. A cut experiment is unmeasured, not ruled out, so the walk stopped there; "
             "the experiments before it are reported as measured. Re-run with a larger --max-minutes "
             f"(this walk needs more than {_minutes(max_seconds)} min), or without it, to let every experiment "
             "run its steps."),
        evidence=[reached.node] if reached.run is not None else [])


def _minutes(seconds: Optional[float]) -> str:
    return f"{(seconds or 0.0) / 60:.3g}"


def _stopped_leaf(failure: RankFailure) -> LeafNode:
    what = "stopped responding" if failure.silent else "raised"
    return LeafNode(
        diagnosis="inconclusive", title=f"The walk stopped: {failure.summary}", confidence="low",
        fix=(f"Make every rank run the experiment: the rank that {what} is named above"
             + (", with its traceback in the experiment's record. " if not failure.silent else
                " (a deadlock, an endless loop, a collective only some ranks call). ")
             + "The experiments before it are reported as measured; re-run triage once it is fixed."),
        evidence=[failure.node])


def _decide(playbook: Playbook, node: str, read) -> Decision:
    figures: dict[str, Any] = {}
    settled: list[Clause] = []  # of each condition that failed, the clauses that made it fail
    errors: list[str] = []  # conditions that could not be evaluated: unknown, recorded, the walk goes on
    spec = playbook.spec(node)
    for i, (target, condition) in enumerate(playbook.branches(node)):
        if condition is None:
            return Decision(node=node, goto=target, when=None, answer=spec.otherwise_answer, figures=figures,
                            settled=settled, errors=errors)
        figures.update({f"{n}.{name}": _figure(read(n, name)) for n, name in sorted(condition.refs)})
        if condition.evaluate(read, errors):
            return Decision(node=node, goto=target, when=condition.text, answer=spec.branches[i].answer,
                            figures=figures, settled=_clauses(condition, read), errors=errors,
                            cap=spec.branches[i].confidence)
        settled += _clauses(condition, read)
    raise AssertionError("a validated run node always has an `otherwise` edge")


def _clauses(condition, read) -> list[Clause]:
    return [Clause(text=text, refs=refs) for text, refs in condition.settled(read)]


def _differential(playbook: Playbook, node: str, spec: DifferentialNode, read, new_pool: Callable[[], Candidates],
                  listener: Listener, controls: Controls) -> Decision:
    """Try each candidate whose `if` holds, then go where the winner leads, as the judge picks it
    (judge/differential.py: the lowest tier whose fix works, tier 1 where the abnormality a candidate
    repairs was `measured`, the best score within it). A candidate of a higher tier than a fix that
    already works is not run (`outranked`): it could neither win nor come close, both of which need the
    winner's tier (one a later candidate reads, `against:` say, still runs).

    Candidates are taken in the order written; one that reads an earlier one (its `if`, `measured` or a
    parameter such as `against:`), or that a lower tier's result could outrank, waits for what it needs,
    so two at a time decide exactly what one at a time would. A control (no `then`) waits in `controls`
    until a candidate that reads it is about to run; one that none reads is not run (`unneeded`)."""
    errors: list[str] = []
    measured = playbook.measured(node)
    decided: list[CandidateResult] = []  # works and score filled in once every candidate is measured
    reads = {cid: _sibling_reads(playbook, node, cid, condition, measured.get(cid))
             for cid, _, condition in playbook.candidates(node)}
    read_later = {ref for refs in reads.values() for ref in refs}
    pool = new_pool()
    try:
        for cid, candidate, condition in playbook.candidates(node):
            controls.ensure(names_read(playbook, None, condition, measured.get(cid)))  # the `if` may read one
            pool.wait(reads[cid])
            abnormal = measured[cid].evaluate(read, errors) if cid in measured else None
            tier = tier_of(candidate.tier, abnormal)
            lower = [c.id for c in decided if c.tried and c.then and c.tier < tier]
            pool.wait(lower)
            beaten = outranked(leads_to_a_cause=candidate.then is not None, read_later=cid in read_later,
                               lower_tier_works=[read(c, spec.works) for c in lower])
            tried = not beaten and (condition is None or condition.evaluate(read, errors))
            if tried and candidate.then is None:
                controls.defer(cid, candidate.title)
            elif tried:
                controls.ensure(names_read(playbook, cid, condition, measured.get(cid)))
                pool.wait(reads[cid])
                pool.submit(cid, candidate.title, lambda run, cid=cid: listener.finished(
                    run, Decision(node=cid, goto=node, when=f"candidate of {node}", figures={
                        f"{cid}.{spec.works}": _figure(read(cid, spec.works)),
                        f"{cid}.{spec.score}": _figure(read(cid, spec.score))})))
            decided.append(CandidateResult(id=cid, experiment=candidate.run, then=candidate.then, tier=tier,
                                           measured=abnormal, tried=tried, outranked=beaten,
                                           cap=None if abnormal else candidate.confidence))
        pool.wait([c.id for c in decided if c.tried])
    finally:
        pool.close()
    decided = [c.model_copy(update={"tried": False, "unneeded": True}) if c.id in controls.waiting else c
               for c in decided]
    results = [_ended(c, read, spec) if c.tried else c for c in decided]
    figures = {f"{r.id}.{spec.works}": r.works for r in results if r.tried and r.then}
    judged = judge_candidates(results, lambda then: _cause_of(playbook, then), spec.close)
    if judged.winner is None:
        return Decision(node=node, goto=spec.otherwise, when=None, figures=figures, candidates=results,
                        confidence=judged.confidence, errors=errors)
    winner = judged.winner
    results = [r.model_copy(update={"winner": r is winner, "also_works": r.id in judged.also}) for r in results]
    return Decision(node=node, goto=winner.then, when=f"{winner.id} works best", figures=figures,
                    candidates=results, confidence=judged.confidence, errors=errors)


def _ended(candidate: CandidateResult, read, spec: DifferentialNode) -> CandidateResult:
    """A run candidate with how its experiment ended: its verdict where it ran to its end, none where it
    failed, and not tried at all where it could not run in this setup."""
    status = read(candidate.id, "status")
    if status != "ok":
        return candidate.model_copy(update={"status": status, "tried": status != "not_applicable"})
    update = {"status": status, **_verdict(read(candidate.id, spec.works), read(candidate.id, spec.score)),
              "raced_out": read(candidate.id, "raced_out")}
    # How far the LR had to move, and to what: the nearest working trial of a search, else the factor replayed.
    reason = far_fetched(read(candidate.id, "least_working_factor") or read(candidate.id, "lr_factor"),
                         read(candidate.id, "least_working_lr"), read(candidate.id, "optimizer_kind"))
    if reason is not None:
        update |= {"cap": "low" if candidate.cap == "low" else "medium", "cap_reason": reason}
    return candidate.model_copy(update=update)


def _judged(outcome: Outcome, params: Params) -> Outcome:
    """The outcome with the judge's reading of it, where it is a counterfactual paired with a reference: the
    experiment measures both, the judge says whether the fix works (experiments/verify.judged), with the
    bars the node's parameters set (the judge's own unless a team's playbook moved them)."""
    if not isinstance(outcome, VerifiedFix):
        return outcome
    bars = {name: getattr(params, name) for name in ("margin", "level_margin") if hasattr(params, name)}
    return outcome.model_copy(update=judged(outcome, **bars))


def _verdict(works: Any, score: Any) -> dict[str, Any]:
    return {"works": works if isinstance(works, bool) else None, "score": score if _is_number(score) else None}


def _sibling_reads(playbook: Playbook, node: str, cid: str, *conditions) -> list[str]:
    """The earlier candidates of `node` that candidate `cid` reads: in its conditions, or named by a
    parameter (`against: restart`)."""
    siblings = {c for c, *_ in playbook.candidates(node)} - {cid}
    return sorted(names_read(playbook, cid, *conditions) & siblings)


def _cause_of(playbook: Playbook, node: Optional[str]) -> Optional[str]:
    """The diagnosis a candidate's `then` stands for (two leaves may carry one root cause)."""
    spec = playbook.spec(node) if node else None
    return spec.diagnosis if isinstance(spec, LeafNode) else node


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _as_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as report.json will hold it (NaN as "NaN"), so a report equals its own round-trip."""
    return json.loads(outcome.model_dump_json())


def _figure(value: Any) -> Any:
    """A figure small enough to show beside a node: numbers rounded, long lists summarised."""
    if isinstance(value, float):
        return float(f"{value:.4g}") if math.isfinite(value) else str(value)
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value)} items]"
    return value
