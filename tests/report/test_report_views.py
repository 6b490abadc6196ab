"""Views an experiment declares: checked at registration, carried in report.json, drawn without torch.

A team's experiment declares what the report should draw of its outcome; the report draws that and
nothing chosen by field names (its `outliers` and `losses` get no batch bars and no loss curves)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from tests.report.test_report_render import crafted_report, inline_svgs
from tests.tiny import mlp_setup
from triage.walk.engine import walk
from triage.experiments import Experiment, Outcome, Params, Registry, default_registry
from triage.errors import PlaybookError
from triage.walk.playbook import load_playbook
from triage.report import read_report, write_report
from triage.report.build import build_report
from triage.load.session import session_from_factory
from triage.views import Bars, Curve, Line, SourceExcerpt, Table, ViewError

REPO = Path(__file__).resolve().parents[2]


class Part(BaseModel):
    name: str
    heat: float


class WidgetOutcome(Outcome):
    temperature: list[float] = Field(description="Per step.")
    ambient: list[float] = Field(description="The room, per step.")
    parts: list[Part]
    peak: float
    # Names the built-in experiments also use: they must not pull in the built-in views.
    outliers: list[int] = Field(default_factory=list)
    losses: list[float] = Field(default_factory=list)
    current_lr: float = 0.1


class WidgetParams(Params):
    steps: int = 6


def measure_widgets(ctx, p: WidgetParams) -> WidgetOutcome:
    temperature = [20.0 + 3.0 * s for s in range(p.steps)]
    return WidgetOutcome(temperature=temperature, ambient=[20.0] * p.steps, peak=max(temperature),
                         parts=[Part(name="fan", heat=0.5), Part(name="core", heat=4.0)],
                         outliers=[1, 2], losses=[1.0, 0.5, 0.25], current_lr=0.01)


WIDGET_VIEWS = (
    Curve(title="Widget temperature per step", field="temperature", ylabel="°C", label="widget",
          lines=(Line(field="ambient", label="room", style="reference"),)),
    Bars(title="Heat of each part", field="parts", value="heat", labels="name", axis_label="heat"),
    Table(title="Parts", fields=("parts",), columns=("name", "heat")),
)

WIDGETS = Experiment("widget_probe", "Heats the widgets", WidgetParams, WidgetOutcome, measure_widgets,
                     views=WIDGET_VIEWS)

BOOK = """
name: widgets
entry: probe
nodes:
  probe:
    run: widget_probe
    title: Do the widgets run hot?
    branches:
      - when: probe.peak > 30
        goto: overheat
    otherwise: fine
  overheat:
    diagnosis: widget_overheat
    title: The widgets overheat
    fix: Cool the widgets.
    evidence: [probe]
  fine:
    diagnosis: healthy
    fix: Nothing to do.
