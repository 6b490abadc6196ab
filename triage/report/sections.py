"""What the templates show, prepared from a Report: the views each experiment declared, drawn, and the
sentences and tables around them, as plain data.

A generic renderer: what to draw of an outcome comes from its experiment's declarations (Report.views,
see triage/views.py), never from the names of the outcome's fields. Outcomes arrive as dicts (report.json
turns NaN and inf into strings); a declared field that is missing or oddly shaped leaves its view out,
not the page. An outcome's figures that no view draws are listed beside the views, and its lists of
records that none shows become tables, so an experiment that declares nothing still shows what it measured.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from triage.records import Decision, ExperimentRun
from triage.report import figures, plots
from triage.report.differential import DifferentialView, differential_views
from triage.report.model import Report
from triage.report.path import PathView, deciding_refs, path_view
from triage.report.rank_section import RankSection, rank_section
from triage.report import labels
from triage.report.coordinates import BatchPlace, batch_place, nonfinite_step_words, replay_offset, step_axis
from triage.report.fix_trial import FixTrial, tried
from triage.report.kind import HEADINGS, verdict_kind
from triage.report.words import describe_change, format_figure
from triage.views import Bars, Curve, SourceExcerpt, Table as TableView, View

__all__ = ["Views", "build_views", "capped_by", "describe_change", "format_figure", "key_figures", "summary_views"]

# How a counterfactual is judged, not what it changes.
_VERIFICATION_PARAMS = {"against", "margin", "level_margin", "extend_to"}
_TONES = {"neutral": figures.BASELINE, "good": figures.GOOD, "bad": figures.BAD}


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[list[str]]
    more: int = 0
    caption: str = ""


@dataclass
class Plot:
    caption: str
    svg: str  # generated here by matplotlib: its text is escaped


@dataclass
class Excerpt:
    """The user's source around a line: (line number, text, the line pointed at)."""

    title: str
    file: str
    lines: list[tuple[int, str, bool]]
    caption: str = ""


Drawn = Union[Plot, Excerpt, Table]


@dataclass
class ExperimentView:
    run: ExperimentRun
    index: int
    anchor: str
    title: Optional[str]
    role: str  # "proof", "evidence" or ""
    reference: Optional[str]
    compared: bool  # other runs of this experiment are compared with this one
    changes: list[str]
    measured: str
    figures: list[tuple[str, str, bool, str]]  # words, value with its unit, read by a decision, meaning
    plots: list[Plot]
    excerpts: list[Excerpt]
    tables: list[Table]
    decision: Optional[Decision]


@dataclass
class LocationRow:
    name: str
    values: list[str]
    more: int = 0  # values left out (a long parameter list)
    kind: Optional[str] = None  # a module's class
    after: Optional[str] = None  # a bare Sequential index: the layer before it
    after_kind: Optional[str] = None
    note: Optional[str] = None  # words after the values: what the batch's step or tensor is


@dataclass
class Views:
    """Everything report.html.j2 shows beyond the Report's own fields."""

    experiments: list[ExperimentView]
    anchors: dict[str, str]
    proof: Optional[ExperimentView]
    proof_plot: Optional[str]
    proof_table: list[tuple[str, str, str]]  # figure, reference, proof
    overview_plot: Optional[str]
    history_plot: Optional[str]
    location: list[LocationRow]
    source: Optional[Excerpt]  # the located line, where an experiment read the user's source
    key_figures: list[tuple[str, str]]
    path: PathView
    titles: dict[str, Optional[str]] = field(default_factory=dict)
    differentials: list[DifferentialView] = field(default_factory=list)
    ranks: Optional[RankSection] = None  # a distributed run: where the ranks differed
    kind: str = "verified"  # how the verdict looks (report/kind.py)
    headings: tuple[str, str] = ("Root cause", "Fix")  # what the verdict and its fix box are called
    fix_trial: Optional[FixTrial] = None  # the proof's replay in values
    capped: Optional[str] = None  # why the verdict's winning fix may claim less than high (capped_by)


