"""The verdict in a few lines, as the terminal prints it: the fix, where the fault is, and the proof (the
experiment whose fix worked: what it changed, and the run before and after). Reads only the report."""

from __future__ import annotations

from typing import Any, Optional

from triage.cli.progress import figure, figure_words
from triage.load.disagreements import FINDING_ID as DISAGREEMENT
from triage.report.coordinates import batch_place, nonfinite_step_words, replay_offset
from triage.report.fix_trial import tried
from triage.report.model import Report
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.search import SearchOutcome
from triage.report.outcomes import outcome_of

_NOT_LOCATED = "not narrowed to a module, batch or parameter"


def verdict_lines(report: Report) -> list[tuple[str, str]]:
    """(label, text) pairs, one line each: Fix, Tried (the fix's values: each setting before -> after, from
    which step, the loss with it and without), Where, and Proof (the fix's own experiment) or, where no fix
    was replayed (a data or loop check, a located op, a healthy run), Evidence."""
    trial = tried(report)
    lines = [("Fix", report.fix)] + ([("Tried", trial.sentence())] if trial and trial.changes else [])
    lines += [("Where", where(report)),
             ("Proof" if report.experiment(report.proof or "") else "Evidence", proof(report))]
    return lines + [("Note", f.text) for f in report.findings if f.id == DISAGREEMENT]


def where(report: Report, shown: int = 3) -> str:
    """Whatever the location holds, most specific first: module · op · source, batch, rank, parameters."""
    loc = report.location
    parts = [p for p in (loc.module, loc.op, loc.source) if p]
    if loc.batch is not None:
        parts.append((loc.batch_place or batch_place(report, loc.batch)).words())
    if loc.rank is not None:
        parts.append(f"rank {loc.rank}")
    if loc.parameters:
        names = ", ".join(loc.parameters[:shown])
        more = f" (+{len(loc.parameters) - shown} more)" if len(loc.parameters) > shown else ""
        parts.append(f"parameters {names}{more}")
    return " · ".join(parts) or _NOT_LOCATED


def proof(report: Report) -> str:
    """The fix's own experiment: what it changed, and the run as it was against the run with the fix.
    Where no fix was replayed, the measurement the verdict rests on."""
    run = report.experiment(report.proof) if report.proof else None
    if run is None:
        return _evidence(report)
    replay = outcome_of(run, ReplayOutcome)
    changed = _title(report, run.node) or run.experiment
    chosen = outcome_of(run, SearchOutcome)
    if chosen is not None and chosen.chosen:
        changed += f", {chosen.chosen} chosen"
    against = report.experiment(replay.against) if replay is not None and replay.against else None
    if against is None or replay is None:
        return f"{run.node}: {changed}: measured {_state(replay, at=replay_offset(report, [run]))}"
    before = _state(outcome_of(against, ReplayOutcome), replay.reference_end, replay_offset(report, [against]))
    after = _state(replay, at=replay_offset(report, [run]))
    if before.startswith("end loss") and after.startswith("end loss"):
        after = after.removeprefix("end loss ")
    steps = f"; {replay.steps_run} steps" if replay.steps_run else ""
    return f"{run.node}: {changed}: {before} → {after} ({against.node}, as the run was → with the fix{steps})"


def _state(replay: Optional[ReplayOutcome], end: Optional[Any] = None, at: Optional[int] = None) -> str:
    """How a replay ended: non-finite at a step (the run's, where `at`, its step of replay step 0, is
    known), or its end loss."""
    if replay is not None and replay.finite is False:
        return f"non-finite at {nonfinite_step_words(replay.first_nonfinite_step, at)}"
    end = end if end is not None else replay.loss_end if replay is not None else None
    return f"end loss {figure(end)}" if end is not None else "nothing measured"


def _evidence(report: Report) -> str:
    """No fix was replayed for this verdict: what the evidence measured, from the last evidence node whose
    branch found something (the first evidence node where none did, as for a healthy run)."""
    decisions = {d.node: d for d in report.decisions}
    unverified = report.unverified_proof  # a fix replayed for this verdict that did not verify (a loop bug's)
    found = [decisions[n] for n in report.evidence if n in decisions and n != unverified]
    decision = next((d for d in reversed(found) if d.when is not None), found[0] if found else None)
    if decision is None:
        return "no experiment to show"
    figures = figure_words(decision, decision.node)
    said = f' "{decision.answer}"' if decision.answer else ""
    how = f"its fix replayed at {unverified} did not verify" if unverified else "no fix replayed"
    return f"measured at {decision.node}, {how}:{said}" + (f" ({figures})" if figures else "")


def _title(report: Report, node: str) -> Optional[str]:
    for graph_node in report.flowchart.nodes:
        if graph_node.id == node:
            return graph_node.title
        for candidate in graph_node.candidates:
            if candidate.id == node:
                return candidate.title
    return None

