"""The real-programs benchmark (benchmarks/programs.py): its programs keep their contract and certificates,
its split is by program, and CI's sample is triaged end to end to a verdict, as a user would run it."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import programs as bench  # noqa: E402  (benchmarks/programs.py)
from triage.causes import ROOT_CAUSES  # noqa: E402

NAMES = bench._program.names()


def test_there_are_forty_programs_or_more_and_a_third_is_held_back_by_name():
    assert len(NAMES) >= 40
    first_round = [n for n in NAMES if bench.split_of(n) in ("tune", "heldout")]  # later rounds: splits of their own
    held = [n for n in first_round if bench.split_of(n) == "heldout"]
    assert 0.25 <= len(held) / len(first_round) <= 0.42, held


@pytest.mark.parametrize("name", NAMES)
def test_each_program_has_the_interface_and_names_real_root_causes(name):
    module = bench._program.load(name)
    program = module.PROGRAM
    assert program.name == name
    assert "healthy" in program.runs and len(program.runs) >= 2
    for run, spec in program.runs.items():
        assert spec.cause in ROOT_CAUSES, f"{name}/{run}: {spec.cause} is not a root-cause id"
        assert callable(getattr(module, f"setup_{run}", None)), f"{name} has no setup_{run}"
        if run != "healthy":
            assert spec.fix and spec.competing, f"{name}/{run} names no fix or no competing fix"
    assert {"run", "out_dir", "seed", "variant"} <= set(inspect.signature(module.train).parameters)


def test_every_program_has_a_certificate_that_matches_its_source_and_passed():
    certified = bench.certified_runs()
    for name in NAMES:
        runs = bench._program.load(name).PROGRAM.runs
        assert set(certified.get(name, {})) == set(runs), f"{name}: no current certificate (run --certify)"
        assert all(certified[name].values()), f"{name}: a run failed its certificate: {certified[name]}"


def test_the_programs_table_in_the_benchmark_readme_is_current():
    readme = (ROOT / "benchmarks" / "programs" / "README.md").read_text()
    assert bench.table() in readme, "re-paste `python benchmarks/programs.py --list` into the README"


def test_a_sample_fault_still_reproduces_and_its_fix_still_works_on_this_torch():
    """The certificate of one fault, seed 0, re-run here: the benchmark's ground truth is stock PyTorch's."""
    name, run = bench.CI_CERTIFY
    checks = bench._program.certify(bench._program.load(name), run, seeds=(0,))
    assert [c.ok for c in checks] == [True] * len(checks), [(c.variant, c.symptom) for c in checks]


def test_the_ci_sample_is_triaged_to_a_verdict_per_run(tmp_path):
    out = tmp_path / "sample.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "programs.py"), "--sample", "ci",
                           "--workers", "1", "--json", str(out), "--cache", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    assert {(r["program"], r["run"]) for r in rows} == set(bench.CI_SAMPLE)
    for r in rows:
        assert r["got"] in ROOT_CAUSES and r["confidence"] in ("high", "medium", "low"), r
        assert r["error"] is None, r
    top1 = re.search(r"top-1\s+(\d+)/(\d+)", done.stdout)
    assert top1 and int(top1.group(2)) == len(rows)
    assert int(top1.group(1)) == sum(r["got"] == r["want"] for r in rows)


@pytest.mark.parametrize("name, run, was, now", [
    ("tabular_embeddings_mlp", "healthy", "train_val_overlap", "healthy"),  # issue 33 class 1: ids repeat
    ("gcn_node_full_batch", "healthy", "train_val_overlap", "healthy"),     # class 5: train/val by masks
    ("keyword_spotting_cnn", "healthy", "overfitting", "healthy"),          # class 3: a noisy val
    ("vit_mixup_timm", "scheduler_per_step", "unexplained", "lr_schedule_decayed"),  # class 9: LR ~0
    ("ppo_cartpole", "anneal_per_minibatch", "unexplained", "lr_schedule_decayed"),
])
def test_tune_programs_the_blind_figure_got_wrong_are_right(tmp_path, name, run, was, now):
    """Runs of the tune split that the blind figure got wrong (`was`), triaged end to end."""
    assert bench.split_of(name) == "tune"  # the held-back third is never tuned on
    result = bench.triage_one(name, run, tmp_path / "cache", keep=None, speedups=False)
    assert result.error is None and result.got == now, (result.got, result.confidence, result.error)