def build_views(report: Report) -> Views:
    anchors = {run.node: f"exp-{i + 1}" for i, run in enumerate(report.experiments)}
    titles = {node.id: node.title for node in report.flowchart.nodes}
    decisions = {d.node: d for d in report.decisions}
    read = {tuple(key.split(".", 1)) for d in report.decisions for key in d.figures if "." in key}
    references = _references(report)
    experiments = []
    for i, run in enumerate(report.experiments):
        reference = references.get(run.node)
        declared = report.views.get(run.experiment, [])
        at = _run_steps(report, [run] + ([reference] if reference else []))
        drawn = [d for view in declared if (d := draw(view, run, reference, at)) is not None]
        shown = {name for view in declared for name in view.shows()}
        role = "proof" if run.node == report.proof else "evidence" if run.node in report.evidence else ""
        experiments.append(ExperimentView(
            run=run, index=i + 1, anchor=anchors[run.node], title=titles.get(run.node), role=role,
            reference=reference.node if reference and reference.node != run.node else None,
            compared=any(references[o.node].node == run.node for o in report.experiments if o.node != run.node),
            changes=changes(report, run, reference),
            measured=measured(report, run, _own_figures(decisions.get(run.node), run.node)),
            figures=[(labels.words(k), labels.value(k, v), (run.node, k) in read, labels.meaning(k, run.experiment))
                     for k, v in scalars(run.outcome, shown)],
            plots=[d for d in drawn if isinstance(d, Plot)],
            excerpts=[d for d in drawn if isinstance(d, Excerpt)],
            tables=[d for d in drawn if isinstance(d, Table)] + record_tables(run.outcome, shown),
            decision=decisions.get(run.node)))
    proof = next((e for e in experiments if e.role == "proof"), None)
    proof_reference = references.get(report.proof) if report.proof else None
    return Views(
        experiments=experiments, anchors=anchors, proof=proof,
        proof_plot=_proof_plot(report, proof.run, proof_reference) if proof else None,
        proof_table=_proof_table(report, proof.run if proof else None, proof_reference),
        overview_plot=_overview_plot(report, references),
        history_plot=_history_plot(report),
        location=_location(report), source=_source(report, experiments),
        key_figures=key_figures(report), path=path_view(report, {e.run.node: e.measured for e in experiments}),
        titles=titles,
        differentials=differential_views(report, lambda run: headline_values(report, run)),
        ranks=rank_section(report),
        kind=verdict_kind(report), headings=HEADINGS[verdict_kind(report)], fix_trial=tried(report),
        capped=capped_by(report),
    )


# --- one declared view, drawn --------------------------------------------------------------------

def draw(view: View, run: ExperimentRun, reference: Optional[ExperimentRun],
         at: Optional[tuple[int, str]] = None) -> Optional[Drawn]:
    """`view` of `run`'s outcome (`reference`: the run it is compared with); None when there is nothing
    to draw (a field missing, empty, or of another shape than declared). `at`: (the run's step of replay
    step 0, the x label saying so), to draw a curve per replay step at the run's own steps."""
    outcome = run.outcome or {}
    if isinstance(view, Curve):
        return _curve(view, run, reference, at if _per_replay_step(view) else None)
    if isinstance(view, Bars):
        return _bars(view, outcome)
    if isinstance(view, SourceExcerpt):
        return _excerpt(view, outcome)
    if isinstance(view, TableView):
        return _table(view, outcome)
    return None


def _per_replay_step(view: Curve) -> bool:
    """A curve whose x is the replay's step count (0, 1, 2, ...), not a field of its own (LRs, steps)."""
    return view.x is None and view.xlabel == "step"


def _run_steps(report: Report, runs: list[ExperimentRun]) -> Optional[tuple[int, str]]:
    """(the run's step of replay step 0, the x label) where the runs drawn on one axis all continue from the
    checkpoint and its step is known; None: keep replay steps."""
    offset = replay_offset(report, runs)
    return (offset, step_axis(report)) if offset is not None else None


