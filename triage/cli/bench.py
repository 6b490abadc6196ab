"""`triage bench`: triage every zoo example and print how often the diagnosis is right, and how fast."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, TextIO

import torch

from triage.cli.api import run
from triage.cli.zoo import example_names, example_path, load_example


@dataclass(frozen=True)
class Case:
    name: str
    expected: str
    predicted: str
    seconds: float
    path: tuple[str, ...]


def run_cases(names: Optional[Sequence[str]] = None, steps: Optional[int] = None, threads: int = 1,
              folder: Optional[Path] = None, keep: Optional[Path] = None) -> list[Case]:
    """Triage each example of `folder` (default: the zoo) from its freshly written checkpoint.

    One torch thread by default: the zoo's tiny models run fastest so, and timings do not depend on
    what else the machine is doing. With `keep`, checkpoints and reports stay there.
    """
    torch.set_num_threads(threads)
    cases = []
    with tempfile.TemporaryDirectory(prefix="triage-bench-") as tmp:
        out = Path(keep or tmp)
        for name in names or example_names(folder):
            example = load_example(name, folder)
            checkpoint = example.write_checkpoint(out / f"{name}.pt")
            started = time.perf_counter()
            report, _ = run(f"{example_path(name, folder)}:setup", checkpoint, out=out / name, steps=steps)
            cases.append(Case(name, example.ROOT_CAUSE, report.root_cause,
                              time.perf_counter() - started, tuple(report.path)))
    return cases


def print_table(cases: list[Case], out: TextIO) -> None:
    width = max(len(c.name) for c in cases) + 2
    cause_width = max(len(c.expected) for c in cases) + 2
    out.write(f"{'example':<{width}}{'expected':<{cause_width}}{'predicted':<{cause_width}}{'seconds':>8}\n")
    for c in cases:
        mark = "" if c.predicted == c.expected else "   ✗ " + " → ".join(c.path)
        out.write(f"{c.name:<{width}}{c.expected:<{cause_width}}{c.predicted:<{cause_width}}{c.seconds:8.1f}{mark}\n")
    out.write("\nconfusion (expected → predicted: count)\n")
    for (expected, predicted), count in sorted(Counter((c.expected, c.predicted) for c in cases).items()):
        out.write(f"  {'✓' if expected == predicted else '✗'} {expected} → {predicted}: {count}\n")
    right = sum(c.expected == c.predicted for c in cases)
    healthy = [c for c in cases if c.expected == "healthy"]
    false_alarms = sum(c.predicted != "healthy" for c in healthy)
    missed = sum(c.predicted == "healthy" for c in cases if c.expected != "healthy")
    seconds = sorted(c.seconds for c in cases)
    out.write(f"\ntop-1 accuracy: {right}/{len(cases)} = {right / len(cases):.0%}\n")
    out.write(f"false alarms on healthy examples: {false_alarms}/{len(healthy)}\n")
    out.write(f"faults called healthy: {missed}/{len(cases) - len(healthy)}\n")
    out.write(f"torch threads: {torch.get_num_threads()}\n")
    out.write(f"seconds per case: median {seconds[len(seconds) // 2]:.1f}, max {seconds[-1]:.1f}, "
              f"total {sum(seconds):.0f}\n")
