"""The walked path, step by step, at reading size: each node's question, the figures that decided it, and
the branch taken; a differential node names its winner. The whole flowchart is drawn apart (flowchart.py)
and folded away below it.

What decided a step is what the engine recorded: the clauses of the condition that held (Decision.settled),
evaluated on the unrounded figures, never a re-evaluation of the rounded figures shown here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from triage.records import Decision
from triage.report.model import Report
from triage.report import labels

MAX_FIGURES = 4  # shown on a step where no branch held (every figure read decided); the rest counted


@dataclass
class PathStep:
    index: int
    node: str
    kind: str  # "run" | "decision" | "differential"
    title: Optional[str]  # the node's question
    figures: list[tuple[str, str]]  # the deciding figures: name (the node's own without its prefix), value
    hidden: list[str]  # the other figures read, as "name = value" (shown on hover)
    held: list[str]  # the clauses that held; empty where `otherwise` was taken
    condition: Optional[str]  # the whole condition that held (None: otherwise)
    goto: str
    winner: Optional[str] = None  # a differential node: the candidate that won
    winner_cause: Optional[str] = None
    tried: int = 0  # a differential node: candidates tried
    measured: str = ""  # a node whose branches read no figure: what its experiment measured, in a line
    errors: list[str] = field(default_factory=list)

    def quiet(self) -> bool:
        """Found nothing: the branch taken was `otherwise`, and nothing won or failed here."""
        return not self.held and not self.condition and self.winner is None and not self.errors \
            and self.kind != "differential"


@dataclass
class PathEnd:
    node: str
    kind: str  # "leaf", or the node the walk stopped at
    diagnosis: Optional[str]
    title: Optional[str]


@dataclass
class PathView:
    steps: list[PathStep]
    end: Optional[PathEnd]
    nodes: int  # in the playbook

    def blocks(self) -> list[tuple[bool, list[PathStep]]]:
        """The steps in runs: (quiet, steps). A quiet run is two or more steps in a row that found nothing
        (no branch held, no candidate won, nothing failed): the page folds it under one line."""
        runs: list[tuple[bool, list[PathStep]]] = []
        for step in self.steps:
            quiet = step.quiet()
            if runs and runs[-1][0] == quiet:
                runs[-1][1].append(step)
            else:
                runs.append((quiet, [step]))
        return [(quiet and len(steps) > 1, steps) for quiet, steps in runs]


def path_view(report: Report, measured: dict[str, str]) -> PathView:
    """The walk, step by step; `measured`: each experiment's one-line summary, for a node whose
    branches read no figure (its experiment is read by a later decision node)."""
    nodes = {n.id: n for n in report.flowchart.nodes}
    causes = {n.id: n.label for n in report.flowchart.nodes if n.kind == "leaf"}
    steps = [_step(i + 1, d, nodes, causes) for i, d in enumerate(report.decisions)]
    for step in steps:
        if not step.figures and not step.hidden and step.kind == "run":
            step.measured = measured.get(step.node, "")
    last = report.path[-1] if report.path else None
    end = None
    if last is not None and (not report.decisions or report.decisions[-1].goto == last):
        node = nodes.get(last)
        leaf = node is not None and node.kind == "leaf"
        end = PathEnd(node=last, kind=node.kind if node else "stopped", diagnosis=node.label if leaf else None,
                      title=(report.title if last == report.path[-1] and report.status == "complete" else node.title)
                      if leaf else None)
    return PathView(steps=steps, end=end, nodes=len(report.flowchart.nodes))


def _step(index: int, decision: Decision, nodes: dict, causes: dict[str, str]) -> PathStep:
    node = nodes.get(decision.node)
    # Where no branch held, what made each condition fail (the first few), the rest on hover.
    shown = deciding_refs(decision) if decision.when is not None else \
        (decision.deciding or list(decision.figures))[:MAX_FIGURES]
    figures = [(labels.words(k, decision.node), labels.value(k, decision.figures[k])) for k in shown
               if k in decision.figures]
    hidden = [f"{labels.words(k, decision.node)} = {labels.value(k, v)}" for k, v in decision.figures.items()
              if k not in shown]
    step = PathStep(index=index, node=decision.node, kind=node.kind if node else "run",
                    title=node.title if node else None, figures=figures, hidden=hidden,
                    held=[labels.condition_words(c.text, decision.node) for c in decision.settled]
                    if decision.when is not None else [],
                    condition=decision.when, goto=decision.goto,
                    errors=list(decision.errors))
    if decision.candidates:  # a differential: its figures are each candidate's verdict; say who won instead
        winner = next((c for c in decision.candidates if c.winner), None)
        step.figures, step.hidden, step.condition = [], [], None
        step.tried = sum(1 for c in decision.candidates if c.tried and c.then)
        if winner is not None:
            step.winner, step.winner_cause = winner.id, causes.get(winner.then, winner.then)
    return step


def deciding_refs(decision: Decision) -> list[str]:
    """`node.field` figures of the clauses that made `decision.when` hold, as the engine recorded them;
    at a differential node, the winner's verdict. A report written before the engine recorded its
    clauses (schema 1.2) names every figure read."""
    if decision.when is None:
        return []
    if decision.candidates:
        winner = next((c.id for c in decision.candidates if c.winner), None)
        return [k for k in decision.figures if winner is not None and k.startswith(winner + ".")]
    return decision.deciding or list(decision.figures)
