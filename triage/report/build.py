"""Assembling the Report from what the walk measured and decided."""

from __future__ import annotations

import datetime as dt
import platform
import sys
from typing import Any, Optional

import torch

from triage.causes import ROOT_CAUSES
from triage.distributed.describe import distributed_info
from triage.engine import Walk
from triage.playbook import Playbook, parse_condition
from triage.playbook.schema import DecisionNode, DifferentialNode, LeafNode
from triage.report.model import (CheckpointInfo, Environment, FindingRecord, Flowchart, GraphCandidate,
                                 GraphEdge, GraphNode, Location, Report)
from triage.session import Session


def build_report(walk: Walk, session: Session, playbook: Playbook, command: str,
                 checkpoint_path: Optional[str]) -> Report:
    from triage import __version__

    leaf: LeafNode = walk.leaf
    return Report(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        root_cause=leaf.diagnosis,
        title=leaf.title or ROOT_CAUSES[leaf.diagnosis],
        confidence=walk.confidence,
        fix=leaf.fix,
        proof=leaf.proof if leaf.proof in walk.runs else None,
        evidence=[n for n in leaf.evidence if n in walk.runs],
        location=_location(leaf, walk),
        findings=_findings(playbook, walk),
        path=walk.path,
        decisions=walk.decisions,
        experiments=list(walk.runs.values()),
        flowchart=flowchart(playbook),
        history=session.history,
        checkpoint=CheckpointInfo(
            path=checkpoint_path,
            layout=session.checkpoint.layout if session.checkpoint else None,
            step=session.checkpoint.step if session.checkpoint else None,
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
    )


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
    values: dict[str, Any] = {}
    for key, reference in leaf.location.items():
        value = parse_condition(reference).value(walk.lookup)
        if value in (None, [], ""):
            continue
        if key == "parameters":
            values[key] = [value] if isinstance(value, str) else [str(v) for v in value]
        else:
            values[key] = value
    return Location(**values)


def _findings(playbook: Playbook, walk: Walk) -> list[FindingRecord]:
    return [FindingRecord(id=f.id, text=f.text, evidence=[n for n in f.evidence if n in walk.runs])
            for f, condition in playbook.findings if condition.evaluate(walk.lookup)]
