"""What the templates show, prepared from a Report: sentences, tables and plots as plain data.

Outcomes arrive as dicts of whatever an experiment measured (report.json turns NaN and inf into
strings); everything here reads them defensively, so a missing key leaves a blank, not a crash.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from triage.records import Decision, ExperimentRun
from triage.report import plots
from triage.report.differential import DifferentialView, differential_views
from triage.report.ranks import RankSection, rank_section
from triage.report.model import Report

_CONTEXT_LINE = re.compile(r"^([> ])\s*(\d+) \| ?(.*)$")
# Series an experiment's plots already show; left out of its tables.
_PLOTTED = {"losses", "grad_norms", "lrs", "steps", "val_steps", "val_losses", "layer_norms", "layers"}


def format_figure(value: Any) -> str:
    """One figure as a person reads it: 4 significant digits, true/false, — for not measured."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    if isinstance(value, list):
        if len(value) > 8:
            return f"[{len(value)} items]"
        return "[" + ", ".join(format_figure(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_figure(v)}" for k, v in list(value.items())[:6]) + \
            (", …" if len(value) > 6 else "") + "}"
    return str(value)


def describe_change(key: str, value: Any) -> str:
    """A changed replay parameter in the words of the checklist: lr×0.1, clip at 1.0, …"""
    words = {
        "lr_scale": lambda v: f"lr×{format_figure(v)}",
        "wd_scale": lambda v: f"weight decay×{format_figure(v)}",
        "clip": lambda v: f"clip at {format_figure(v)}" if v is not None else "clip as the run",
        "precision": lambda v: f"{v} autocast" if v else "precision as the run",
        "steps": lambda v: f"{v} steps",
        "subset": lambda v: f"first {v} examples only" if v else "all examples",
        "skip_batches": lambda v: "skipping batch" + ("es " if len(v) > 1 else " ") +
                                  ", ".join(map(str, v)) if v else "no batch skipped",
        "skip_outliers_of": lambda v: f"skipping the batches {v} flagged" if v else "no batch skipped",
        "loop": lambda v: "the run's own train_step" if v == "user" else "triage's reference loop",
        "init": lambda v: {"setup": "fresh init from setup()", "default": "PyTorch default init",
                           "checkpoint": "weights from the checkpoint"}.get(v, f"init={v}"),
        "val_every": lambda v: f"val loss every {v} steps" if v else "no val loss",
    }
    try:
        return words[key](value) if key in words else f"{key}={format_figure(value)}"
    except (TypeError, ValueError):
        return f"{key}={format_figure(value)}"


# How a counterfactual is judged, not what it changes.
_VERIFICATION_PARAMS = {"against", "margin", "level_margin", "extend_to"}


def changes(run: ExperimentRun, reference: Optional[ExperimentRun]) -> list[str]:
    """What this experiment changed against its reference (same experiment, first on the path)."""
    if reference is None or reference.node == run.node:
        return []
    return [describe_change(k, v) for k, v in run.params.items()
            if k not in _VERIFICATION_PARAMS and (reference.params.get(k, v) != v or k not in reference.params)]


def measured(outcome: Optional[dict[str, Any]], read: Optional[dict[str, Any]] = None) -> str:
    """What an experiment measured, in one line: "40 steps, finite, loss 2.31 → 0.88" for a replay;
    otherwise the figures its branch read (`read`), or its first figures."""
    if not outcome:
        return "nothing measured"
    parts = []
    if "steps_run" in outcome:
        parts.append(f"{outcome['steps_run']} steps")
    if "finite" in outcome:
        bad = outcome.get("first_nonfinite_step")
        parts.append("finite" if outcome["finite"] is True else
                     f"non-finite at step {bad}" if bad is not None else "non-finite")
    if outcome.get("loss_start") is not None and outcome.get("loss_end") is not None:
        parts.append(f"loss {format_figure(plots.number(outcome['loss_start']))} → "
                     f"{format_figure(plots.number(outcome['loss_end']))}")
    if parts and "losses" in outcome:
        return ", ".join(parts)
    if read:
        shown = [f"{k.split('.', 1)[-1].replace('_', ' ')} {format_figure(v)}" for k, v in read.items()]
        return ", ".join(shown[:4]) + (f" (+{len(shown) - 4} more)" if len(shown) > 4 else "")
    single = [(k, v) for k, v in scalars(outcome) if not isinstance(v, list)]
    return ", ".join(parts) or ", ".join(f"{k.replace('_', ' ')} {format_figure(v)}" for k, v in single[:3])


