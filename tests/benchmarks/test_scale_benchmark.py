"""CI runs benchmarks/scale.py at its smallest size (issue 26): the GPT-style LM at 0.17M parameters, a
healthy run and one whose LR is far too high, each trained, checkpointed and triaged in a fresh process."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_scale_benchmark_names_both_runs_right_at_its_smallest_size():
    done = subprocess.run([sys.executable, "benchmarks/scale.py", "--sizes", "tiny", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {(r["run"], r["verdict"]) for r in rows} == {("healthy", "healthy"), ("lr_high", "lr_too_high")}, \
        done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0  # the benchmark's own "every verdict right"
    assert all(r["replayed_steps"] > 0 and r["step_eq"] > 0 for r in rows)
