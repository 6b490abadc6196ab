"""Distributed triage end to end: 2-rank gloo runs on CPU (DDP and FSDP2), each fault of the distributed
zoo (examples/distributed/) triaged to its root cause with the report a user would read, the fixes
measured, a healthy run, lr_too_high given the same verdict on 2 ranks and in one process, and a rank
that raises or hangs stopping the walk with a report naming it.

The walks share one 2-rank process group (forked from the test, one fixture for the module): the API's
path inside a distributed program. The torchrun path (triage starting the process group) is taken by
the raising-rank test and the two CLI tests, which launch torchrun itself."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import triage
from tests.distributed_runs import EXAMPLES, on_ranks
from triage.cli.zoo import load_example

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # the helper scripts sit at tests/

# (case id, example, setup function, checkpoint writer): every one triaged with the default playbook
CASES = [
    ("healthy_ddp", "healthy", "setup", "write_checkpoint"),
    ("healthy_fsdp2", "healthy", "fsdp_setup", "write_fsdp_checkpoint"),
    ("lr_too_high_ddp", "lr_too_high", "setup", "write_checkpoint"),
    ("identical_rank_data_ddp", "identical_rank_data", "setup", "write_checkpoint"),
    ("identical_rank_data_fsdp2", "identical_rank_data", "fsdp_setup", "write_fsdp_checkpoint"),
    ("epoch_order_repeated_ddp", "epoch_order_repeated", "setup", "write_checkpoint"),
    ("epoch_order_repeated_fsdp2", "epoch_order_repeated", "fsdp_setup", "write_fsdp_checkpoint"),
    ("replicas_unwrapped", "replicas_unwrapped", "setup", "write_checkpoint"),
    ("replicas_ignored_param", "replicas_ignored_param", "setup", "write_checkpoint"),
    ("replicas_rank_seed", "replicas_rank_seed", "setup", "write_checkpoint"),
    ("nonfinite_one_rank", "nonfinite_one_rank", "setup", "write_checkpoint"),
    # across layouts: rank 0's full state dict into FSDP2 (each rank keeps its shard), FSDP2's DCP folder into DDP
    ("healthy_fsdp2_from_full", "healthy", "fsdp_setup", "write_checkpoint"),
    ("healthy_ddp_from_dcp", "healthy", "setup", "write_fsdp_checkpoint"),
]
# The fixed runs, through the distributed checks alone: what each check measures once the fault is fixed.
FIXED = ["identical_rank_data", "epoch_order_repeated", "replicas_unwrapped", "replicas_ignored_param",
         "replicas_rank_seed"]
CHECKS_ONLY = """
name: distributed-checks
entry: replicas
nodes:
  replicas: {run: replica_sync, otherwise: rank_data}
  rank_data: {run: rank_data, otherwise: epochs}
  epochs: {run: epoch_order, otherwise: done}
  done: {diagnosis: healthy, fix: nothing}
"""


def _walk_everything(folder: str) -> dict:
    """On each rank: one process group, every checkpoint written by the faulty run, every case triaged."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=60))
    folder = Path(folder)
    out: dict = {}
    checkpoints = {}
    for case, name, _, writer in CASES:
        if (name, writer) not in checkpoints:
            checkpoints[name, writer] = getattr(load_example(name, EXAMPLES), writer)(folder / f"{name}-{writer}")
    for case, name, setup_name, writer in CASES:
        started = time.perf_counter()
        report, files = triage.run(f"{EXAMPLES / name}.py:{setup_name}", checkpoints[name, writer],
                                   out=folder / case, rank_timeout=60)
        out[case] = {"report": report.data(), "files": {k: str(v) for k, v in files.items()},
                     "seconds": time.perf_counter() - started, "checkpoint": str(checkpoints[name, writer])}
    playbook = folder / "checks.yaml"
    if dist.get_rank() == 0:
        playbook.write_text(CHECKS_ONLY)
    dist.barrier()
    for name in FIXED:
        report, _ = triage.run(f"{EXAMPLES / name}.py:fixed_setup", None, out=folder / f"fixed-{name}",
                               playbook=playbook, rank_timeout=60)
        out[f"fixed-{name}"] = {"report": report.data()}
    # The one-rank NaN's fix (an eps in the norm): the run's own loop on both ranks from setup()'s init, 40
    # steps over the 12-batch snapshot (the blank example's batch at steps 2, 14, 26 and 38).
    example = load_example("nonfinite_one_rank", EXAMPLES)
    from _dist_zoo import train

    out["nonfinite_one_rank-trained"] = {kind: train(getattr(example, kind)(), steps=40)
                                         for kind in ("setup", "fixed_setup")}
    dist.destroy_process_group()
    return out