def _shifted(series: Optional[figures.Series], at: Optional[tuple[int, str]]) -> Optional[figures.Series]:
    """`series` drawn at the run's steps: each x (its own, else its index) and its first non-finite step
    moved by the offset."""
    if series is None or at is None:
        return series
    xs = series.steps if series.steps is not None else range(len(series.values))
    bad = series.first_nonfinite
    return dataclasses.replace(series, steps=[figures.number(x) + at[0] for x in xs],
                               first_nonfinite=bad + at[0] if bad is not None else None)


def _curve(view: Curve, run: ExperimentRun, reference: Optional[ExperimentRun],
           at: Optional[tuple[int, str]] = None) -> Optional[Plot]:
    outcome = run.outcome or {}
    values = _list(outcome, view.field)
    if not values or (view.hide_if_constant and not _varies(values)):
        return None
    against = reference if view.against and reference is not None and reference.node != run.node else None
    # The run the others are compared with is drawn grey wherever it appears; any other run in colour.
    is_reference = view.against is not None and against is None
    series = []
    if against is not None:
        series.append(_series(view, against, figures.BASELINE, against.node, emphasis=False))
    series.append(_series(view, run, figures.BASELINE if is_reference else figures.INTERVENTION, view.label or run.node))
    for line in view.lines:
        ys = _list(outcome, line.field)
        steps = _list(outcome, line.steps) if line.steps else None
        if ys and (steps is None or len(steps) == len(ys)):
            series.append(figures.Series(
                label=line.label, values=ys, color=figures.BASELINE if line.style == "reference" else figures.GOOD,
                steps=[figures.number(s) + line.step_offset for s in steps] if steps else None,
                dashed=line.style == "dashed", emphasis=line.style != "reference"))
    threshold = figures.number(outcome.get(view.threshold)) if view.threshold else math.nan
    svg = plots.curves(
        [_shifted(s, at) for s in series if s is not None],
        view.title + (f": {run.node} vs {against.node}" if against else ""), xlabel=at[1] if at else view.xlabel, ylabel=view.ylabel, log_x=view.log_x, log_y=view.log_y,
        hline=(threshold, f"{view.threshold_label} {threshold:g}") if math.isfinite(threshold) else None,
        marks=[_mark(view, m, outcome) for m in view.marks if math.isfinite(figures.number(outcome.get(m.field)))])
    return Plot(view.caption, svg) if svg else None


def _series(view: Curve, run: ExperimentRun, color: str, label: str, emphasis: bool = True) -> Optional[figures.Series]:
    outcome = run.outcome or {}
    values = _list(outcome, view.field)
    if not values:
        return None
    xs = _list(outcome, view.x) if view.x else None
    bad = outcome.get(view.nonfinite_step) if view.nonfinite_step else None
    return figures.Series(label=label, values=values, steps=xs if xs and len(xs) == len(values) else None,
                        color=color, emphasis=emphasis,
                        first_nonfinite=bad if isinstance(bad, int) and not isinstance(bad, bool) else None)


def _mark(view: Curve, mark, outcome: dict[str, Any]) -> figures.Mark:
    """`checkpoint (step 80): learning rate 0.0345`: where it is, and the curve's value there."""
    x = figures.number(outcome.get(mark.field))
    label = f"{mark.label} ({view.xlabel} {x:.3g})"
    ys, xs = figures.numbers(_list(outcome, view.field)), _list(outcome, view.x) if view.x else None
    xs = figures.numbers(xs) if xs and len(xs) == len(ys) else list(range(len(ys)))
    at = [y for x0, y in zip(xs, ys) if x0 == x and math.isfinite(y)]
    if at and not view.log_x:
        label += f": {view.ylabel or view.field} {at[0]:.3g}"
    return figures.Mark(x=x, label=label, color=_TONES[mark.tone])


