"""What a playbook's nodes read of one another: the controls a node waits for, and the candidates whose figures
only their own differential reads (the ones that may stop once out of contention, judge/race.py)."""

from __future__ import annotations

from typing import Optional

from triage.walk.playbook import Playbook
from triage.walk.playbook.schema import DecisionNode, DifferentialNode, LeafNode, RunNode

# The experiments whose replays can stop part way once out of contention (experiments/replay.py, search.py).
RACED_EXPERIMENTS = ("replay", "lr_search", "init_search")


def names_read(playbook: Playbook, node: Optional[str], *conditions) -> set[str]:
    """The nodes that `node` reads: named by its parameters (`against: restart`), or in its conditions (its
    branches, or, for a candidate, the `if` and `measured` given); with `node` None, those conditions'."""
    spec = playbook.spec(node) if node is not None and node in playbook.graph else None
    if isinstance(spec, (RunNode, DecisionNode)):
        conditions += tuple(c for _, c in playbook.branches(node))
    params = playbook.params.get(node) if node is not None else None
    named = {v for v in params.model_dump().values() if isinstance(v, str)} if params is not None else set()
    return named | {ref for condition in conditions if condition is not None for ref, _ in condition.refs}


def raceable(playbook: Playbook) -> frozenset[str]:
    """The candidates that may stop once they can no longer change their differential's verdict: each leads to
    a cause, runs a replay, and no other node reads it (a condition, a parameter such as `lr_factor_of`, a
    finding, or a leaf other than its own `then` quoting it), so its figures past the point it stopped decide
    nothing anywhere."""
    read: set[str] = {ref for _, condition in playbook.findings for ref, _ in condition.refs}
    for node in playbook.graph:
        spec = playbook.spec(node)
        if isinstance(spec, (RunNode, DecisionNode)):
            read |= names_read(playbook, node)
        elif isinstance(spec, DifferentialNode):
            measured = playbook.measured(node)
            for cid, _, condition in playbook.candidates(node):
                read |= {ref for ref in names_read(playbook, cid, condition, measured.get(cid)) if ref != cid}
    quoted = {(node, ref.split(".")[0]) for node in playbook.graph if isinstance(spec := playbook.spec(node), LeafNode)
              for ref in spec.fix_refs() + list(spec.location.values())}
    out = set()
    for node in playbook.graph:
        spec = playbook.spec(node)
        if not isinstance(spec, DifferentialNode):
            continue
        for cid, candidate, _ in playbook.candidates(node):
            quoted_elsewhere = any(ref == cid and leaf != candidate.then for leaf, ref in quoted)
            if (candidate.then is not None and playbook.experiments[cid] in RACED_EXPERIMENTS
                    and cid not in read and not quoted_elsewhere):
                out.add(cid)
    return frozenset(out)