@pytest.fixture(scope="module")
def walks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distributed")
    ranks = on_ranks(_walk_everything, str(folder), timeout_s=600)
    for r in ranks:
        assert r.error is None, f"rank {r.rank} raised:\n{r.error}"
    return [r.value for r in ranks]


def _outcome(report: dict, node: str) -> dict:
    return next(e for e in report["experiments"] if e["node"] == node)["outcome"]


@pytest.mark.parametrize("case, name", [(c, n) for c, n, _, _ in CASES])
def test_each_rank_reaches_the_root_cause_and_rank_0_alone_writes_the_report(walks, case, name):
    example = load_example(name, EXAMPLES)
    rank0, rank1 = walks[0][case], walks[1][case]
    report = rank0["report"]
    assert report["root_cause"] == example.ROOT_CAUSE, report["path"]
    assert (rank1["report"]["root_cause"], rank1["report"]["path"]) == (report["root_cause"], report["path"])
    assert set(rank0["files"]) == {"html", "json", "md"} and rank1["files"] == {}
    written = json.loads(Path(rank0["files"]["json"]).read_text())
    assert written["root_cause"] == example.ROOT_CAUSE
    assert written["environment"]["distributed"]["world_size"] == 2
    assert written["environment"]["distributed"]["backend"] == "gloo"
    assert written["environment"]["distributed"]["launch"].startswith("torchrun --nproc-per-node 2 -m triage run")
    for key, value in getattr(example, "LOCATION", {}).items():
        assert report["location"][key] == value, report["location"]


def test_every_figure_a_condition_read_is_the_same_on_both_ranks(walks):
    for case, *_ in CASES:
        figures = [[d["figures"] for d in walks[r][case]["report"]["decisions"]] for r in (0, 1)]
        assert figures[0] == figures[1], case


def test_the_wrapper_and_checkpoint_layout_are_reported(walks):
    assert walks[0]["healthy_fsdp2"]["report"]["environment"]["distributed"]["wrapper"] == "fsdp2"
    assert walks[0]["healthy_fsdp2"]["report"]["checkpoint"]["layout"] == "dcp"
    assert walks[0]["healthy_ddp"]["report"]["environment"]["distributed"]["wrapper"] == "ddp"
    assert walks[0]["replicas_unwrapped"]["report"]["environment"]["distributed"]["wrapper"] == "plain"
    assert walks[0]["healthy_ddp_from_dcp"]["report"]["checkpoint"]["layout"] == "dcp"
    assert walks[0]["healthy_fsdp2_from_full"]["report"]["environment"]["distributed"]["wrapper"] == "fsdp2"


