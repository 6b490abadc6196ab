"""Wall time of what a person runs first: `triage --help`, `triage demo --list`, `triage report`, and
each zoo demo, every one a fresh process, imports included.

    python benchmarks/startup.py [NAMES...] [--rounds 3]

The quick commands are timed `--rounds` times and the fastest kept (other work on a shared machine only
ever adds time). Each demo is timed once, after its checkpoint is in the demo cache (`$TRIAGE_CACHE/demo`):
the one-off training that writes it is shown apart, in the `first run adds` column (about 0 where it was
already cached), and with an empty figure cache, as a person's first run has (the demos draw their
figures while they walk, report/ahead.py). `triage report` re-renders the report.json the first demo
wrote three ways: with the figures that demo drew in the cache (a re-render on the same machine), with
nothing cached but its folder (a report folder from elsewhere: the figures come from its report.html,
report/carried.py), and report.json alone with nothing cached (every figure drawn). Targets: under 1 s
for the quick commands, under 10 s per demo. The load average is printed before and after: figures taken on a loaded
machine run long.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from triage.cli.zoo import demo_checkpoint, example_names

QUICK_TARGET_S = 1.0
DEMO_TARGET_S = 10.0


def wall(args: list[str], cwd: Path, cache: Path) -> float:
    """Seconds for `triage ARGS` in a new process with `cache` as $TRIAGE_CACHE; raises when it fails."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "triage", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "TRIAGE_CACHE": str(cache)})
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"triage {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return seconds


def row(what: str, seconds: float, target: float, note: str = "") -> str:
    verdict = "ok" if seconds < target else "OVER"
    return f"{what:<52} {seconds:7.2f} s  {verdict:<4} (< {target:g} s)  {note}"


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="zoo examples (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each quick command (the fastest is kept)")
    args = parser.parse_args()
    names = args.names or example_names()
    root = Path(__file__).resolve().parents[1]
    print(f"# {load()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")

    first_run = {}
    for name in names:  # the one-off training that writes each demo's checkpoint, outside the timings
        start = time.perf_counter()
        cached = demo_checkpoint(name)
        first_run[name] = time.perf_counter() - start
        assert cached.is_file()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        cache = out / "cache"  # the demo checkpoints made above; no figure drawn yet
        cache.mkdir()
        (cache / "demo").symlink_to(demo_checkpoint(names[0]).parent)
        demos = {name: wall(["demo", name, "--out", str(out / name), "--output", "quiet"], root, cache)
                 for name in names}
        report = out / names[0] / "report.json"
        rerender = ["report", str(report), "--out", str(out / "rerendered")]
        quick = {
            "triage --help": (["--help"], cache),
            "triage demo --list": (["demo", "--list"], cache),
            f"triage report ({names[0]}, figures cached)": (rerender, cache),
        }
        for what, (command, where) in quick.items():
            print(row(what, min(wall(command, root, where) for _ in range(args.rounds)), QUICK_TARGET_S,
                      f"fastest of {args.rounds}"))
        alone = out / "alone"  # report.json without the page it came with: every figure drawn
        alone.mkdir()
        shutil.copy(report, alone / "report.json")
        for what, command in ((f"triage report ({names[0]} folder, nothing cached)", rerender),
                              (f"triage report ({names[0]}.json alone, nothing cached)",
                               ["report", str(alone / "report.json"), "--out", str(out / "rerendered")])):
            cold = []
            for i in range(args.rounds):  # a new empty cache each time: no figure or template kept
                empty = Path(tempfile.mkdtemp(dir=out))
                cold.append(wall(command, root, empty))
            print(row(what, min(cold), QUICK_TARGET_S, f"fastest of {args.rounds}"))
    for name, seconds in demos.items():
        print(row(f"triage demo {name}", seconds, DEMO_TARGET_S, f"first run adds {first_run[name]:.1f} s"))
    print(f"# {load()}")


if __name__ == "__main__":
    main()
