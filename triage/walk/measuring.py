"""How the walk gets an experiment's figures: from the restored snapshot, with the user's time ceiling, the
judge's reading of a counterfactual, a raising or out-of-memory experiment turned into an ExperimentRun
that says so (run_experiment); and as fast as they can be had without changing them (Measurer)."""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import Any, Callable, Optional

import torch

from triage.experiments import Context, NotApplicable, Outcome, Params
from triage.experiments.base import Abandoned
from triage.experiments.verify import judged
from triage.outcomes.replay import ReplayOutcome
from triage.load.ranks import current as current_ranks
from triage.load.session import Session
from triage.records import ExperimentRun
from triage.forks import can_fork, training_state_bytes
from triage.walk.forked import Candidates, OneByOne, TwoAtOnce
from triage.walk.listener import Listener
from triage.walk.playbook import Playbook
from triage.walk.reads import raceable
from triage.walk.settle import RankFailure, settle
from triage.walk.stops import StopWalk, stopped_leaf

log = logging.getLogger(__name__)


class Measurer:
    """The walk's speed machinery, behind one interface: an earlier node's figures where it measured the very
    same thing (`same_as`); racing, where a candidate no other node reads stops once it can no longer change
    the verdict (`run`; judge/race.py, walk/reads.raceable); and a differential's candidates two at a time in
    a forked copy where a fork is safe (`pool`; walk/forked.py). None of them changes a figure."""

    def __init__(self, session: Session, playbook: Playbook, *, parallel: bool, race: bool,
                 deadline: Optional[float]) -> None:
        self.session, self.playbook, self.parallel, self.racing, self.deadline = (
            session, playbook, parallel, race, deadline)
        self.raced = raceable(playbook) if race else frozenset()

    def same_as(self, node: str, runs: dict[str, ExperimentRun], has_val: bool) -> Optional[str]:
        """An earlier node that measured exactly what `node` would (the same figures, not worth a second run)."""
        return _same_measurement(self.playbook, node, runs, has_val)

    def run(self, node: str, outcomes: dict[str, Outcome], listener: Listener,
            abandon: Optional[Callable[[], bool]] = None) -> tuple[ExperimentRun, Optional[Outcome]]:
        return run_experiment(self.session, self.playbook, node, outcomes, listener, self.deadline,
                              race=node in self.raced, racing=self.racing, abandon=abandon)

    def pool(self, measure: Callable[[str, Optional[str]], ExperimentRun], measure_in_copy, record,
             outcomes: dict[str, Outcome], listener: Listener, measure_ahead=None) -> Candidates:
        """How a differential's candidates are measured: two at a time in a forked copy where that is safe
        (each on one torch thread: the figures of one at a time on one thread), else one by one."""
        session = self.session
        if self.parallel and can_fork(session.device, current_ranks().world_size,
                                      training_state_bytes(session.setup.model, session.setup.optimizer)):
            try:
                return TwoAtOnce(measure, measure_in_copy, record, outcomes, listener, self.playbook.experiments,
                                 measure_ahead)
            except OSError as exc:
                log.warning("no second process for the candidates (%s); measuring them one by one", exc)
        return OneByOne(measure)


def run_experiment(session: Session, playbook: Playbook, node: str, outcomes: dict[str, Outcome],
                   listener: Listener, deadline: Optional[float] = None,
                   race: bool = False, racing: bool = False,
                   abandon: Optional[Callable[[], bool]] = None) -> tuple[ExperimentRun, Optional[Outcome]]:
    """Run the experiment of a run node or a candidate (`node` is its id) from the restored snapshot.
    `deadline` (time.perf_counter()) is the walk's ceiling: an experiment still running then is cut
    (status "timeout"); None, it runs to its last step. `race`: its replays may stop once out of
    contention (Context.race); `racing`: racing is on in this walk (Context.racing); `abandon`: asked between
    replay steps, True once its figures are no longer wanted (Context.abandon: the replay raises Abandoned,
    which this lets through)."""
    name = playbook.experiments[node]
    experiment = playbook.registry.get(name)
    params = playbook.params[node]
    session.restore()
    left = max(0.0, deadline - time.perf_counter()) if deadline is not None else None
    ctx = Context(session=session, budget_s=left, outcomes=dict(outcomes), progress=listener.progress,
                  params=playbook.params, race=race, racing=racing, abandon=abandon)
    outcome, status, error = None, "ok", None
    anomaly_was_on = torch.is_anomaly_enabled()
    t0 = time.perf_counter()
    try:
        outcome = judged_outcome(experiment.measure(ctx, params), params)
    except Abandoned:
        raise
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
        raise StopWalk(stopped_leaf(failure), failed, failure.summary,
                       failure.ranks if failure.silent else []) from None
    outcome, status, error, seconds = settled.outcome, settled.status, settled.error, settled.seconds
    if status == "ok" and ctx.cut:  # stopped part way by the ceiling, not by its own steps
        status = "timeout"
    run = ExperimentRun(node=node, experiment=name, summary=experiment.summary,
                        params=params.model_dump(mode="json"), status=status, error=error,
                        seconds=round(seconds, 3),
                        outcome=_as_json(outcome) if outcome is not None else None, per_rank=settled.per_rank)
    return run, outcome


def judged_outcome(outcome: Outcome, params: Optional[Params] = None) -> Outcome:
    """The outcome with the judge's reading of it, where it is a counterfactual paired with a reference: the
    experiment measures both, the judge says whether the fix works (experiments/verify.judged), with the
    bars the node's parameters set (the judge's own unless a team's playbook moved them; None: the judge's)."""
    if not isinstance(outcome, ReplayOutcome):
        return outcome
    bars = {name: getattr(params, name) for name in ("margin", "level_margin") if hasattr(params, name)}
    return outcome.model_copy(update=judged(outcome, **bars))


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


def _as_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as report.json will hold it (NaN as "NaN"), so a report equals its own round-trip."""
    return json.loads(outcome.model_dump_json())
