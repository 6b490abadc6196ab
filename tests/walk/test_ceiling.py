"""Budgets in steps: the verdict does not depend on the machine's speed, and the user's one clock, the
--max-minutes ceiling, cuts a walk without ever reading a cut experiment as a ruled-out one."""

import json
import time

import pytest
from typer.testing import CliRunner

import triage
from tests.tiny import mlp_setup
from triage.cli import api
from triage.cli.commands import app
from triage.errors import PlaybookError
from triage.experiments import base
from triage.load.session import session_from_factory
from triage.walk.engine import walk
from triage.walk.playbook import load_playbook


class SlowClock:
    """A machine 1000x slower than any: every reading of the clock is 1000 s after the last."""

    def __init__(self) -> None:
        self.now = time.perf_counter()

    def perf_counter(self) -> float:
        self.now += 1000.0
        return self.now


def _decisions(result):
    return (result.path, result.leaf.diagnosis, result.confidence,
            {node: (run.status, (run.outcome or {}).get("steps_run")) for node, run in result.runs.items()})


@pytest.mark.parametrize("lr", [0.05, 5.0], ids=["healthy", "diverges"])
def test_a_slow_machine_reaches_the_same_verdict_by_the_same_steps(lr, monkeypatch):
    """Every experiment runs its steps however long each takes: on a clock where each step seems to take
    1000 s, the walk takes the same path, measures the same steps and reaches the same verdict."""
    factory = lambda: mlp_setup(lr=lr)  # noqa: E731
    fast = walk(session_from_factory(factory), load_playbook())
    monkeypatch.setattr(base, "time", SlowClock())
    slow = walk(session_from_factory(factory), load_playbook())
    assert _decisions(slow) == _decisions(fast)
    assert all(run.status == "ok" for run in slow.runs.values())
    assert slow.cut == [] and slow.stopped is None


LONG = """
name: t
entry: base
nodes:
  base:
    run: replay
    with: {steps: 100000}
    otherwise: fine
  fine:
    diagnosis: healthy
    fix: nothing
"""


def test_the_ceiling_cuts_the_experiment_in_flight_and_the_report_names_it(tmp_path):
    book = tmp_path / "long.yaml"
    book.write_text(LONG)
    report, files = api.run(lambda: mlp_setup(), out=tmp_path / "r", playbook=book, max_minutes=0.02)
    assert report.cut == ["base"]
    assert report.confidence == "low" and report.root_cause == "inconclusive"
    assert "healthy" not in report.path  # a cut replay decides nothing
    run = report.experiment("base")
    assert run.status == "timeout" and run.outcome["truncated"] is True
    assert 0 < run.outcome["steps_run"] < 100000
    assert f"cut 'base' after {run.outcome['steps_run']} of its 100000 steps" in report.stopped
    assert "--max-minutes" in report.fix and "not ruled out" in report.fix
    assert "could not be replayed" not in report.title and "traceback" not in report.fix  # it was cut, not broken
    saved = json.loads(files["json"].read_text())
    assert saved["cut"] == ["base"] and saved["confidence"] == "low"
    assert "cut 'base'" in files["md"].read_text()


DIFFERENTIAL = """
name: t
entry: base
nodes:
  base:
    run: replay
    with: {steps: 5}
    otherwise: fixes
  fixes:
    differential:
      quick:
        run: replay
        with: {steps: 5, lr_scale: 0.5, against: base}
        then: found
      slow:
        run: replay
        with: {steps: 100000, lr_scale: 0.1, against: base}
        then: found
    otherwise: nothing_works
  found:
    diagnosis: lr_too_high
    fix: lower it
  nothing_works:
    diagnosis: unexplained
    fix: none of the fixes worked
"""


def test_a_cut_candidate_is_not_ruled_out(tmp_path):
    """The ceiling cuts the second candidate: the walk does not go on as if no fix worked."""
    book = tmp_path / "differential.yaml"
    book.write_text(DIFFERENTIAL)
    result = walk(session_from_factory(mlp_setup), load_playbook(book), max_seconds=1.5)
    assert result.cut == ["slow"]
    assert result.runs["slow"].status == "timeout"
    assert "nothing_works" not in result.path and "found" not in result.path
    assert result.leaf.diagnosis == "inconclusive" and result.confidence == "low"


def test_a_ceiling_passed_before_an_experiment_begins_cuts_it_unstarted(tmp_path):
    book = tmp_path / "long.yaml"
    book.write_text(LONG)
    result = walk(session_from_factory(mlp_setup), load_playbook(book), max_seconds=1e-9)
    assert result.cut == ["base"] and "base" not in result.runs
    assert "passed before 'base' began" in result.stopped


def test_a_playbook_budget_in_seconds_is_ignored_with_a_warning(tmp_path, caplog):
    book = tmp_path / "budget.yaml"
    book.write_text(LONG.replace("    with: {steps: 100000}", "    with: {steps: 3}\n    budget_s: 0.000001"))
    result = walk(session_from_factory(mlp_setup), load_playbook(book))
    assert result.runs["base"].status == "ok" and result.runs["base"].outcome["steps_run"] == 3
    assert any("budget_s: 1e-06 is ignored" in r.getMessage() and "--max-minutes" in r.getMessage()
               for r in caplog.records)


def _checkpoint(folder):
    setup = mlp_setup()
    return str(triage.save_checkpoint(folder / "ckpt.pt", setup.model, setup.optimizer, step=0))


@pytest.mark.parametrize("value", ["0", "-1", "inf"])
def test_max_minutes_must_be_a_positive_number(value, tmp_path):
    result = CliRunner().invoke(app, ["run", "--entry", "tests.tiny:mlp_setup", "--out", str(tmp_path / "out"),
                                      "--checkpoint", _checkpoint(tmp_path), "--max-minutes", value])
    assert result.exit_code == 2
    assert "Expected --max-minutes to be a positive number of minutes" in result.output


def test_the_command_line_says_what_the_ceiling_cut_and_exits_3(tmp_path):
    result = CliRunner().invoke(app, ["run", "--entry", "tests.tiny:mlp_setup", "--out", str(tmp_path / "out"),
                                      "--checkpoint", _checkpoint(tmp_path), "--output", "quiet",
                                      "--max-minutes", "0.000001"])
    assert result.exit_code == 3, result.output
    assert "the walk stopped: the --max-minutes ceiling" in result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    [cut] = report["cut"]
    assert f"passed before '{cut}' began" in report["stopped"]
    assert report["confidence"] == "low" and cut not in {e["node"] for e in report["experiments"]}


def test_a_playbook_may_not_decide_on_an_experiments_wall_time(tmp_path):
    book = tmp_path / "seconds.yaml"
    book.write_text(LONG.replace("    otherwise: fine", "    branches:\n      - when: base.seconds > 10\n"
                                                       "        goto: fine\n    otherwise: fine"))
    with pytest.raises(PlaybookError, match="reads 'base.seconds'.*must not depend on how fast the machine is"):
        load_playbook(book)
