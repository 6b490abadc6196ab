"""End to end: `triage.run` on every zoo example (and every held-out variant) names its root cause."""

import hashlib
import json
from pathlib import Path

import pytest

import triage
from triage.cli.zoo import example_names, example_path, load_example

EXAMPLES = example_names()
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
HOLDOUT_SETS = [BENCHMARKS / "holdout", BENCHMARKS / "holdout2"]
# Known misses, each with why; strict: the day one is fixed, the test says so.
KNOWN_MISSES: dict[str, str] = {}


def triage_example(name, tmp_path, **kwargs):
    checkpoint = load_example(name).write_checkpoint(tmp_path / f"{name}.pt")
    report, files = triage.run(f"{example_path(name)}:setup", checkpoint, out=tmp_path / "out", **kwargs)
    return checkpoint, report, files


@pytest.mark.parametrize("name", EXAMPLES)
def test_triage_names_the_root_cause(name, tmp_path):
    example = load_example(name)
    _, report, files = triage_example(name, tmp_path)
    assert report.root_cause == example.ROOT_CAUSE, report.path
    written = json.loads(files["json"].read_text())
    assert written["root_cause"] == example.ROOT_CAUSE
    for key, value in getattr(example, "LOCATION", {}).items():
        assert getattr(report.location, key) == value, (key, report.location)


@pytest.mark.parametrize("folder, name", [
    pytest.param(folder, name, id=f"{folder.name}/{name}", marks=[pytest.mark.xfail(
        reason=KNOWN_MISSES[name], strict=True)] if name in KNOWN_MISSES else [])
    for folder in HOLDOUT_SETS for name in example_names(folder)])
def test_triage_names_the_root_cause_of_differently_built_runs(folder, name, tmp_path):
    example = load_example(name, folder)
    checkpoint = example.write_checkpoint(tmp_path / f"{name}.pt")
    report, _ = triage.run(f"{example_path(name, folder)}:setup", checkpoint, out=tmp_path / "out")
    assert report.root_cause == example.ROOT_CAUSE, report.path


def test_two_runs_give_the_same_diagnosis_and_measurements(tmp_path):
    _, first, _ = triage_example("lr_too_high", tmp_path / "a")
    _, second, _ = triage_example("lr_too_high", tmp_path / "b")
    assert (first.root_cause, first.path) == (second.root_cause, second.path)
    losses = [[e.outcome.get("losses") for e in r.experiments] for r in (first, second)]
    assert losses[0] == losses[1]


def test_the_checkpoint_file_is_not_written(tmp_path):
    checkpoint = load_example("lr_too_high").write_checkpoint(tmp_path / "c.pt")
    before = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    mtime = checkpoint.stat().st_mtime_ns
    triage.run(f"{example_path('lr_too_high')}:setup", checkpoint, out=tmp_path / "out")
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == before
    assert checkpoint.stat().st_mtime_ns == mtime
