"""Held-out accuracy of the default playbook: `python benchmarks/holdout.py [NAME ...] [--out DIR]`.

Runs triage over the modules in benchmarks/holdout/ (differently built runs with the zoo's faults, which the
playbook was not tuned on) exactly as `triage bench` runs the zoo, and prints the same table. Each module
follows the zoo's convention: ROOT_CAUSE, setup(), fixed_setup(), write_checkpoint(path).
With --out DIR, every case's report (report.json, report.html, summary.md) is kept under DIR/NAME.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import torch

from triage.api import run
from triage.bench import Case, print_table

HOLDOUT_DIR = Path(__file__).resolve().parent / "holdout"


def holdout_names() -> list[str]:
    return sorted(p.stem for p in HOLDOUT_DIR.glob("*.py") if not p.stem.startswith("_"))


def load_holdout(name: str) -> ModuleType:
    path = HOLDOUT_DIR / f"{name}.py"
    if str(HOLDOUT_DIR) not in sys.path:
        sys.path.insert(0, str(HOLDOUT_DIR))  # modules import _holdout (which adds examples/ for _zoo)
    spec = importlib.util.spec_from_file_location(f"triage_holdout_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_holdout(names: list[str], out: Path, threads: int = 1) -> list[Case]:
    """triage.bench.run_cases' loop, over benchmarks/holdout/ instead of examples/."""
    torch.set_num_threads(threads)
    cases = []
    for name in names:
        example = load_holdout(name)
        checkpoint = example.write_checkpoint(out / f"{name}.pt")
        started = time.perf_counter()
        report, _ = run(f"{HOLDOUT_DIR / name}.py:setup", checkpoint, out=out / name)
        cases.append(Case(name, example.ROOT_CAUSE, report.root_cause,
                          time.perf_counter() - started, tuple(report.path)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="held-out modules to run (default: all)")
    parser.add_argument("--out", type=Path, help="keep checkpoints and reports here")
    args = parser.parse_args()
    names = args.names or holdout_names()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        cases = run_holdout(names, args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="triage-holdout-") as tmp:
            cases = run_holdout(names, Path(tmp))
    print_table(cases, sys.stdout)


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    main()
