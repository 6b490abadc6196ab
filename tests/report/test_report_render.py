"""report.html / summary.md / report.json: round trip, re-render, escaping, self-containment, size."""

from __future__ import annotations

import json

import math
import re

import pytest
from markupsafe import escape
import torch
import torch.nn.functional as F
from torch import nn

import triage
from triage.walk.engine import walk
from triage.experiments import default_registry
from triage.errors import ReportError
from triage.load.history import HistoryPoint
from triage.walk.playbook import load_playbook
from triage.records import Clause, Decision, ExperimentRun
from triage.report import Report, read_report, write_report
from triage.report import figures, flowchart, plots
from triage.report.build import build_report
from triage.report.labels import condition_words
from triage.report.model import (SCHEMA_VERSION, CheckpointInfo, Environment, FindingRecord, Flowchart, GraphEdge,
                                 GraphNode,
                                 Location)
from triage.report.sections import key_figures
from triage.load.session import session_from_factory

XSS = "<script>alert(1)</script>"


# --- Reports to render -------------------------------------------------------------------------

def regression_setup(lr: float):
    """A tiny regression by SGD+momentum: lr 0.5 blows up to NaN, lr 0.05 stays finite."""
    def setup() -> triage.Setup:
        g = torch.Generator().manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        x = torch.randn(64, 8, generator=g)
        y = x.sum(1, keepdim=True)
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                            loss_fn=lambda m, b: F.mse_loss(m(b[0]), b[1]),
                            batches=[(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)])
    return setup


def pipeline_report(lr: float) -> Report:
    """The real pipeline (session, default playbook, walk, build) on the tiny run."""
    session = session_from_factory(regression_setup(lr), entry="tiny:setup")
    book = load_playbook(None)
    return build_report(walk(session, book), session, book, "triage run --entry tiny:setup --seed 0", None)


@pytest.fixture(scope="module")
def diverged() -> Report:
    report = pipeline_report(0.5)
    assert report.experiment("baseline").outcome["finite"] is False  # the case this fixture is for
    return report


@pytest.fixture(scope="module")
def finite() -> Report:
    report = pipeline_report(0.05)
    assert all(e.outcome.get("finite", True) for e in report.experiments)
    return report


def replay_outcome(losses: list, first_bad=None, **extra) -> dict:
    finite_losses = [x for x in losses if isinstance(x, float) and math.isfinite(x)]
    return {"steps_run": len(losses), "losses": losses, "grad_norms": [abs(x) * 3 for x in finite_losses],
            "lrs": [0.1] * len(losses), "finite": first_bad is None, "first_nonfinite_step": first_bad,
            "loss_start": finite_losses[0], "loss_end": finite_losses[-1], "max_rise": 0.5, **extra}


