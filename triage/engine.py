"""The engine: walks the playbook's graph, running each node's experiment from the restored snapshot.

It owns what every experiment needs and none should write: restore, seed, budget, timing,
and turning a raising or out-of-memory experiment into an ExperimentRun that says so.
"""

from __future__ import annotations

import json
import logging
import math
import time
import traceback
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from triage.experiments import Context, Outcome
from triage.playbook import Playbook
from triage.records import Decision, ExperimentRun, SetupFacts
from triage.playbook.schema import LeafNode, RunNode
from triage.session import Session

log = logging.getLogger(__name__)


class Listener(Protocol):
    """What the terminal view (or a test) hears while the walk goes on."""

    def started(self, node: str, experiment: str, title: Optional[str]) -> None: ...
    def progress(self, done: int, total: int) -> None: ...
    def finished(self, run: ExperimentRun, decision: Decision) -> None: ...
    def close(self) -> None: ...


class SilentListener:
    def started(self, node, experiment, title): pass
    def progress(self, done, total): pass
    def finished(self, run, decision): pass
    def close(self): pass


@dataclass
class Walk:
    """Everything the walk measured and decided, ready for the report."""

    path: list[str]
    leaf: LeafNode
    runs: dict[str, ExperimentRun]
    outcomes: dict[str, Outcome]
    decisions: list[Decision]
    setup_facts: SetupFacts
    seconds: float = 0.0

    def lookup(self, node: str, name: str) -> Any:
        return lookup(node, name, self.setup_facts, self.runs, self.outcomes)


def setup_facts(session: Session) -> SetupFacts:
    s = session.setup
    return SetupFacts(
        precision=s.precision, grad_clip=s.grad_clip, has_scheduler=s.scheduler is not None,
        has_train_step=s.train_step is not None, has_val=bool(session.val_batches),
        total_steps=s.total_steps, device_type=session.device.type,
        checkpoint_step=session.checkpoint.step if session.checkpoint else None,
        batch_count=len(session.batches),
    )


def lookup(node: str, name: str, facts: SetupFacts, runs: dict[str, ExperimentRun],
           outcomes: dict[str, Outcome]) -> Any:
    """The value a condition's `node.name` reads: None when it was not measured."""
    if node == "setup":
        return getattr(facts, name)
    run = runs.get(node)
    if run is None:
        return None
    if name in ("status", "seconds"):
        return getattr(run, name)
    if run.status != "ok":  # a partial measurement would make the verdict depend on machine speed
        return None
    return getattr(outcomes.get(node), name, None)


def walk(session: Session, playbook: Playbook, listener: Optional[Listener] = None) -> Walk:
    listener = listener or SilentListener()
    facts = setup_facts(session)
    runs: dict[str, ExperimentRun] = {}
    outcomes: dict[str, Outcome] = {}
    decisions: list[Decision] = []
    path = [playbook.entry]
    node = playbook.entry
    started = time.perf_counter()
    try:
        while isinstance(spec := playbook.spec(node), RunNode):
            listener.started(node, spec.run, spec.title)
            run, outcome = run_experiment(session, playbook, node, outcomes, listener)
            runs[node] = run
            if outcome is not None:
                outcomes[node] = outcome
            decision = _decide(playbook, node, facts, runs, outcomes)
            decisions.append(decision)
            listener.finished(run, decision)
            node = decision.goto
            path.append(node)
    finally:
        listener.close()
        session.restore()  # leave the user's objects as they were handed to us
    return Walk(path=path, leaf=spec, runs=runs, outcomes=outcomes, decisions=decisions,
                setup_facts=facts, seconds=time.perf_counter() - started)


def run_experiment(session: Session, playbook: Playbook, node: str, outcomes: dict[str, Outcome],
                   listener: Listener) -> tuple[ExperimentRun, Optional[Outcome]]:
    spec: RunNode = playbook.spec(node)
    experiment = playbook.registry.get(spec.run)
    params = playbook.params[node]
    session.restore()
    ctx = Context(session=session, budget_s=spec.budget_s, outcomes=dict(outcomes), progress=listener.progress)
    outcome, status, error = None, "ok", None
    anomaly_was_on = torch.is_anomaly_enabled()
    t0 = time.perf_counter()
    try:
        outcome = experiment.measure(ctx, params)
    except torch.OutOfMemoryError:
        status, error = "oom", traceback.format_exc()
    except Exception:
        status, error = "error", traceback.format_exc()
        log.warning("experiment %s at node %s raised:\n%s", spec.run, node, error)
    finally:
        torch.autograd.set_detect_anomaly(anomaly_was_on)  # an experiment that raised may have left it on
    seconds = time.perf_counter() - t0
    if status == "ok" and (seconds > spec.budget_s or getattr(outcome, "truncated", False)):
        status = "timeout"
    run = ExperimentRun(node=node, experiment=spec.run, summary=experiment.summary,
                        params=params.model_dump(mode="json"), status=status, error=error,
                        seconds=round(seconds, 3),
                        outcome=_as_json(outcome) if outcome is not None else None)
    return run, outcome


def _decide(playbook: Playbook, node: str, facts, runs, outcomes) -> Decision:
    def read(n: str, name: str) -> Any:
        return lookup(n, name, facts, runs, outcomes)

    figures: dict[str, Any] = {}
    for target, condition in playbook.branches(node):
        if condition is None:
            return Decision(node=node, goto=target, when=None, figures=figures)
        figures.update({f"{n}.{name}": _figure(read(n, name)) for n, name in sorted(condition.refs)})
        if condition.evaluate(read):
            return Decision(node=node, goto=target, when=condition.text, figures=figures)
    raise AssertionError("a validated run node always has an `otherwise` edge")


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