def test_a_process_group_started_without_torchrun_reproduces_as_torchrun(monkeypatch):
    from triage.load.launch import launch_command
    from triage.load.ranks import TORCHRUN_VARIABLES

    for name in (*TORCHRUN_VARIABLES, "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    args = ["run", "--entry", "m:setup"]
    assert launch_command(args, world_size=4) == "torchrun --nproc-per-node 4 -m triage run --entry m:setup"
    assert launch_command(args) == "triage run --entry m:setup"


def test_a_nonfinite_value_on_one_rank_is_located_on_that_rank(walks):
    example = load_example("nonfinite_one_rank", EXAMPLES)
    rank0 = walks[0]["nonfinite_one_rank"]
    report = rank0["report"]
    assert report["location"]["rank"] == example.RANK
    assert report["location"]["source"].endswith("nonfinite_one_rank.py:27")
    baseline = _outcome(report, "baseline")
    assert baseline["first_nonfinite_ranks"] == [example.RANK]
    html = Path(rank0["files"]["html"]).read_text()
    assert 'id="ranks"' in html and f"the first non-finite value appeared on rank {example.RANK}" in html
    assert f"starts on rank {example.RANK}" in Path(rank0["files"]["md"]).read_text()


def test_an_eps_in_the_norm_fixes_the_nonfinite_value_on_one_rank(walks):
    faulty, fixed = (walks[0]["nonfinite_one_rank-trained"][kind] for kind in ("setup", "fixed_setup"))
    assert len(faulty) == 3 and not math.isfinite(faulty[-1])  # NaN at step 2, the blank example's batch
    assert len(fixed) == 40 and all(math.isfinite(x) for x in fixed) and fixed[-1] < 0.9 * fixed[0]


def test_the_report_shows_each_ranks_loss_where_ranks_differ(walks):
    rank0 = walks[0]["lr_too_high_ddp"]
    baseline = _outcome(rank0["report"], "baseline")
    assert len(baseline["rank_loss_end"]) == 2 and baseline["rank_loss_end"][0] != baseline["rank_loss_end"][1]
    html = Path(rank0["files"]["html"]).read_text()
    assert "end loss (own batches)" in html and "rank 1</th>" in html
    assert "world size 2 · backend gloo · ddp" in html


def test_replicas_out_of_sync_says_which_parameters_and_when(walks):
    unwrapped = _outcome(walks[0]["replicas_unwrapped"]["report"], "replicas")
    assert unwrapped["wrapper"] == "plain" and unwrapped["first_moment"] == "replay"
    assert unwrapped["out_of_sync_count"] == 6 and unwrapped["differ_at_checkpoint"] == []
    ignored = _outcome(walks[0]["replicas_ignored_param"]["report"], "replicas")
    assert ignored["wrapper"] == "ddp" and ignored["drifted"] == ["4.bias"]
    seeded = _outcome(walks[0]["replicas_rank_seed"]["report"], "replicas")
    assert seeded["first_moment"] == "init" and seeded["differ_at_checkpoint"] == [] and seeded["drifted"] == []
    assert seeded["loop"] == "user"  # the run's own step averages the gradients: it keeps loaded replicas equal


def test_identical_rank_data_is_measured_and_its_fix_tried(walks):
    faulty = _outcome(walks[0]["identical_rank_data_ddp"]["report"], "rank_data")
    assert faulty["identical_batch_fraction"] == 1.0 and faulty["identical_groups"] == [[0, 1]]
    assert faulty["sampler_shards"] is True  # a DistributedSampler over the same dataset splits it


@pytest.mark.parametrize("name", FIXED)
def test_the_fixed_run_passes_the_distributed_checks(walks, name):
    report = walks[0][f"fixed-{name}"]["report"]
    replicas, data, epochs = (_outcome(report, n) for n in ("replicas", "rank_data", "epochs"))
    assert replicas["applies"] and replicas["out_of_sync_count"] == 0, replicas["parameters"]
    assert data["identical_batch_fraction"] == 0.0
    assert epochs["repeats"] in (False, None)


def test_the_epoch_check_tries_set_epoch(walks):
    faulty = _outcome(walks[0]["epoch_order_repeated_ddp"]["report"], "epochs")
    assert faulty["repeats"] is True and faulty["fix_reshuffles"] is True
    assert faulty["sampler"] == "DistributedSampler"
    fixed = _outcome(walks[0]["fixed-epoch_order_repeated"]["report"], "epochs")
    assert fixed["repeats"] is False


@pytest.mark.parametrize("case, name", [("lr_too_high_ddp", "lr_too_high"), ("nonfinite_one_rank", "nonfinite_one_rank"),
                                        ("healthy_fsdp2", "healthy")])
def test_one_process_gets_the_same_verdict_from_the_same_checkpoint(walks, case, name, tmp_path):
    distributed = walks[0][case]["report"]
    report, _ = triage.run(f"{EXAMPLES / name}.py:setup", walks[0][case]["checkpoint"], out=tmp_path)
    assert report.root_cause == distributed["root_cause"]
    assert report.environment.distributed is None and report.location.rank is None


def _stopping_walk(setup_name: str, checkpoint: str, out: str) -> dict:
    """triage under torchrun's environment (it starts the process group), a rank misbehaving mid-walk."""
    started = time.perf_counter()
    report, files = triage.run(f"{TESTS / 'dist_faulty_ranks.py'}:{setup_name}", checkpoint, out=out,
                               rank_timeout=5)
    return {"report": report.data(), "files": {k: str(v) for k, v in files.items()},
            "seconds": time.perf_counter() - started}


def test_a_rank_that_raises_stops_the_walk_and_rank_0_reports_what_was_measured(walks, tmp_path):
    checkpoint = walks[0]["healthy_ddp"]["checkpoint"]
    ranks = on_ranks(_stopping_walk, "raising_setup", checkpoint, str(tmp_path), timeout_s=120)
    assert all(r.error is None for r in ranks), [r.error for r in ranks]
    report = ranks[0].value["report"]
    assert report["root_cause"] == "inconclusive"
    assert report["stopped"] == "rank 1 raised ValueError: a rank-local bug in the loss in experiment 'baseline'"
    assert report["path"][-1] == "stopped" and "init" in [e["node"] for e in report["experiments"]]
    assert "ValueError: a rank-local bug" in report["experiments"][-1]["error"]
    assert ranks[1].value["report"]["stopped"] == report["stopped"] and ranks[1].value["files"] == {}
    assert ranks[0].value["seconds"] < 60  # the rank timeout is 5 s
    assert json.loads(Path(ranks[0].value["files"]["json"]).read_text())["stopped"] == report["stopped"]


def _cli(args: list[str], timeout: float, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_torchrun_launches_triage_on_every_rank(walks, tmp_path):
    checkpoint = walks[0]["identical_rank_data_ddp"]["checkpoint"]
    done = _cli(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "triage", "run",
                 "--checkpoint", checkpoint, "--entry", f"{EXAMPLES / 'identical_rank_data.py'}:setup",
                 "--out", str(tmp_path / "out"), "--output", "quiet"], timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["root_cause"] == "identical_rank_data"
    assert report["command"].startswith("torchrun --nproc-per-node 2 -m triage run")
    assert report["environment"]["distributed"]["launch"] == report["command"]


def test_the_shorthand_starts_torchrun_and_a_hanging_rank_stops_the_walk_in_bounded_time(walks, tmp_path):
    checkpoint = walks[0]["healthy_ddp"]["checkpoint"]
    started = time.perf_counter()
    done = _cli(["-m", "triage", "run", "--nproc-per-node", "2", "--rank-timeout", "5", "--checkpoint", checkpoint,
                 "--entry", f"{TESTS / 'dist_faulty_ranks.py'}:hanging_setup", "--out", str(tmp_path / "out"),
                 "--output", "quiet"], timeout=300, cwd=tmp_path)
    assert done.returncode == 3, done.stderr[-3000:]
    assert time.perf_counter() - started < 200
    assert "the walk stopped: rank 1 stopped responding in experiment 'baseline'" in done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stopped"].startswith("rank 1 stopped responding in experiment 'baseline'")


def test_a_setup_that_needs_a_process_group_says_how_to_launch_it(tmp_path):
    from typer.testing import CliRunner

    from triage.cli.commands import app

    import torch

    torch.save({"w": torch.zeros(1)}, tmp_path / "c.pt")  # read before setup(), which refuses first
    result = CliRunner().invoke(app, ["run", "--entry", f"{TESTS / 'dist_faulty_ranks.py'}:needs_group_setup",
                                      "--checkpoint", str(tmp_path / "c.pt"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "needs a torch.distributed process group" in text and "--nproc-per-node N" in text
    assert "Traceback" not in result.output


def test_every_shipped_outcome_field_declares_a_known_rank_rule():
    from triage.walk.reduce import rule_of
    from triage.experiments import default_registry

    for experiment in default_registry():
        for field in experiment.outcome.model_fields:
            rule_of(experiment.outcome, field)  # raises on an unknown rule


def test_the_distributed_checks_are_quiet_in_a_single_process(tmp_path):
    from tests.tiny import mlp_setup

    path = tmp_path / "checks.yaml"
    path.write_text(textwrap.dedent(CHECKS_ONLY))
    report, _ = triage.run(mlp_setup, None, out=tmp_path / "out", playbook=path)
    assert report.root_cause == "healthy"
    assert _outcome(report.data(), "replicas")["applies"] is False
    assert _outcome(report.data(), "rank_data")["world_size"] == 1
