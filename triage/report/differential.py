"""The report's view of a differential node: every candidate fix side by side, and why the winner won."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from triage.records import CandidateResult, Decision, ExperimentRun
from triage.report import figures, plots
from triage.report.model import Report
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.verify import VerifiedFix
from triage.report.outcomes import outcome_of, read_as


@dataclass
class CandidateRow:
    id: str
    title: Optional[str]
    cause: str  # the diagnosis it stands for; "control" for a reference run
    tier: Optional[int]
    tried: bool
    status: str  # ok / error / oom / timeout, or why it did not run
    end: Any  # end-window loss
    reference_end: Any
    improvement: Any
    sane: Any
    works: Optional[bool]
    winner: bool
    also_works: bool


@dataclass
class DifferentialView:
    node: str
    title: Optional[str]
    confidence: Optional[str]
    rows: list[CandidateRow]
    reason: str
    plot: Optional[str]


Curve = Callable[[Optional[ExperimentRun]], list[Any]]  # a run's headline curve (its loss per step)


def differential_views(report: Report, curve: Curve) -> list[DifferentialView]:
    return [_view(report, d, curve) for d in report.decisions if d.candidates]


def _view(report: Report, decision: Decision, curve: Curve) -> DifferentialView:
    causes = {n.id: n.label for n in report.flowchart.nodes if n.kind == "leaf"}
    titles = {n.id: n.title for n in report.flowchart.nodes}
    declared = {c.id: c for n in report.flowchart.nodes for c in n.candidates}
    rows = []
    for c in decision.candidates:
        run = report.experiment(c.id)
        fix = outcome_of(run, ReplayOutcome) or read_as(ReplayOutcome, {})
        rows.append(CandidateRow(
            id=c.id, title=declared[c.id].title if c.id in declared else None, cause=causes.get(c.then, c.then) if c.then else "control",
            tier=c.tier if c.then else None, tried=c.tried,
            status=_status(run, c),
            end=fix.loss_end, reference_end=fix.reference_end,
            improvement=fix.improvement, sane=fix.sane, works=c.works,
            winner=c.winner, also_works=c.also_works))
    return DifferentialView(node=decision.node, title=titles.get(decision.node), confidence=decision.confidence,
                            rows=rows, reason=reason(decision, causes), plot=_plot(report, decision, curve))


def _status(run: Optional[ExperimentRun], candidate: CandidateResult) -> str:
    if run is not None and run.status == "not_applicable":
        return f"not applicable: {run.error}"
    if run is not None and candidate.raced_out:
        return candidate.raced_out
    if run is not None:
        return run.status
    if candidate.outranked:
        return "outranked (a fix of a lower tier works)"
    if candidate.unneeded:
        return "not run (a control: no candidate tried is compared with it)"
    return "not tried (its condition did not hold)"


def _unfinished(decision: Decision) -> str:
    """The candidates whose fix is unknown (they raised, ran out of memory or time, or do not apply):
    nothing was ruled out by them."""
    failed = [f"{c.id} ({c.status.replace('_', ' ')})" for c in decision.candidates
              if c.then and c.status not in (None, "ok")]
    return (f" Not measured to the end, so nothing is ruled out by them: {', '.join(failed)}." if failed else "")


def _raced(decision: Decision) -> str:
    """The candidates stopped before their last step, once their own figures showed they could no longer
    work (judge/race.py)."""
    raced = [c.id for c in decision.candidates if c.raced_out]
    return (f" Stopped before their last step, as they could no longer work: {', '.join(raced)}." if raced else "")


def reason(decision: Decision, causes: dict[str, str]) -> str:
    """Why the winner won, in a sentence a person can check against the table."""
    tried = [c for c in decision.candidates if c.tried and c.then and c.status in (None, "ok")]
    winner = next((c for c in tried if c.winner), None)
    unfinished = _unfinished(decision) + _raced(decision)
    if winner is None:
        return (f"None of the {len(tried)} candidate fixes measured works (finite, clearly better "
                "than the run as it was, at a sane level and, with validation data, lower on it too), so none of "
                "their causes is verified."
                + unfinished)
    name = causes.get(winner.then, winner.then)
    text = f"{winner.id} ({name}) wins: its fix works"
    capped = f" Medium confidence at most: {winner.cap_reason}." if winner.cap_reason else ""
    outranked = [c.id for c in decision.candidates if c.outranked]
    skipped = (f" Not run, as a fix of a lower tier already worked: {', '.join(outranked)}." if outranked
               else "")
    working = [c for c in tried if c.works and c is not winner]
    rivals = [c for c in working if causes.get(c.then, c.then) != name]
    if not rivals:
        return text + " and no competing cause's fix does." + skipped + unfinished + capped
    lower_tier = [c.id for c in rivals if c.tier > winner.tier]
    same_tier = [c.id for c in rivals if c.tier == winner.tier]
    parts = []
    if lower_tier:
        parts.append(f"{', '.join(lower_tier)} also work but stand for more general causes (a lower tier) "
                     "that may only mask this one")
    if same_tier:
        parts.append(f"{', '.join(same_tier)} also work at the same tier and end higher")
    close = [c.id for c in rivals if c.also_works]
    tail = (f"; {', '.join(close)} came close, so the verdict is medium confidence" if close
            else "; every competitor ended clearly worse")
    return f"{text}; " + "; ".join(parts) + tail + "." + skipped + unfinished + capped


def _paired(run: Optional[ExperimentRun]) -> bool:
    fix = outcome_of(run, VerifiedFix)
    return fix is not None and isinstance(fix.against, str)


def _plot(report: Report, decision: Decision, curve: Curve) -> Optional[str]:
    """The tried candidates' loss curves on one axis, with the run as it was (`against`, the run each
    candidate's verification is paired with). A candidate verified against a run of its own (one scored
    by another loss, say) is left out: its curve is in another unit, and its own section draws it."""
    series = []
    tried = [c for c in decision.candidates if c.tried and c.then and _paired(report.experiment(c.id))]
    references = {outcome_of(report.experiment(c.id), VerifiedFix).against for c in tried}  # paired: read
    for ref in sorted(r for r in references if isinstance(r, str)):
        losses = curve(report.experiment(ref))
        if losses:
            series.append(figures.Series(label=f"{ref} (as the run was)", values=losses, color=figures.BASELINE,
                                       emphasis=False))
    for i, c in enumerate(tried):
        losses = curve(report.experiment(c.id))
        if losses:
            color = figures.GOOD if c.winner else figures.PALETTE[(i + 2) % len(figures.PALETTE)]
            series.append(figures.Series(label=c.id, values=losses, color=color, emphasis=c.winner or bool(c.works),
                                       dashed=not c.works))
    if len(series) < 2:
        return None
    return plots.loss_curves(series, title=f"Candidate fixes at {decision.node}: loss per step", wide=True)