"""


@pytest.fixture(scope="module")
def widget_report(tmp_path_factory):
    registry = default_registry()
    registry.register(WIDGETS)
    path = tmp_path_factory.mktemp("book") / "widgets.yaml"
    path.write_text(textwrap.dedent(BOOK))
    book = load_playbook(path, registry)
    session = session_from_factory(mlp_setup)
    return build_report(walk(session, book), session, book, "triage run --playbook widgets.yaml", None)


def test_a_third_party_experiment_gets_the_views_it_declares(widget_report, tmp_path):
    assert widget_report.root_cause == "widget_overheat"
    assert widget_report.views["widget_probe"] == list(WIDGET_VIEWS)
    files = write_report(widget_report, tmp_path)
    html = files["html"].read_text()
    article = html[html.index('id="exp-1"'):html.index('id="location"') if 'id="location"' in html else None]
    drawn = inline_svgs(article)
    assert len(drawn) == 2  # its curve and its bars, nothing else
    assert "Widget temperature per step" in drawn[0] and "room" in drawn[0]
    assert "Heat of each part" in drawn[1] and "core" in drawn[1]
    assert "<caption>Parts" in article
    # Its `outliers`, `losses` and `current_lr` are figures, not the built-in batch bars, loss curve
    # or LR range plot that chose by those names.
    assert "snapshot batch" not in article and "Loss per step" not in article and "LR range" not in article
    assert "current LR" in article  # in words, from the one table of labels (report/labels.py)
    # report.json carries the declarations: reading it back gives the same page.
    assert json.loads(files["json"].read_text())["views"]["widget_probe"][0]["field"] == "temperature"
    again = write_report(read_report(files["json"]), tmp_path / "again")
    assert again["html"].read_text() == html


def test_a_renamed_outcome_field_fails_at_registration():
    renamed = Experiment("widget_probe", "Heats the widgets", WidgetParams, WidgetOutcome, measure_widgets,
                         views=(Curve(title="Widget temperature per step", field="temperatures"),))
    with pytest.raises(ViewError) as caught:
        Registry([renamed])
    message = str(caught.value)
    assert "'widget_probe'" in message and "'temperatures'" in message and "WidgetOutcome" in message
    assert "temperature" in message.split("it has:")[1]  # the fields it does have, to pick from


@pytest.mark.parametrize("view, problem", [
    (Curve(title="t", field="peak"), "not a list"),
    (Curve(title="t", field="temperature", threshold="parts"), "not a number"),
    (Bars(title="b", field="parts", value="warmth", labels="name"), "no key 'warmth'"),
    (SourceExcerpt(field="temperature"), "not of triage.views.SourceLine"),
    (Table(title="t", fields=("parts",), columns=("name", "colour")), "no key 'colour'"),
    (Curve(title="t", field="temperature", lines=(Line(field="room", label="room"),)), "no such field"),
])
def test_a_view_that_does_not_fit_its_outcome_is_refused(view, problem):
    experiment = Experiment("widget_probe", "w", WidgetParams, WidgetOutcome, measure_widgets, views=(view,))
    with pytest.raises(ViewError, match=problem):
        Registry([experiment])


def test_a_playbook_import_with_a_broken_view_names_the_playbook(tmp_path, monkeypatch):
    (tmp_path / "team_widgets.py").write_text(textwrap.dedent("""
        from tests.report.test_report_views import WidgetOutcome, WidgetParams, measure_widgets
        from triage.experiments import Experiment
        from triage.views import Curve
        EXPERIMENTS = [Experiment("widget_probe", "w", WidgetParams, WidgetOutcome, measure_widgets,
                                  views=(Curve(title="T", field="temp"),))]
    """))
    book = tmp_path / "widgets.yaml"
    book.write_text("imports: [team_widgets]\n" + textwrap.dedent(BOOK))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO))
    with pytest.raises(PlaybookError, match=r"widgets.yaml.*'widget_probe'.*'temp'"):
        load_playbook(book, trust_imports=True)


def test_every_shipped_experiment_declares_views_that_fit():
    registry = default_registry()  # registering checks them
    drawn = {e.name for e in registry if e.views}
    assert {"replay", "batch_scan", "lr_range_test", "gradient_flow", "activation_health", "lr_trace",
            "loop_diff", "locate_nonfinite", "lr_search", "init_search"} <= drawn


# Renders report.json (argv[2]) with the report package alone (argv[1]; triage/__init__ imports the engine,
# which `triage report` does not need) and a module that must not be imported (argv[3]) blocked.
RENDER_WITHOUT = r"""
import importlib.abc, sys, types
blocked = sys.argv[3]
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == blocked:
            raise ImportError(f"{blocked} is not to be imported here")
sys.meta_path.insert(0, Blocked())
package = types.ModuleType("triage")
package.__path__ = [sys.argv[1]]
sys.modules["triage"] = package
from triage.report.render import read_report, render_html
sys.stdout.write(render_html(read_report(sys.argv[2])))
assert blocked not in sys.modules
"""


def test_report_json_renders_without_torch(widget_report, tmp_path):
    files = write_report(widget_report, tmp_path)
    done = subprocess.run([sys.executable, "-c", RENDER_WITHOUT, str(REPO / "triage"), str(files["json"]), "torch"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == files["html"].read_text()


def test_a_report_from_schema_1_2_still_renders(tmp_path):
    data = json.loads(crafted_report(name="n").model_dump_json())
    data["schema_version"] = "1.2"
    del data["views"]
    for decision in data["decisions"]:
        del decision["settled"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    html = write_report(read_report(path), tmp_path / "out")["html"].read_text()
    assert "Learning rate too high" in html and 'id="exp-1"' in html
    assert "n0.finite" in html  # a decision without recorded clauses shows every figure it read


def test_a_search_is_shown_against_the_run_its_fix_is_verified_against():
    from tests.report.test_report_render import replay_outcome
    from triage.records import ExperimentRun
    from triage.report.sections import build_views

    base = crafted_report(name="n")
    search = ExperimentRun(node="lower_lr", experiment="lr_search", status="ok", seconds=1.0,
                           params={"steps": 40, "against": "n0", "direction": "down"},
                           outcome=replay_outcome([2.0 * 0.9 ** s for s in range(40)], chosen="lr x0.1",
                                                  against="n0"))
    report = base.model_copy(update={"experiments": [*base.experiments, search], "proof": "lower_lr"})
    views = build_views(report)
    # A different experiment than the baseline's, yet compared with it: the run it was verified against.
    assert views.proof.reference == "n0" and views.proof.changes == ["lr x0.1"]
    assert views.proof_table and "lower_lr (with the fix)" in views.proof_plot and "n0 (as the run)" in views.proof_plot