def crafted_report(name: str = "node", n_experiments: int = 4, steps: int = 40, text: str = "") -> Report:
    """A Report built by hand: every section filled, `text` planted in every user-derived string."""
    nodes = [f"{name}{i}" for i in range(n_experiments)]
    experiments = []
    for i, node in enumerate(nodes):
        losses = [2.0 * (0.97 ** s) * (1 + 0.05 * math.sin(s)) for s in range(steps)]
        outcome = replay_outcome(losses, note=f"measured {text}")
        experiments.append(ExperimentRun(
            node=node, experiment="replay", summary=f"Replays {text}",
            params={"steps": steps, "lr_scale": 1.0 if i == 0 else 0.1 ** i, "clip": None}, status="ok",
            seconds=0.5, outcome=outcome))
    experiments.append(ExperimentRun(node=f"{name}-failed", experiment="locate", params={}, status="error",
                                     error=f"Traceback (most recent call last):\n  RuntimeError: {text}",
                                     seconds=0.1, outcome=None))
    experiments.append(ExperimentRun(
        node=f"{name}-trace", experiment="lr_trace", params={}, status="ok", seconds=0.1,
        outcome={"lrs": [0.1 * 0.5 * (1 + math.cos(math.pi * s / 100)) for s in range(100)],
                 "steps": list(range(100)), "checkpoint_step": 80}))
    experiments.append(ExperimentRun(  # what the gradient-flow and activation-health instruments carry
        node=f"{name}-flow", experiment="gradient_flow", params={}, status="ok", seconds=0.1,
        outcome={"layer_norms": [{"name": f"enc.{text}.{k}", "norm": 10.0 ** -k} for k in range(6)]}))
    experiments.append(ExperimentRun(
        node=f"{name}-act", experiment="activation_health", params={}, status="ok", seconds=0.1,
        outcome={"layers": [{"name": f"act{text}{k}", "dead_fraction": k / 6} for k in range(6)]}))
    experiments.append(ExperimentRun(
        node=f"{name}-locate", experiment="locate_nonfinite", params={}, status="ok", seconds=0.1,
        outcome={"found": True, "module": f"mod{text}", "source": "train.py:3",
                 "source_context": [{"file": "train.py", "line": 2, "text": f"x = {text}", "is_culprit": False},
                                    {"file": "train.py", "line": 3, "text": "y = x.sqrt()", "is_culprit": True}]}))
    all_nodes = [e.node for e in experiments]
    leaf = "lr_too_high"
    path = nodes[:2] + [leaf]
    decisions = [Decision(node=nodes[0], goto=nodes[1], when=f"{nodes[0]}.max_rise > 1.0 or {nodes[0]}.finite",
                          figures={f"{nodes[0]}.max_rise": 0.5, f"{nodes[0]}.finite": True},
                          settled=[Clause(text=f"{nodes[0]}.finite", refs=[f"{nodes[0]}.finite"])]),
                 Decision(node=nodes[1], goto=leaf, when=None, figures={f"{nodes[1]}.finite": True})]
    graph_nodes = [GraphNode(id=n, kind="run", label="replay", title=f"Question {text}?") for n in all_nodes]
    graph_nodes.append(GraphNode(id=leaf, kind="leaf", label=leaf))
    edges = [GraphEdge(source=a, target=b, labels=[f"{a}.finite {text}"]) for a, b in zip(all_nodes, all_nodes[1:])]
    edges.append(GraphEdge(source=nodes[1], target=leaf, labels=["otherwise"]))
    return Report(
        created="2026-01-01T00:00:00+00:00", root_cause=leaf, title=f"Learning rate too high {text}",
        confidence="high", fix=f"Lower the LR {text}", proof=nodes[1], evidence=nodes[:2],
        location=Location(module=f"encoder.{text}", op=f"Sqrt{text}", source=f"train.py:3 {text}", batch=2,
                          parameters=[f"w.{text}"]),
        findings=[FindingRecord(id="data_warning", text=f"Something {text}", evidence=[nodes[0]])],
        path=path, decisions=decisions, experiments=experiments, views=DECLARED,
        flowchart=Flowchart(name=f"book{text}", nodes=graph_nodes, edges=edges),
        history=[HistoryPoint(step=s, loss=1.0 + s * 0.1) for s in range(50)],
        checkpoint=CheckpointInfo(path=f"/ckpt/{text}.pt", layout="dict", step=80),
        environment=Environment(triage="0.1.0", torch="2.x", python="3.11", platform=f"linux {text}", device="cpu",
                                precision="fp32", seed=0, playbook=f"p{text}", playbook_sha256="0" * 64),
        command=f"triage run --entry '{text}:setup'", seconds=3.0,
    )


DECLARED = {e.name: list(e.views) for e in default_registry()}


