"""Assembling the Report from what the walk measured and decided."""

from __future__ import annotations

import datetime as dt
import logging
import platform
import sys
from typing import Any, Optional

import pydantic
import torch

from triage.causes import ROOT_CAUSES
from triage.judge.differential import CLOSE
from triage.judge.fix import DEFAULT_LEVEL_MARGIN, DEFAULT_MARGIN
from triage.load.disagreements import FINDING_ID as DISAGREEMENT, finding_text
from triage.report.distributed import distributed_info
from triage.walk.engine import CONFIDENCE_ORDER, Walk
from triage.walk.playbook import Playbook, parse_condition
from triage.walk.playbook.schema import DecisionNode, DifferentialNode, Finding, LeafNode, filled
from triage.report.coordinates import batch_place
from triage.report.fix_trial import tried
from triage.report.model import (CheckpointInfo, Environment, FindingRecord, Flowchart, GraphCandidate,
                                 GraphEdge, GraphNode, Location, Report)
from triage.load.session import Session

log = logging.getLogger(__name__)


def _capture_rank(session: Session) -> dict[str, Optional[int]]:
    """The rank that wrote the capture, the world size and the steps its batches were used at, as its
    manifest recorded them."""
    manifest = session.checkpoint.manifest if session.checkpoint else None
    if manifest is None:
        return {}
    # The steps name the snapshot's batches only where setup() gave the capture's batches (load_batches()):
    # as many, in the manifest's order. A setup() that reads other data keeps snapshot indices.
    same = len(manifest.batch_steps) == len(session.batches)
    return {"capture_rank": manifest.rank, "capture_world_size": manifest.world_size,
            "batch_steps": manifest.batch_steps if same and manifest.batch_steps else None}


def build_report(walk: Walk, session: Session, playbook: Playbook, command: str,
                 checkpoint_path: Optional[str]) -> Report:
    from triage import __version__

    leaf: LeafNode = walk.leaf if walk.leaf is not None else _unfinished(walk)
    held = _held_findings(playbook, walk)
    # A proof whose fix did not verify (a loop bug the reference loop did not clearly beat) is evidence only.
    unverified = leaf.proof in walk.runs and getattr(walk.outcomes.get(leaf.proof), "fix_works", None) is False
    proof = leaf.proof if leaf.proof in walk.runs and not unverified else None
    report = Report(
        status=walk.status,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        root_cause=leaf.diagnosis,
        title=leaf.title or ROOT_CAUSES[leaf.diagnosis],
        confidence=min([walk.confidence] + [f.confidence for f in held if f.confidence],
                       key=CONFIDENCE_ORDER.index),
        fix=leaf.fix_text(walk.lookup),
        proof=proof, unverified_proof=leaf.proof if unverified else None,
        evidence=[n for n in leaf.evidence if n in walk.runs] + ([leaf.proof] if unverified else []),
        location=_location(leaf, walk),
        findings=[FindingRecord(id=f.id, text=filled(f.text, walk.lookup), evidence=[n for n in f.evidence if n in walk.runs])
                  for f in held] + _session_findings(session) + _judge_overridden(playbook, walk),
        path=walk.path,
        decisions=walk.decisions,
        experiments=list(walk.runs.values()),
        views=_views(playbook, walk),
        flowchart=flowchart(playbook),
        history=session.history,
        checkpoint=CheckpointInfo(
            path=checkpoint_path,
            layout=session.checkpoint.layout if session.checkpoint else None,
            step=session.checkpoint.step if session.checkpoint else None,
            step_source=session.checkpoint.step_source if session.checkpoint else None,
            **_capture_rank(session),
        ),
        environment=Environment(
            triage=__version__, torch=torch.__version__, python=sys.version.split()[0],
            platform=platform.platform(), device=str(session.device), precision=session.setup.precision,
            seed=session.seed, playbook=playbook.name, playbook_sha256=playbook.sha256,
            distributed=distributed_info(session, command),
        ),
        command=command,
        seconds=round(walk.seconds, 2),
        stopped=walk.stopped,
        cut=walk.cut,
    )
    if report.location.batch is not None:
        report = report.model_copy(update={"location": report.location.model_copy(
            update={"batch_place": batch_place(report, report.location.batch)})})
    return report.model_copy(update={"fix_trial": tried(report, walk.setup_facts.weight_decay)})


def _views(playbook: Playbook, walk: Walk) -> dict[str, list]:
    """The views of every experiment that ran, as each declared them."""
    names = sorted({run.experiment for run in walk.runs.values()})
    return {name: list(experiment.views) for name in names if (experiment := playbook.registry.get(name))}


