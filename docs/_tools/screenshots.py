"""Regenerate docs/screenshots/ from reports triage writes now: each run is triaged afresh, and the top of
its report.html is captured in headless Chromium (the same capture as benchmarks/make_samples.py).

    python docs/_tools/screenshots.py                   # all three
    python docs/_tools/screenshots.py verified_fix      # one

    verified_fix   triage demo lr_too_high: a fix that a replay verified
    unexplained    docs/_tools/unexplained_run.py: a run no tested fix makes learn
    distributed    examples/distributed/lr_too_high.py trained and triaged on 2 ranks (torchrun, gloo)

Needs /usr/bin/chromium (Debian: apt-get install -y chromium). Takes a few minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from make_samples import CHROMIUM, screenshot, triage_command  # noqa: E402

OUT = REPO / "docs" / "screenshots"
TOOLS = Path(__file__).resolve().parent


def verified_fix(work: Path) -> Path:
    _run([*triage_command(), "demo", "lr_too_high", "--out", str(work / "report"), "--output", "quiet"])
    return work / "report" / "report.html"


def unexplained(work: Path) -> Path:
    run = TOOLS / "unexplained_run.py"
    _run([sys.executable, str(run), str(work / "ckpt.pt")])
    _run([*triage_command(), "run", "--checkpoint", str(work / "ckpt.pt"), "--entry", f"{run}:setup",
          "--out", str(work / "report"), "--output", "quiet"])
    return work / "report" / "report.html"


def distributed(work: Path) -> Path:
    example = REPO / "examples" / "distributed" / "lr_too_high.py"
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(example),
          str(work / "ckpt.pt")])
    _run([*triage_command(), "run", "--nproc-per-node", "2", "--checkpoint", str(work / "ckpt.pt"), "--entry",
          f"{example}:setup", "--out", str(work / "report"), "--output", "quiet"])
    return work / "report" / "report.html"


SHOTS = {"verified_fix": verified_fix, "unexplained": unexplained, "distributed": distributed}


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, cwd=REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"which screenshots (default: all of {', '.join(SHOTS)})")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in SHOTS]
    if unknown:
        parser.error(f"no screenshot named {', '.join(unknown)}; known: {', '.join(SHOTS)}")
    if not CHROMIUM.exists():
        raise SystemExit(f"no {CHROMIUM}: apt-get install -y chromium")
    for name in args.names or SHOTS:
        with tempfile.TemporaryDirectory() as work:
            html = SHOTS[name](Path(work))
            screenshot(html, OUT / f"{name}.png", height=1500)
            print(f"wrote {OUT / f'{name}.png'}")


if __name__ == "__main__":
    main()