def inline_svgs(html: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", html, re.S)


# --- report.json -------------------------------------------------------------------------------

def test_report_json_round_trips(finite, tmp_path):
    files = write_report(finite, tmp_path)
    assert Report.model_validate_json(files["json"].read_text()) == finite
    assert read_report(files["json"]) == finite


def test_report_json_with_nonfinite_losses_is_a_fixpoint(diverged, tmp_path):
    # NaN never equals NaN, so the check is that the JSON reproduces itself, NaN included.
    dump = diverged.model_dump_json()
    again = Report.model_validate_json(dump)
    assert again.model_dump_json() == dump
    assert "NaN" in dump or "Infinity" in dump


def test_rerender_from_json_gives_the_same_files(diverged, tmp_path):
    first = write_report(diverged, tmp_path / "a")
    second = write_report(read_report(first["json"]), tmp_path / "b")
    assert first["html"].read_text() == second["html"].read_text()
    assert first["md"].read_text() == second["md"].read_text()


def test_read_report_rejects_another_schema_version(finite, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(finite.model_dump_json().replace(f'"schema_version":"{SCHEMA_VERSION}"', '"schema_version":"0.1"'))
    with pytest.raises(ReportError, match="schema version"):
        read_report(path)


def test_a_schema_1_3_report_is_read_with_the_clauses_that_held(finite, tmp_path):
    # 1.3 kept the clauses that held as `held` and their refs again as `deciding`; 1.4 has one record.
    data = json.loads(finite.model_dump_json())
    data["schema_version"] = "1.3"
    data["decisions"] = [{"node": "n0", "goto": "n1", "when": "n0.a > 1 or n0.b", "figures": {"n0.a": 2.0},
                          "deciding": ["n0.a"], "held": [{"text": "n0.a > 1", "refs": ["n0.a"]}]}]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    decision = read_report(path).decisions[0]
    assert [c.text for c in decision.settled] == ["n0.a > 1"] and decision.deciding == ["n0.a"]


# --- what report.html shows --------------------------------------------------------------------

def test_html_shows_verdict_fix_and_proof_first(tmp_path):
    report = crafted_report(name="n")
    html = write_report(report, tmp_path)["html"].read_text()
    verdict = html.index("Learning rate too high")
    assert verdict < html.index("Lower the LR") < html.index('id="path"') < html.index('id="evidence"')
    # The proof names the experiment, the change against the baseline, and what it measured.
    proof = html[html.index("Proof: the fix, tried"):html.index('id="path"')]
    assert "lr×0.1" in proof and "n1" in proof and "40 steps, finite, loss 2 → " in proof


def test_html_draws_path_plots_location_and_source(tmp_path):
    html = write_report(crafted_report(name="n"), tmp_path)["html"].read_text()
    # The flowchart (whole, and its walked part drawn again by reference), and the plots the experiments
    # declare: overview, proof, loss+grad norm per replay (4), per-layer grad norms, dead units, the LR
    # schedule, and the run's history.
    assert len(inline_svgs(html)) == 2 + 1 + 1 + 4 * 2 + 1 + 1 + 1 + 1
    assert html.count('<use href="#fc-all"/>') == 1 and html.count('id="fc-all"') == 1
    assert html.count('class="fc-node run walked') == 2 and 'class="fc-node leaf walked reached"' in html
    assert "checkpoint (step 80)" in html  # the LR trace marks the checkpoint's step
    assert '<span class="line hit"><span class="ln">3</span>y = x.sqrt()</span>' in html
    assert "RuntimeError" in html  # the failed experiment's traceback


def test_html_survives_outcomes_missing_keys_or_odd_shapes(tmp_path):
    base = crafted_report(name="n")
    odd = [
        ExperimentRun(node="a", experiment="replay", params={}, status="ok", seconds=0.0, outcome={}),
        ExperimentRun(node="b", experiment="replay", params={}, status="timeout", seconds=9.0, outcome=None),
        ExperimentRun(node="c", experiment="replay", params={"x": [1, 2]}, status="ok", seconds=0.0,
                      outcome={"losses": ["NaN", "Infinity", 1.0], "grad_norms": [], "lrs": "oops",
                               "layer_norms": [{"norm": 1.0}, "junk"], "layers": [{"name": "l"}],
                               "source_context": "a\nb", "first_nonfinite_step": "soon",
                               "table": [{"k": 1}, {"j": None}], "nested": {"a": {"b": 1}}}),
    ]
    report = base.model_copy(update={"experiments": odd, "proof": "c", "history": [], "decisions": []})
    html = write_report(report, tmp_path)["html"].read_text()
    assert 'id="exp-3"' in html and "timeout" in html


def test_key_figures_name_the_clause_the_engine_found_held():
    report = crafted_report(name="n")
    # `n0.max_rise > 1.0 or n0.finite` held through `finite` alone (max_rise was 0.5).
    assert key_figures(report) == [("stayed finite (n0)", "true")]


def test_key_figures_come_from_the_engine_not_from_rounded_figures():
    # max_rise was 1.00001: it shows as 1 at four digits, yet `> 1.0` held. The report names the clause
    # the engine recorded instead of re-evaluating the condition on the rounded figure.
    report = crafted_report(name="n")
    decision = Decision(node="n0", goto="n1", when="n0.max_rise > 1.0 or n0.finite",
                        figures={"n0.max_rise": 1.0, "n0.finite": False},
                        settled=[Clause(text="n0.max_rise > 1.0", refs=["n0.max_rise"])])
    report = report.model_copy(update={"decisions": [decision, *report.decisions[1:]]})
    assert key_figures(report) == [("largest rise of the loss (n0)", "1 × start loss")]


# --- escaping and self-containment --------------------------------------------------------------

def test_user_text_is_escaped_everywhere(tmp_path):
    report = crafted_report(name=XSS, text=XSS)
    files = write_report(report, tmp_path)
    html = files["html"].read_text()
    assert XSS not in html
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for svg in inline_svgs(html):
        assert "<script" not in svg.lower()
    # Module names in the bar labels went through matplotlib's escaping, and are there.
    assert any("enc.&lt;script&gt;" in svg for svg in inline_svgs(html))
    # and were anything to slip through, the page forbids itself from running or loading it
    head = html[:html.index("<style>")]
    assert "Content-Security-Policy" in head and "default-src 'none'" in head and "script-src" not in head
    md = files["md"].read_text()
    outside_code = re.sub(r"(`+).*?\1", "", re.sub(r"^```.*?^```", "", md, flags=re.S | re.M), flags=re.S)
    assert "<script" not in outside_code


def test_html_fetches_nothing_and_runs_nothing(tmp_path):
    html = write_report(crafted_report(name="n"), tmp_path)["html"].read_text()
    remote = re.compile(r"""(?:\b(?:src|href|xlink:href|action|poster)\s*=\s*["']?\s*(?:https?:)?//)"""
                        r"""|(?:url\(\s*["']?\s*(?:https?:)?//)|@import""", re.I)
    assert remote.findall(html) == []
    assert "<script" not in html and "<link" not in html and "<iframe" not in html


def test_ten_experiment_report_stays_under_two_megabytes(tmp_path):
    report = crafted_report(name="n", n_experiments=10, steps=2000)
    size = write_report(report, tmp_path)["html"].stat().st_size
    assert size < 2_000_000, f"report.html is {size / 1e6:.2f} MB"


# --- plots and flowchart -----------------------------------------------------------------------

def test_loss_plot_goes_log_across_decades_and_marks_nonfinite():
    spanning = plots.loss_curves([figures.Series("run", [1.0, 10.0, 100.0, 1e4, "NaN"], first_nonfinite=4)])
    flat = plots.loss_curves([figures.Series("run", [1.0, 1.2, 1.1, 0.9])])
    ticks = lambda svg: re.findall(r">(\d[\d.e+-]*)</text>", svg)  # noqa: E731
    assert "10000" in ticks(spanning) and "0.9" not in ticks(spanning)
    assert "non-finite at step 4" in spanning and "non-finite" not in flat
    assert spanning.startswith("<svg") and "<?xml" not in spanning and "<metadata" not in spanning


def test_flowchart_layout_of_thirty_nodes_keeps_boxes_apart():
    # A playbook-sized graph: a chain of 12 questions, each with a leaf, some branches skipping ahead.
    runs = [f"q{i}" for i in range(12)]
    leaves = [f"cause{i}" for i in range(13)]
    edges = [GraphEdge(source=a, target=b, labels=["otherwise"]) for a, b in zip(runs, runs[1:])]
    edges += [GraphEdge(source=r, target=leaves[i], labels=[f"{r}.x > 1"]) for i, r in enumerate(runs)]
    edges += [GraphEdge(source=runs[i], target=runs[i + 3], labels=["skip"]) for i in range(0, 9, 3)]
    edges.append(GraphEdge(source=runs[-1], target=leaves[-1], labels=["otherwise"]))
    nodes = [GraphNode(id=n, kind="run", label="replay") for n in runs] + \
        [GraphNode(id=n, kind="leaf", label=n) for n in leaves]
    base = crafted_report(name="n")
    report = base.model_copy(update={
        "flowchart": Flowchart(name="big", nodes=nodes, edges=edges), "path": ["q0", "q3", "q4", "cause4"],
        "decisions": [Decision(node="q0", goto="q3", when="skip", figures={"q0.x": 0.5}),
                      Decision(node="q3", goto="q4", when=None, figures={}),
                      Decision(node="q4", goto="cause4", when="q4.x > 1", figures={"q4.x": 3.0})]})
    chart = flowchart.layout(report)
    assert sorted(b.id for b in chart.nodes) == sorted(runs + leaves)
    placed = chart.nodes
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            apart_x = a.left + a.w <= b.left or b.left + b.w <= a.left
            apart_y = a.y + a.h <= b.y or b.y + b.h <= a.y
            assert apart_x or apart_y, f"{a.id} overlaps {b.id}"
    assert [b.id for b in placed if b.walked] == ["q0", "q3", "q4", "cause4"]
    assert sum(e.taken for e in chart.edges) == 3


def test_gradient_bars_mark_a_parameter_without_gradient():
    svg = plots.layer_bars([("enc.weight", 0.0), ("head.weight", 0.1)], "Gradient norm", "norm", log=True)
    assert re.search(r">0</text>", svg) and "enc.weight" in svg
    assert not re.search(r">0</text>", plots.layer_bars([("a", 0.5), ("b", 0.1)], "Dead", "f", limit=(0, 1)))


def test_the_walked_path_is_listed_with_its_questions_and_clauses_and_the_chart_folded(diverged, tmp_path):
    html = write_report(diverged, tmp_path)["html"].read_text()
    walk_list = html[html.index('<ol class="walk">'):html.index('<details class="chart">')]
    # Every step, in the order walked, with its question; the held clauses as the engine recorded them.
    positions = [walk_list.index(f"<code>{d.node}</code>") for d in diverged.decisions]
    assert positions == sorted(positions)
    titles = {n.id: n.title for n in diverged.flowchart.nodes}
    for decision in diverged.decisions:
        if titles.get(decision.node):
            assert escape(titles[decision.node]) in walk_list
        for clause in decision.settled if decision.when is not None else []:  # otherwise: none held
            assert f"<code>{escape(condition_words(clause.text, decision.node))}</code>" in walk_list
    if any(d.candidates for d in diverged.decisions):
        assert 'href="#differential"' in walk_list
    # The whole flowchart is there, folded below the list; the list comes before the evidence.
    assert html.index('<ol class="walk">') < html.index('<details class="chart">') \
        < html.index('<svg class="flowchart"') < html.index('id="evidence"')
