"""`triage read-history`: the symptom of a loss log alone and the step it started, with CI exit codes."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from triage.cli.watch.reading import read_curve
from triage.load.history import HistoryPoint

REPO = Path(__file__).resolve().parents[2]


def noisy(n, level, noise, seed=0):
    rng = random.Random(seed)
    return [level(i) + rng.gauss(0, noise) for i in range(n)]


CURVES = {  # name: (losses by step from 1, the symptom, the step it started, give or take)
    "healthy": (noisy(300, lambda i: 2.3 * math.exp(-i / 150) + 0.3, 0.08), "healthy", None),
    "diverged": (noisy(260, lambda i: 2.3 * math.exp(-i / 50) + 0.3 if i < 200 else 0.3 * math.exp((i - 200) / 10), 0.05),
                 "diverged", 201),
    "nan": ([*noisy(200, lambda i: 2.3 * math.exp(-i / 50) + 0.3, 0.05), math.nan, math.nan], "diverged", 201),
    "plateau": (noisy(300, lambda i: 2.3 * math.exp(-i / 20) + 0.3 if i < 60 else 0.3, 0.01), "plateau", 61),
    "oscillating": (noisy(300, lambda i: 2.3 * math.exp(-i / 30) + 0.5 if i < 100 else 1.5 + 0.8 * math.sin(i / 2), 0.1),
                    "oscillating", 101),
}


@pytest.mark.parametrize("name", CURVES)
def test_each_symptom_is_read_with_the_step_it_started(name):
    losses, symptom, started = CURVES[name]
    reading = read_curve([HistoryPoint(step=i, loss=v) for i, v in enumerate(losses, 1)])
    assert reading.symptom == symptom, reading.detail
    if started is None:
        assert reading.started is None
    else:
        assert abs(reading.started - started) <= 5, reading.detail


def test_a_log_that_ends_in_one_spike_diverged_there():
    losses = [*noisy(60, lambda i: 2.3 * math.exp(-i / 15) + 0.1, 0.03), 1.3]
    reading = read_curve([HistoryPoint(step=i, loss=v) for i, v in enumerate(losses, 1)])
    assert (reading.symptom, reading.started) == ("diverged", 61)


def read(path, *args):
    return subprocess.run([sys.executable, "-m", "triage", "read-history", str(path), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_exit_codes_a_ci_gate_uses_and_the_unverified_label(tmp_path):
    healthy, diverged = tmp_path / "healthy.csv", tmp_path / "diverged.jsonl"
    healthy.write_text("step,loss\n" + "".join(f"{i},{v}\n" for i, v in enumerate(CURVES["healthy"][0], 1)))
    diverged.write_text("".join(json.dumps({"step": i, "train_loss": v}) + "\n"
                                for i, v in enumerate(CURVES["nan"][0], 1)))
    ok = read(healthy)
    assert ok.returncode == 0 and "Symptom: healthy" in ok.stdout
    bad = read(diverged, "--checkpoint", "ckpt.pt", "--entry", "mymod:setup")
    assert bad.returncode == 1
    assert "Unverified reading" in bad.stdout and "Symptom: diverged, from step 201" in bad.stdout
    assert f"triage run --checkpoint ckpt.pt --entry mymod:setup --history {diverged}" in bad.stdout
    as_json = json.loads(read(diverged, "--json").stdout)
    assert (as_json["symptom"], as_json["started"], as_json["verified"]) == ("diverged", 201, False)


def test_a_trainer_state_json_is_read(tmp_path):
    state = tmp_path / "trainer_state.json"
    losses = CURVES["plateau"][0]
    state.write_text(json.dumps({"log_history": [{"step": i, "loss": v} for i, v in enumerate(losses, 1)]}))
    done = read(state)
    assert done.returncode == 1 and "Symptom: plateau" in done.stdout


@pytest.mark.parametrize("content, says", [
    (None, "Expected a history at"),
    ("step,loss\n1,2.0\n2,1.9\n", "Expected at least 10 training-loss points"),
    ("step,accuracy\n1,0.5\n", "Expected"),
])
def test_bad_input_exits_2_with_what_to_do(tmp_path, content, says):
    path = tmp_path / "log.csv"
    if content is not None:
        path.write_text(content)
    done = read(path)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
