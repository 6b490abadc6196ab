"""README's one complete example does what README says: its run trains, saves a checkpoint, and triage
calls it lr_too_high with high confidence."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_example_triages_to_lr_too_high(tmp_path):
    block = re.search(r"```python\n(# mymod\.py\n.*?)```", (REPO / "README.md").read_text(), re.S)
    assert block, "README's complete example (a python block starting '# mymod.py') is gone"
    (tmp_path / "mymod.py").write_text(block.group(1))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "mymod.py"], cwd=tmp_path, env=env, check=True, timeout=120)
    done = subprocess.run([sys.executable, "-m", "triage", "run", "--checkpoint", "ckpt.pt", "--entry", "mymod:setup",
                           "--out", "report", "--output", "quiet"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert (report["root_cause"], report["confidence"]) == ("lr_too_high", "high")
