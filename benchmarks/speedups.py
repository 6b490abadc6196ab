"""What each part of the speed machinery (triage/speedups.py) saves today: the wall time of `triage demo`'s
walk on zoo examples with every part on, each part off in turn, and none; then `triage report`'s
re-render with the figure cache and without.

    python benchmarks/speedups.py                          # four zoo examples, 2 rounds
    python benchmarks/speedups.py dead_relu lr_too_high --rounds 3

Each walk is a fresh process, as `triage run` is (imports included), with an empty figure cache (a
person's first triage of a run) and the demo's checkpoint already made. Rounds are interleaved and the
fastest of each kept: other work on a shared machine only ever adds time. The verdicts must agree across
the configurations (the contract, tests/walk/test_speedups.py); the script says so if they do not. A part
whose saving no longer shows here is a candidate for removal (issue 24).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ("dead_relu", "lr_too_high", "vanishing_gradients", "healthy_mlp")
CONFIGS = {  # name -> the Speedups fields set to False
    "all on": (),
    "no fork": ("fork",),
    "no drawing ahead": ("draw_ahead",),
    "no figure cache": ("figure_cache", "draw_ahead"),  # drawing ahead draws into the cache
    "none": ("fork", "draw_ahead", "figure_cache"),
}


def one(name: str, off: list[str], out: Path) -> None:
    """In a fresh process: triage the demo as the command line does, with the parts in `off` turned off."""
    from triage.speedups import Speedups

    speedups = Speedups(**{part: False for part in off})
    ahead = None
    if speedups.draw_ahead:  # started before torch is imported, as the command line does
        from triage.report.ahead import Ahead
        ahead = Ahead()
    from triage.cli.api import run
    from triage.cli.zoo import demo_checkpoint, example_path

    report, _ = run(f"{example_path(name)}:setup", demo_checkpoint(name), out=out, ahead=ahead, speedups=speedups)
    print(json.dumps({"verdict": report.root_cause, "confidence": report.confidence}))


def timed(args: list[str], cache: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env={**os.environ, "TRIAGE_CACHE": str(cache)})
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return seconds, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"zoo examples (default: {' '.join(DEFAULT)})")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    names = args.names or list(DEFAULT)
    from triage.cli.zoo import demo_checkpoint

    for name in names:  # the one-off training that writes each checkpoint, outside the timings
        demo_checkpoint(name)
    demo_cache = demo_checkpoint(names[0]).parent
    print(f"# load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; fastest of {args.rounds} rounds, seconds per walk")
    print("| example | " + " | ".join(CONFIGS) + " | verdicts agree |\n|---|" + "---|" * (len(CONFIGS) + 1))
    totals = dict.fromkeys(CONFIGS, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            best, verdicts = dict.fromkeys(CONFIGS, float("inf")), set()
            for round_ in range(args.rounds):
                for config, off in CONFIGS.items():
                    cache = Path(tmp) / f"cache-{name}-{round_}-{config}".replace(" ", "_")
                    cache.mkdir()
                    (cache / "demo").symlink_to(demo_cache)
                    seconds, line = timed([__file__, "--_one", name, ",".join(off), str(cache / "out")], cache)
                    best[config] = min(best[config], seconds)
                    verdicts.add(line)
            for config in CONFIGS:
                totals[config] += best[config]
            print(f"| {name} | " + " | ".join(f"{best[c]:.1f}" for c in CONFIGS)
                  + f" | {'yes' if len(verdicts) == 1 else 'NO: ' + ' / '.join(sorted(verdicts))} |", flush=True)
        print("| total | " + " | ".join(f"{totals[c]:.1f}" for c in CONFIGS) + " | |")
        base = totals["all on"]
        print("\nwhat each part saves over the whole set (its configuration minus all on): "
              + ", ".join(f"{c[3:] if c.startswith('no ') else c} {totals[c] - base:+.1f} s"
                          for c in CONFIGS if c != "all on"))

        report = next(Path(tmp).glob(f"cache-{names[0]}-0-all_on/out/report.json"))
        rerender = ["-m", "triage", "report", str(report), "--out", str(Path(tmp) / "rerendered")]
        cache = Path(tmp) / f"cache-{names[0]}-0-all_on"  # holds the figures that walk drew
        kept = min(timed(rerender, cache)[0] for _ in range(args.rounds))
        drawn = min(timed([*rerender, "--no-speedups"], cache)[0] for _ in range(args.rounds))
        print(f"triage report ({names[0]}): {kept:.2f} s with its figures cached, {drawn:.2f} s drawing every one")
    print(f"# load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_one":
        one(sys.argv[2], [p for p in sys.argv[3].split(",") if p], Path(sys.argv[4]))
    else:
        sys.exit(main())