def _bars(view: Bars, outcome: dict[str, Any]) -> Optional[Plot]:
    items = _list(outcome, view.field)
    if view.value:  # records: a named bar per record that holds a value
        rows = [(str(row.get(view.labels, f"#{i}")) if view.labels else f"#{i}", row.get(view.value))
                for i, row in enumerate(items) if isinstance(row, dict) and row.get(view.value) is not None]
    elif view.labels:
        names = _list(outcome, view.labels)
        rows = list(zip(map(str, names), items)) if len(names) == len(items) else []
    else:
        highlighted = [i for i in _list(outcome, view.highlight) if isinstance(i, int)] if view.highlight else []
        svg = plots.index_bars(items, highlighted, view.title, view.axis_label, xlabel=view.index_label,
                               highlight_above=view.highlight_above)
        return Plot(view.caption, svg) if svg else None
    if not rows:
        return None
    svg = plots.layer_bars(rows, view.title, view.axis_label, log=view.log, limit=view.limit,
                           highlight_above=view.highlight_above)
    return Plot(view.caption, svg) if svg else None


def _excerpt(view: SourceExcerpt, outcome: dict[str, Any]) -> Optional[Excerpt]:
    lines = [row for row in _list(outcome, view.field)
             if isinstance(row, dict) and isinstance(row.get("line"), int) and isinstance(row.get("text"), str)]
    if not lines:
        return None
    return Excerpt(title=view.title, file=str(lines[0].get("file", "")), caption=view.caption,
                   lines=[(row["line"], row["text"], bool(row.get("is_culprit"))) for row in lines])


def _table(view: TableView, outcome: dict[str, Any], limit: Optional[int] = None) -> Optional[Table]:
    limit = limit or view.limit
    first = _list(outcome, view.fields[0])
    if len(view.fields) == 1 and first and all(isinstance(row, dict) for row in first):
        columns = list(view.columns or dict.fromkeys(c for row in first for c in row))
        rows = [[labels.value(c, row.get(c)) for c in columns] for row in first[:limit]]
        return Table(view.title, [labels.words(c) for c in columns], rows, max(0, len(first) - limit), view.caption)
    lists = [_list(outcome, f) for f in view.fields]
    count = max((len(values) for values in lists), default=0)
    if not count:
        return None
    rows = [[str(i)] + [format_figure(values[i]) if i < len(values) else "" for values in lists]
            for i in range(min(count, limit))]
    return Table(view.title, ["#", *map(labels.words, view.fields)], rows, max(0, count - limit), view.caption)


def _list(outcome: dict[str, Any], name: Optional[str]) -> list[Any]:
    value = outcome.get(name) if name else None
    return value if isinstance(value, list) else []


def _varies(values: list[Any]) -> bool:
    finite = [v for v in figures.numbers(values) if math.isfinite(v)]
    return bool(finite) and max(finite) - min(finite) > 1e-12 * max(1.0, abs(max(finite)))


# --- what the views do not draw ----------------------------------------------------------------

def scalars(outcome: Optional[dict[str, Any]], shown: set[str] = frozenset()) -> list[tuple[str, Any]]:
    """The outcome's single figures (and short lists of them) that no view draws, in the experiment's order."""
    return [(k, v) for k, v in (outcome or {}).items()
            if k not in shown and (v is None or isinstance(v, (bool, int, float, str))
                                   or (isinstance(v, list) and not any(isinstance(x, dict) for x in v)))]


def record_tables(outcome: Optional[dict[str, Any]], shown: set[str] = frozenset(), limit: int = 20) -> list[Table]:
    """Lists of records no view shows (e.g. the tensors holding NaN), as tables."""
    return [table for key, value in (outcome or {}).items()
            if key not in shown and isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
            and (table := _table(TableView(title=labels.words(key), fields=(key,)), outcome, limit))]


# --- the headline: a run in one line, and the plots that put runs side by side ---------------------

def headline(report: Report, run: Optional[ExperimentRun]) -> Optional[Curve]:
    """The curve `run`'s experiment declared its main one, if any."""
    if run is None:
        return None
    return next((v for v in report.views.get(run.experiment, []) if isinstance(v, Curve) and v.headline), None)