def scalars(outcome: Optional[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The outcome's single figures, in the experiment's own order."""
    return [(k, v) for k, v in (outcome or {}).items()
            if k not in _PLOTTED and (v is None or isinstance(v, (bool, int, float, str))
                                      or (isinstance(v, list) and not any(isinstance(x, dict) for x in v)))]


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[list[str]]
    more: int = 0


def tables(outcome: Optional[dict[str, Any]], limit: int = 20) -> list[Table]:
    """Lists of records an experiment measured (e.g. the tensors holding NaN), as tables."""
    found = []
    for key, value in (outcome or {}).items():
        if key in _PLOTTED or not isinstance(value, list) or not value:
            continue
        if all(isinstance(v, dict) for v in value):
            columns = list(dict.fromkeys(c for row in value for c in row))
            rows = [[format_figure(row.get(c)) for c in columns] for row in value[:limit]]
            found.append(Table(key, columns, rows, max(0, len(value) - limit)))
    return found


@dataclass
class Plot:
    caption: str
    svg: str  # generated here by matplotlib: its text is escaped


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
    figures: list[tuple[str, str, bool]]  # name, value, read by a decision
    tables: list[Table]
    plots: list[Plot]
    decision: Optional[Decision]


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
    location: list[tuple[str, Any]]
    source_context: list[tuple[Optional[int], str, bool]]  # line number, text, the faulting line
    key_figures: list[tuple[str, str]]
    titles: dict[str, Optional[str]] = field(default_factory=dict)
    differentials: list[DifferentialView] = field(default_factory=list)
    ranks: Optional[RankSection] = None  # a distributed run: where the ranks differed


def build_views(report: Report) -> Views:
    anchors = {run.node: f"exp-{i + 1}" for i, run in enumerate(report.experiments)}
    titles = {node.id: node.title for node in report.flowchart.nodes}
    decisions = {d.node: d for d in report.decisions}
    read = {tuple(key.split(".", 1)) for d in report.decisions for key in d.figures if "." in key}
    references = _references(report)
    experiments = []
    for i, run in enumerate(report.experiments):
        reference = references.get(run.node)
        role = "proof" if run.node == report.proof else "evidence" if run.node in report.evidence else ""
        experiments.append(ExperimentView(
            run=run, index=i + 1, anchor=anchors[run.node], title=titles.get(run.node), role=role,
            reference=reference.node if reference and reference.node != run.node else None,
            compared=any(references[o.node].node == run.node for o in report.experiments if o.node != run.node),
            changes=changes(run, reference),
            measured=measured(run.outcome, _own_figures(decisions.get(run.node), run.node)),
            figures=[(k, format_figure(v), (run.node, k) in read) for k, v in scalars(run.outcome)],
            tables=tables(run.outcome), plots=experiment_plots(run, reference),
            decision=decisions.get(run.node)))
    proof = next((e for e in experiments if e.role == "proof"), None)
    proof_reference = references.get(report.proof) if report.proof else None
    return Views(
        experiments=experiments, anchors=anchors, proof=proof,
        proof_plot=_proof_plot(proof.run, proof_reference) if proof else None,
        proof_table=_proof_table(report, proof.run if proof else None, proof_reference),
        overview_plot=_overview_plot(report, references),
        history_plot=_history_plot(report),
        location=_location(report), source_context=_source_context(report),
        key_figures=key_figures(report), titles=titles, differentials=differential_views(report),
        ranks=rank_section(report),
    )


def _own_figures(decision: Optional[Decision], node: str) -> dict[str, Any]:
    return {k: v for k, v in (decision.figures if decision else {}).items() if k.startswith(node + ".")}


def _references(report: Report) -> dict[str, ExperimentRun]:
    """Each experiment's reference: the first run of the same experiment on the path that starts
    from the checkpoint (the baseline; a replay from a fresh init is an intervention, not a reference)."""
    first: dict[str, ExperimentRun] = {}
    for run in report.experiments:
        if run.params.get("init", "checkpoint") == "checkpoint":
            first.setdefault(run.experiment, run)
    return {run.node: first.get(run.experiment, run) for run in report.experiments}


def _series(run: ExperimentRun, key: str, color: str, label: Optional[str] = None, **kw) -> Optional[plots.Series]:
    values = (run.outcome or {}).get(key)
    if not isinstance(values, list) or not values:
        return None
    bad = (run.outcome or {}).get("first_nonfinite_step")
    return plots.Series(label=label or run.node, values=values, color=color,
                        first_nonfinite=bad if isinstance(bad, int) else None, **kw)


def _val_series(run: ExperimentRun, color: str) -> Optional[plots.Series]:
    outcome = run.outcome or {}
    values, steps = outcome.get("val_losses"), outcome.get("val_steps")
    if not isinstance(values, list) or not values or not isinstance(steps, list) or len(steps) != len(values):
        return None
    # val_steps count finished steps (1-based); the training curve's x is the 0-based step index.
    return plots.Series(label=f"{run.node} (val)", values=values, steps=[s - 1 for s in steps], color=color,
                        dashed=True)


def experiment_plots(run: ExperimentRun, reference: Optional[ExperimentRun]) -> list[Plot]:
    """Plots where a person would rather look than read, chosen by what the outcome carries."""
    outcome = run.outcome or {}
    if _series_of(outcome, "lrs") and _series_of(outcome, "losses") and "current_lr" in outcome:
        svg = plots.lr_range(outcome["lrs"], outcome["losses"], outcome.get("current_lr"),
                             outcome.get("suggested_lr"), outcome.get("diverged_at_lr"))
        return [Plot("", svg)] if svg else []
    if "outliers" in outcome:  # per-batch figures, not per step
        return [Plot("", svg) for key, label in (("losses", "Loss"), ("grad_norms", "Gradient norm"))
                if _series_of(outcome, key)
                and (svg := plots.batch_bars(outcome[key], _ints(outcome["outliers"]),
                                             f"{label} of each snapshot batch (red: flagged)", label.lower()))]
    found = _curve_plots(run, reference)
    if _series_of(outcome, "user_losses") or _series_of(outcome, "reference_losses"):
        series = [s for s in (plots.Series("the run's train_step", outcome.get("user_losses") or [], color=plots.BAD),
                              plots.Series("reference loop", outcome.get("reference_losses") or [],
                                           color=plots.BASELINE)) if s.values]
        svg = plots.loss_curves(series, title="Loss per step: the run's own step vs the reference loop")
        if svg:
            found.append(Plot("", svg))
    lrs = _series_of(outcome, "lrs")
    if lrs and ("checkpoint_step" in outcome or _varies(lrs)):
        step = outcome.get("checkpoint_step")
        svg = plots.lr_schedule(lrs, outcome.get("steps"), step if isinstance(step, int) else None)
        if svg:
            found.append(Plot("", svg))
    norms = _named(outcome.get("layer_norms"), "norm")
    if norms:
        svg = plots.layer_bars(norms, "Gradient norm per parameter", "gradient norm", log=True)
        found.append(Plot("In depth order, input side at the top; a red 0 got no gradient.", svg))
    dead = _named(outcome.get("layers"), "dead_fraction")
    if any(value is not None for _, value in dead):
        svg = plots.layer_bars(dead, "Dead units per layer", "fraction of units never active",
                               limit=(0.0, 1.0), highlight_above=0.5)
        found.append(Plot("Red: more than half of the layer's units never fired.", svg))
    return found


def _curve_plots(run: ExperimentRun, reference: Optional[ExperimentRun]) -> list[Plot]:
    """Loss and gradient norm per step, against the reference run of the same experiment."""
    outcome = run.outcome or {}
    found = []
    against = reference if reference is not None and reference.node != run.node else None
    mine = plots.INTERVENTION if against else plots.BASELINE
    for key, draw, caption in (("losses", plots.loss_curves, "Loss per step"),
                               ("grad_norms", plots.grad_norm_curves, "Gradient norm per step, before clipping")):
        series = [s for s in (_series(against, key, plots.BASELINE, emphasis=False) if against else None,
                              _series(run, key, mine),
                              _val_series(run, plots.GOOD) if key == "losses" else None) if s]
        if not any(s.label == run.node for s in series):
            continue
        extra = {"clip": plots.number(outcome.get("clip_threshold"))} \
            if key == "grad_norms" and outcome.get("clip_threshold") is not None else {}
        svg = draw(series, title=caption + (f": {run.node} vs {against.node}" if against else ""), **extra)
        if svg:
            found.append(Plot("", svg))  # its title says it all
    return found


def _series_of(outcome: dict[str, Any], key: str) -> list[Any]:
    value = outcome.get(key)
    return value if isinstance(value, list) and value else []


def _ints(values: Any) -> list[int]:
    return [v for v in values if isinstance(v, int)] if isinstance(values, list) else []


def _named(rows: Any, key: str) -> list[tuple[str, Any]]:
    if not isinstance(rows, list):
        return []
    return [(row.get("name", f"#{i}"), row.get(key)) for i, row in enumerate(rows)
            if isinstance(row, dict) and key in row]


def _varies(values: list[Any]) -> bool:
    finite = [v for v in plots.numbers(values) if math.isfinite(v)]
    return bool(finite) and max(finite) - min(finite) > 1e-12 * max(1.0, abs(max(finite)))


def _proof_plot(proof: ExperimentRun, reference: Optional[ExperimentRun]) -> Optional[str]:
    series = [s for s in (_series(reference, "losses", plots.BAD, f"{reference.node} (as the run)")
                          if reference and reference.node != proof.node else None,
                          _series(proof, "losses", plots.GOOD, f"{proof.node} (with the fix)")) if s]
    return plots.loss_curves(series, title="Loss per step: as the run vs with the fix") if series else None


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
    names = list(dict.fromkeys(["steps_run", *names]))
    a, b = reference.outcome or {}, proof.outcome or {}
    rows = [(n, format_figure(a.get(n)), format_figure(b.get(n))) for n in names if n in a or n in b]
    if "loss_start" in a or "loss_start" in b:
        rows.append(("loss start → end", *(f"{format_figure(o.get('loss_start'))} → {format_figure(o.get('loss_end'))}"
                                           for o in (a, b))))
    return rows[:6]


def _overview_plot(report: Report, references: dict[str, ExperimentRun]) -> Optional[str]:
    """Every replay's loss on one axis: the baseline against each intervention."""
    runs = [r for r in report.experiments if _series_of(r.outcome or {}, "losses") and "steps_run" in r.outcome]
    runs = [r for r in runs if r.experiment == runs[0].experiment] if runs else []  # one kind: per step
    if len(runs) < 2:
        return None
    series, colors = [], iter(plots.PALETTE * 4)
    for run in runs:
        is_reference = references[run.node].node == run.node
        color = plots.BASELINE if is_reference else plots.GOOD if run.node == report.proof else next(colors)
        if run.node != report.proof and color == plots.GOOD:
            color = next(colors)
        series.append(_series(run, "losses", color, run.node, emphasis=run.node == report.proof or is_reference))
    return plots.loss_curves(series, title="Loss per step, every replay", wide=True)


def _history_plot(report: Report) -> Optional[str]:
    train = [p for p in report.history if p.loss is not None]
    val = [p for p in report.history if p.val_loss is not None]
    if not train and not val:
        return None
    bad = next((p.step for p in train if not math.isfinite(plots.number(p.loss))), None)
    series = [plots.Series(label="the failing run (train)", values=[p.loss for p in train],
                           steps=[p.step for p in train], color=plots.BAD, first_nonfinite=bad)]
    if val:
        series.append(plots.Series(label="the failing run (val)", values=[p.val_loss for p in val],
                                   steps=[p.step for p in val], color=plots.BASELINE))
    return plots.loss_curves(series, title="The failing run's loss, up to the checkpoint", wide=True)


def _location(report: Report) -> list[tuple[str, Any]]:
    loc = report.location
    rows = [("Module", loc.module), ("Operation", loc.op), ("Source", loc.source), ("Batch", loc.batch),
            ("Parameters", loc.parameters), ("Rank", loc.rank)]
    return [(k, v) for k, v in rows if v not in (None, "", [])]


def _source_context(report: Report) -> list[tuple[Optional[int], str, bool]]:
    """The user's source around the faulting line, when an experiment could read the file.
    Accepts locate's "> 123 | text" lines, {line, text} records, (line, text) pairs or plain text."""
    for run in report.experiments:
        context = (run.outcome or {}).get("source_context")
        if not context:
            continue
        target = _line_number((run.outcome or {}).get("source") or report.location.source or "")
        if isinstance(context, str):
            context = context.splitlines()
        lines: list[tuple[Optional[int], str]] = []
        for item in context if isinstance(context, list) else []:
            number, text = None, item
            if isinstance(item, dict):
                number, text = item.get("line", item.get("lineno")), item.get("text", item.get("code", ""))
            elif isinstance(item, (list, tuple)) and len(item) == 2:
                number, text = item
            elif isinstance(item, str) and (parsed := _CONTEXT_LINE.match(item)):
                number, text = int(parsed.group(2)), parsed.group(3)
                if parsed.group(1) == ">":
                    target = number
            lines.append((number if isinstance(number, int) else None, str(text)))
        return [(n, text, n is not None and n == target) for n, text in lines]
    return []


def _line_number(source: str) -> Optional[int]:
    tail = str(source).rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


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
                found.setdefault(key, format_figure(decision.figures[key]))
    return list(found.items())[:limit]


def deciding_refs(decision: Decision) -> list[str]:
    """`node.field` figures of the clauses that made `decision.when` hold, as the engine recorded them.
    A report written before the engine recorded its clauses (schema 1.2) names every figure read."""
    if decision.when is None:
        return []
    if not decision.held:
        return list(decision.figures)
    return list(dict.fromkeys(ref for clause in decision.held for ref in clause.refs))


def summary_views(report: Report) -> dict[str, Any]:
    """What summary.md needs: the proof in words and the figures that decided (no plots drawn)."""
    references = _references(report)
    decisions = {d.node: d for d in report.decisions}
    proof = report.experiment(report.proof) if report.proof else None
    reference = references.get(report.proof) if proof else None
    return {
        "proof": proof,
        "proof_changes": changes(proof, reference) if proof else [],
        "proof_measured": measured(proof.outcome) if proof else "",
        "reference": reference if reference and proof and reference.node != proof.node else None,
        "proof_table": _proof_table(report, proof, reference),
        "key_figures": key_figures(report),
        "measured": {run.node: measured(run.outcome, _own_figures(decisions.get(run.node), run.node))
                     for run in report.experiments},
    }
