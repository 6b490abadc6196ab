"""Racing in the replays and the walk: a candidate that can no longer change the verdict stops, says why, and
the verdict is the one every candidate run to its last step gives."""

import html
import json
import sys
from pathlib import Path

from tests.tiny import context, mlp_setup
from triage.experiments.replay import REPLAY, ReplayParams
from triage.experiments.search import LR_SEARCH, LrSearchParams
from triage.speedups import Speedups, using

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from suite.runner import run_case  # noqa: E402


def with_baseline(factory, race: bool, steps: int = 30):
    ctx = context(factory)
    ctx.outcomes["base"] = REPLAY.measure(ctx, ReplayParams(steps=steps))
    ctx.restart()
    ctx.race = ctx.racing = race
    return ctx


def test_a_replay_that_cannot_work_stops_early_and_says_why():
    """A healthy MLP replayed at lr x1e-4 against itself: it cannot end 20% under the run."""
    ctx = with_baseline(lambda: mlp_setup(lr=0.05), race=True)
    raced = REPLAY.measure(ctx, ReplayParams(steps=30, lr_scale=1e-4, against="base"))
    assert raced.steps_run < 30 and not raced.fix_works
    assert raced.raced_out.startswith(f"stopped after {raced.steps_run} of its 30 steps")
    assert "work against 'base'" in raced.raced_out
    ctx.restart()
    ctx.race = False
    full = REPLAY.measure(ctx, ReplayParams(steps=30, lr_scale=1e-4, against="base"))
    assert full.steps_run == 30 and full.raced_out is None and not full.fix_works


def test_a_raced_lr_search_finds_the_same_fix_in_fewer_steps():
    """lr 50 where 0.05 trains: x0.1 still blows up (to 3e5, as far from working as a loss gets) and stops early."""
    found = {}
    for race in (False, True):
        ctx = with_baseline(lambda: mlp_setup(lr=50.0), race=race)
        out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="down", against="base"))
        found[race] = (out.fix_works, out.lr_factor, out.least_working_factor, out.loss_end,
                       sum(t.steps_run for t in out.trials), [t.raced_out for t in out.trials])
    assert found[True][:4] == found[False][:4]
    assert found[True][4] < found[False][4]
    assert any(found[True][5]) and not any(found[False][5])


def test_a_search_whose_choice_another_node_reads_races_only_what_cannot_change_its_choice():
    """A healthy MLP searched upwards (the plateau's higher_lr, whose chosen factor the long window replays):
    no LR works, so its choice is the trial that ends lowest. A trial that can neither work nor end below the
    lowest so far stops; the choice and its figures are those of the search without racing."""
    found = {}
    for racing in (False, True):
        ctx = with_baseline(lambda: mlp_setup(lr=0.05), race=False)
        ctx.racing = racing
        with using(Speedups.none()):  # one at a time: raced against the trial just before too (test_lanes.py)
            out = LR_SEARCH.measure(ctx, LrSearchParams(steps=30, direction="up", against="base"))
        found[racing] = out
    plain, raced = found[False], found[True]
    assert not plain.fix_works and (raced.chosen, raced.lr_factor, raced.loss_end, raced.improvement) == (
        plain.chosen, plain.lr_factor, plain.loss_end, plain.improvement)
    stopped = [t for t in raced.trials if t.raced_out]
    assert stopped and all("the lowest so far" in t.raced_out for t in stopped)
    assert sum(t.steps_run for t in raced.trials) < sum(t.steps_run for t in plain.trials)


def steps_replayed(report_folder: str) -> int:
    """Every step the walk's replays ran, as its report.json records them (each trial of a search included)."""
    report = json.loads((Path(report_folder) / "report.json").read_text())
    return sum(run["outcome"].get("steps_run") or 0 if not run["outcome"].get("trials") else
               sum(t.get("steps_run") or 0 for t in run["outcome"]["trials"])
               for run in report["experiments"] if run.get("outcome") and not run.get("same_as"))


def test_a_walk_gives_the_same_verdict_with_and_without_racing(tmp_path):
    """The suite's tabular regressor with an init 30x too large: a standard init repairs it; candidates that
    cannot work stop part way. The verdict, its confidence and path are those of the walk that runs every
    candidate to its end, in fewer steps, and the page shows why each candidate stopped."""
    case = "bad_initialization-tabular_regressor-adamw-mild-0"
    full = run_case((case, str(tmp_path / "cache"), str(tmp_path / "full"), True, False))
    raced = run_case((case, str(tmp_path / "cache"), str(tmp_path / "raced"), True, True))
    assert full.error is None and raced.error is None, full.error or raced.error
    assert (raced.predicted, raced.confidence, raced.path) == (full.predicted, full.confidence, full.path)
    assert raced.predicted == "bad_initialization"
    assert steps_replayed(raced.report) < steps_replayed(full.report)
    report = json.loads((Path(raced.report) / "report.json").read_text())
    stopped = [c for d in report["decisions"] for c in d["candidates"] if c.get("raced_out")]
    assert stopped and not any(c.get("winner") for c in stopped)
    page = html.unescape((Path(raced.report) / "report.html").read_text())
    assert all(c["raced_out"] in page for c in stopped)


def test_a_candidate_stopped_on_easy_batches_never_wins(tmp_path):
    """The suite's held-back healthy ResNet (SGD): paired with the run step by step, its clip at the typical
    gradient norm was stopped at step 10, where the batches are easy, its end window 0.72 against the run's
    1.04 at step 40: read as working, it made the run `exploding_gradients` (high). Stopped, it never wins:
    the verdict is that of the walk that runs every candidate to its end."""
    case = "healthy-resnet-sgd-severe-1"
    full = run_case((case, str(tmp_path / "cache"), str(tmp_path / "full"), True, False))
    raced = run_case((case, str(tmp_path / "cache"), str(tmp_path / "raced"), True, True))
    assert full.error is None and raced.error is None, full.error or raced.error
    assert raced.predicted == full.predicted == "healthy"
    report = json.loads((Path(raced.report) / "report.json").read_text())
    stopped = [c for d in report["decisions"] for c in d["candidates"] if c.get("raced_out")]
    assert stopped and not any(c.get("works") or c.get("winner") for c in stopped)