def headline_values(report: Report, run: Optional[ExperimentRun]) -> list[Any]:
    view = headline(report, run)
    return _list(run.outcome or {}, view.field) if view and run else []


def measured(report: Report, run: ExperimentRun, read: Optional[dict[str, Any]] = None) -> str:
    """What an experiment measured, in one line. With a headline curve: "40 steps, finite, loss 2.31 → 0.88";
    otherwise the figures its branch read (`read`), or its first figures."""
    outcome = run.outcome
    if not outcome:
        return "nothing measured"
    view = headline(report, run)
    values = _list(outcome, view.field) if view else []
    if view and values:
        parts = [f"{len(values)} {'steps' if view.xlabel == 'step' else 'points'}"]
        if view.nonfinite_step:
            bad = outcome.get(view.nonfinite_step)
            at = replay_offset(report, [run]) if _per_replay_step(view) else None
            parts.append(f"non-finite at {nonfinite_step_words(bad, at)}" if bad is not None else "finite")
        start, end = (outcome.get(view.start) if view.start else None), (outcome.get(view.end) if view.end else None)
        if start is not None and end is not None:
            parts.append(f"{view.ylabel or view.field} {format_figure(figures.number(start))} → "
                         f"{format_figure(figures.number(end))}")
        return ", ".join(parts)
    if read:
        shown = [labels.shown(k.split(".", 1)[-1], v) for k, v in read.items()]
        return ", ".join(shown[:4]) + (f" (+{len(shown) - 4} more)" if len(shown) > 4 else "")
    single = [(k, v) for k, v in scalars(outcome) if not isinstance(v, list)]
    return ", ".join(labels.shown(k, v) for k, v in single[:3]) or "nothing measured"


def changes(report: Report, run: ExperimentRun, reference: Optional[ExperimentRun]) -> list[str]:
    """What this experiment changed against its reference: the setting its headline curve names (a
    search's chosen trial), else its parameters that differ from the reference's."""
    if reference is None or reference.node == run.node:
        return []
    view = headline(report, run)
    setting = (run.outcome or {}).get(view.setting) if view and view.setting else None
    if isinstance(setting, str) and setting:
        return [setting]
    same_kind = run.experiment == reference.experiment
    return [describe_change(k, v) for k, v in run.params.items()
            if k not in _VERIFICATION_PARAMS and v is not None
            and ((k in reference.params and reference.params[k] != v) or (k not in reference.params and same_kind))]


def _own_figures(decision: Optional[Decision], node: str) -> dict[str, Any]:
    return {k: v for k, v in (decision.figures if decision else {}).items() if k.startswith(node + ".")}


def _references(report: Report) -> dict[str, ExperimentRun]:
    """Each experiment's reference: the run its fix is verified against (its `against` parameter), else
    the first run of the same experiment on the path that starts from the checkpoint (the baseline; a
    replay from a fresh init is an intervention, not a reference)."""
    runs = {run.node: run for run in report.experiments}
    first: dict[str, ExperimentRun] = {}
    for run in report.experiments:
        if run.params.get("init", "checkpoint") == "checkpoint":
            first.setdefault(run.experiment, run)
    paired = {run.node: runs.get(run.params.get("against")) if isinstance(run.params.get("against"), str) else None
              for run in report.experiments}
    return {run.node: paired[run.node] or first.get(run.experiment, run) for run in report.experiments}


def _headline_series(report: Report, run: ExperimentRun, color: str, label: str, **kw) -> Optional[figures.Series]:
    view = headline(report, run)
    return _series(view, run, color, label, **kw) if view else None


def _proof_plot(report: Report, proof: ExperimentRun, reference: Optional[ExperimentRun]) -> Optional[str]:
    view = headline(report, proof)
    if view is None:
        return None
    series = [s for s in (_headline_series(report, reference, figures.BAD, f"{reference.node} (as the run)")
                          if reference and reference.node != proof.node else None,
                          _headline_series(report, proof, figures.GOOD, f"{proof.node} (with the fix)")) if s]
    what = (view.ylabel or view.field).capitalize()
    at = _run_steps(report, [proof] + ([reference] if reference else [])) if _per_replay_step(view) else None
    return plots.curves([_shifted(s, at) for s in series], f"{what} per {view.xlabel}: as the run vs with the fix",
                        xlabel=at[1] if at else view.xlabel, ylabel=view.ylabel, log_y=view.log_y) if series else None