def _unfinished(walk: Walk) -> LeafNode:
    """The stand-in verdict of a walk that reached no leaf: `interrupted` (Ctrl-C) or `incomplete` (the
    journal's report.json while triage runs, left as it is if triage stops without finishing)."""
    at, done = walk.path[-1] if walk.path else "?", len(walk.runs)
    if walk.status == "interrupted":
        return LeafNode(diagnosis="interrupted", title="Triage was interrupted before a verdict", confidence="low",
                        fix=f"No verdict: triage was stopped at node '{at}', after {done} experiments (below, as "
                            "measured). Re-run the command below for the verdict.", evidence=list(walk.runs))
    return LeafNode(diagnosis="incomplete", title="Triage has not reached a verdict (yet)", confidence="low",
                    fix=f"No verdict: this report was saved at node '{at}', after {done} experiments. If triage is "
                        "no longer running, it stopped without finishing; re-run the command below.",
                    evidence=list(walk.runs))


def flowchart(playbook: Playbook) -> Flowchart:
    nodes = []
    for node_id, data in playbook.graph.nodes(data=True):
        spec = data["spec"]
        if isinstance(spec, LeafNode):
            nodes.append(GraphNode(id=node_id, kind="leaf", label=spec.diagnosis, title=spec.title))
        elif isinstance(spec, DecisionNode):
            nodes.append(GraphNode(id=node_id, kind="decision", label="decision", title=spec.title))
        elif isinstance(spec, DifferentialNode):
            candidates = [GraphCandidate(id=cid, experiment=c.run, title=c.title, then=c.then, tier=c.tier)
                          for cid, c in spec.differential.items()]
            nodes.append(GraphNode(id=node_id, kind="differential", label="differential", title=spec.title,
                                   candidates=candidates))
        else:
            nodes.append(GraphNode(id=node_id, kind="run", label=spec.run, title=spec.title))
    edges = [GraphEdge(source=u, target=v, labels=d["labels"]) for u, v, d in playbook.graph.edges(data=True)]
    return Flowchart(name=playbook.name, nodes=nodes, edges=edges)


def _location(leaf: LeafNode, walk: Walk) -> Location:
    """The leaf's location fields; one whose value does not fit its field is left out (and logged)."""
    values: dict[str, Any] = {}
    for key, reference in leaf.location.items():
        value = parse_condition(reference).value(walk.lookup, errors := [])
        if errors:
            log.warning("location %s: %s", key, "; ".join(errors))
        if value in (None, [], ""):
            continue
        if key == "parameters":
            value = [value] if isinstance(value, str) else [str(v) for v in value] \
                if isinstance(value, (list, tuple)) else [str(value)]
        try:
            Location(**{key: value})
        except pydantic.ValidationError:
            log.warning("location %s: %r does not fit the field; left out", key, value)
            continue
        values[key] = value
    return Location(**values)


def _session_findings(session: Session) -> list[FindingRecord]:
    """Findings about the inputs themselves, noticed while the experiments ran (not by a playbook node)."""
    guard = session.data_guard
    loading = getattr(session, "load_notes", [])  # what loading mapped or left out (session.py)
    found = [FindingRecord(id=fid, text=text) for fid, text in [*loading, *(guard.findings() if guard else [])]]
    disagree = finding_text(session.disagreements)
    return found + ([FindingRecord(id=DISAGREEMENT, text=disagree)] if disagree else [])


# The judge's bars for a verified fix that a playbook may set per node, with the judge's own values.
_JUDGE_RULES = (("margin", DEFAULT_MARGIN), ("level_margin", DEFAULT_LEVEL_MARGIN))


def _judge_overridden(playbook: Playbook, walk: Walk) -> list[FindingRecord]:
    """Where the playbook, on purpose, sets its own bar for a verified fix (`margin`, `level_margin`) or for a
    close rival (`close`) at a node this walk ran: the verdict then follows the team's rule, not the judge's,
    and says so."""
    moved: dict[str, list[str]] = {}
    for node, params in sorted(playbook.params.items()):
        if node not in walk.runs:
            continue
        for name, judge_value in _JUDGE_RULES:
            value = getattr(params, name, judge_value)
            if value != judge_value:
                moved.setdefault(f"{name} {value:g} (the judge's {judge_value:g})", []).append(node)
    for decision in walk.decisions:
        spec = playbook.spec(decision.node) if decision.node in playbook.graph else None
        if isinstance(spec, DifferentialNode) and decision.candidates and spec.close != CLOSE:
            moved.setdefault(f"close {spec.close:g} (the judge's {CLOSE:g})", []).append(decision.node)
    if not moved:
        return []
    said = "; ".join(f"{rule} at {', '.join(nodes)}" for rule, nodes in moved.items())
    return [FindingRecord(id="judge_overridden", evidence=[], text=(
        f"This playbook sets its own bar where the judge (triage/judge/) has one: {said}. A fix counts as "
        "verified, and a rival as close, by the team's rule there, not the judge's."))]


def _held_findings(playbook: Playbook, walk: Walk) -> list[Finding]:
    """The playbook's findings whose condition holds on what the walk measured."""
    errors: list[str] = []
    verdict = walk.path[-1] if walk.leaf is not None and walk.path else None  # said as the verdict: not again
    found = [f for f, condition in playbook.findings if f.id != verdict and condition.evaluate(walk.lookup, errors)]
    for error in errors:
        log.warning("finding: %s", error)
    return found