def _proof_table(report: Report, proof: Optional[ExperimentRun],
                 reference: Optional[ExperimentRun]) -> list[tuple[str, str, str]]:
    """The figures that decided, side by side: the run as it was against the run with the fix."""
    if proof is None or reference is None or reference.node == proof.node:
        return []
    names = []
    for decision in report.decisions:
        if decision.node in (proof.node, reference.node):
            names += [key.split(".", 1)[1] for key in decision.figures
                      if key.split(".", 1)[0] in (proof.node, reference.node) and "." in key]
    names = list(dict.fromkeys(names))
    a, b = reference.outcome or {}, proof.outcome or {}
    rows = [(labels.words(n), labels.value(n, a.get(n)), labels.value(n, b.get(n))) for n in names if n in a or n in b]
    rows.sort(key=lambda row: row[1] == row[2])  # what the fix changed first; a figure both share after it
    view = headline(report, proof)
    if view and view.start and view.end and (view.start in a or view.start in b):
        rows.append((f"{view.ylabel or view.field} start → end",
                     *(f"{format_figure(o.get(view.start))} → {format_figure(o.get(view.end))}" for o in (a, b))))
    return rows[:6]


def _overview_plot(report: Report, references: dict[str, ExperimentRun]) -> Optional[str]:
    """Every run of the first experiment with a headline curve on one axis: the reference against each
    intervention."""
    runs = [r for r in report.experiments if headline_values(report, r)]
    runs = [r for r in runs if r.experiment == runs[0].experiment] if runs else []  # one kind: one x axis
    if len(runs) < 2:
        return None
    view = headline(report, runs[0])
    series, colors = [], iter(figures.PALETTE * 4)
    for run in runs:
        is_reference = references[run.node].node == run.node
        color = figures.BASELINE if is_reference else figures.GOOD if run.node == report.proof else next(colors)
        if run.node != report.proof and color == figures.GOOD:
            color = next(colors)
        series.append(_series(view, run, color, run.node, emphasis=run.node == report.proof or is_reference))
    what = (view.ylabel or view.field).capitalize()
    at = _run_steps(report, runs) if _per_replay_step(view) else None
    return plots.curves([_shifted(s, at) for s in series if s], f"{what} per {view.xlabel}, every {runs[0].experiment}",
                        xlabel=at[1] if at else view.xlabel, ylabel=view.ylabel, log_y=view.log_y, wide=True)


def _history_plot(report: Report) -> Optional[str]:
    train = [p for p in report.history if p.loss is not None]
    val = [p for p in report.history if p.val_loss is not None]
    if not train and not val:
        return None
    bad = next((p.step for p in train if not math.isfinite(figures.number(p.loss))), None)
    series = [figures.Series(label="the failing run (train)", values=[p.loss for p in train],
                           steps=[p.step for p in train], color=figures.BAD, first_nonfinite=bad)]
    if val:
        series.append(figures.Series(label="the failing run (val)", values=[p.val_loss for p in val],
                                   steps=[p.step for p in val], color=figures.BASELINE))
    return plots.loss_curves(series, title="The failing run's loss, up to the checkpoint", wide=True)


# --- where -------------------------------------------------------------------------------------

def _location(report: Report) -> list[LocationRow]:
    loc = report.location
    rows = []
    if loc.module:
        rows.append(LocationRow("Module", [loc.module], kind=loc.module_type, after=loc.previous_module,
                                after_kind=loc.previous_module_type))
    rows += [LocationRow(name, [str(value)]) for name, value in (("Operation", loc.op), ("Source", loc.source))
             if value not in (None, "")]
    if loc.batch is not None:
        rows += _batch_rows(loc.batch_place or batch_place(report, loc.batch))
    if loc.rank is not None:
        rows.append(LocationRow("Rank", [str(loc.rank)]))
    if loc.parameters:
        rows.append(LocationRow("Parameters", loc.parameters[:6], more=max(0, len(loc.parameters) - 6)))
    return rows


def _batch_rows(place: BatchPlace) -> list[LocationRow]:
    """The bad batch by the run's own step where it is known (else its snapshot index), and the tensor and
    value in it found wrong."""
    if place.step is None:
        rows = [LocationRow("Snapshot batch", [str(place.batch)],
                            note="its index in Setup.batches; no training step is known (the checkpoint records "
                                 "none)")]
    elif place.step_source == "capture":
        rows = [LocationRow("Step", [str(place.step)], note=f"the run's training step that used snapshot batch "
                                                           f"{place.batch}, as the capture recorded it")]
    else:
        rows = [LocationRow("Step", [str(place.step)], note=f"the run's training step of snapshot batch {place.batch}"
                                                           f" (checkpoint step {place.checkpoint_step} + "
                                                           f"{place.batch + 1}), as the replays continue the run")]
    if place.tensor is not None:
        rows.append(LocationRow("Tensor", [place.tensor], note=place.value_words()))
    return rows


def _source(report: Report, experiments: list[ExperimentView]) -> Optional[Excerpt]:
    """The user's source at the fault: the excerpt of the proof or evidence first, else of any experiment."""
    order = sorted(experiments, key=lambda e: e.role == "")
    return next((e.excerpts[0] for e in order if e.excerpts), None)


# --- the figures that decided ------------------------------------------------------------------

def key_figures(report: Report, limit: int = 5) -> list[tuple[str, str]]:
    """The figures that decided the verdict: those the clauses that held on the path read (as the
    engine recorded them), the proof's first, then the other evidence."""
    order = [report.proof] if report.proof else []
    order += [n for n in report.evidence if n not in order]
    held = {d.node: d for d in report.decisions if d.when is not None}
    found: dict[str, str] = {}
    for node in order + [d.node for d in report.decisions]:
        decision = held.get(node)
        if decision is None:
            continue
        for key in deciding_refs(decision):
            if key in decision.figures:
                found.setdefault(labels.words(key), labels.value(key, decision.figures[key]))
    return list(found.items())[:limit]


def capped_by(report: Report) -> Optional[str]:
    """Why the fix that won the differential the verdict came through may claim medium at most, though it
    works (an LR moved past what its optimizer is run at): None where nothing held it back. As the walk
    caps a verdict (walk/engine.Walk.confidence), the last differential with a winner is that one."""
    for decision in reversed(report.decisions):
        winner = next((c for c in decision.candidates if c.winner), None)
        if winner is not None:
            return winner.cap_reason if winner.then in report.path else None
    return None


def summary_views(report: Report) -> dict[str, Any]:
    """What summary.md needs: the proof in words and the figures that decided (no plots drawn)."""
    references = _references(report)
    decisions = {d.node: d for d in report.decisions}
    proof = report.experiment(report.proof) if report.proof else None
    reference = references.get(report.proof) if proof else None
    return {
        "proof": proof,
        "proof_changes": changes(report, proof, reference) if proof else [],
        "proof_measured": measured(report, proof) if proof else "",
        "reference": reference if reference and proof and reference.node != proof.node else None,
        # A reference that changed something itself (the LR held at its peak) is not the run as it was.
        "reference_changes": changes(report, reference, references.get(reference.node)) if reference else [],
        "proof_table": _proof_table(report, proof, reference),
        "key_figures": key_figures(report),
        "kind": verdict_kind(report), "headings": HEADINGS[verdict_kind(report)], "fix_trial": tried(report),
        "capped": capped_by(report), "location": _location(report),
        "measured": {run.node: measured(report, run, _own_figures(decisions.get(run.node), run.node))
                     for run in report.experiments},
    }
