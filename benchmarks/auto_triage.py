"""What triaging on capture costs: the training step with the recorder and `triage_on_capture` on a healthy
run, against no recorder; and the time from a capture to its report for one zoo fault.

    python benchmarks/auto_triage.py [--healthy healthy_mlp] [--fault lr_too_high] [--steps 100] [--rounds 7]

Overhead: the healthy example trains on one torch thread in interleaved rounds of `steps` steps, three
ways (no recorder; the recorder; the recorder with triage_on_capture=AutoTriage(when="now")), each round
timing its whole steps, the recorder's call included; the fastest round of each is kept (other work on a
shared machine stays out of it). Nothing is triaged on a healthy run, so the last two should match.

Capture to report: the fault example trains with the recorder and triage_on_capture=AutoTriage(when="now",
threads=1) until it captures; the clock runs from the capture's return to a complete report.json beside it
(the detached `triage watch --once` starting, `triage run` replaying, the report written).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorder_overhead import one_step  # noqa: E402  the zoo's own stock loop

import triage  # noqa: E402
from triage.cli.zoo import example_path, load_example  # noqa: E402
from triage.flight.places import report_dir  # noqa: E402


def overhead(name: str, steps: int, rounds: int, root: Path) -> dict[str, float]:
    runs = {}
    for kind in ("none", "recorder", "recorder+triage_on_capture"):
        torch.manual_seed(0)
        setup = load_example(name).setup()
        recorder = None
        if kind != "none":
            auto = triage.AutoTriage(when="now") if kind.endswith("capture") else None
            recorder = triage.Recorder(setup.model, setup.optimizer, setup.scheduler, dir=root / kind,
                                       entry=f"{example_path(name)}:setup", triage_on_capture=auto)
        runs[kind] = (setup, list(setup.batches), recorder)
    best = {kind: float("inf") for kind in runs}
    for round_ in range(rounds + 1):  # interleaved, so a slow spell of the machine hits all three
        for kind, (setup, batches, recorder) in runs.items():
            t0 = time.perf_counter()
            for i in range(steps):
                batch = batches[(round_ * steps + i) % len(batches)]
                loss = one_step(setup, batch)
                if recorder is not None:
                    recorder.step(loss, batch)
            if round_:  # the first round warms up
                best[kind] = min(best[kind], (time.perf_counter() - t0) / steps)
    for kind, (_, _, recorder) in runs.items():
        if recorder is not None and recorder.captures:
            raise SystemExit(f"{name} is meant to be healthy, but the recorder captured {recorder.captures[0]}")
    return best


def capture_to_report(name: str, root: Path, timeout_s: float = 600) -> tuple[float, str, Path]:
    torch.manual_seed(0)
    setup = load_example(name).setup()
    batches = list(setup.batches)
    recorder = triage.Recorder(setup.model, setup.optimizer, setup.scheduler, dir=root / "fault",
                               entry=f"{example_path(name)}:setup",
                               triage_on_capture=triage.AutoTriage(when="now", threads=1))
    for i in range(10_000):
        batch = batches[i % len(batches)]
        folder = recorder.step(one_step(setup, batch), batch)
        if folder is not None:
            break
    else:
        raise SystemExit(f"{name} never captured")
    captured = time.perf_counter()
    report = report_dir(folder) / "report.json"
    while time.perf_counter() - captured < timeout_s:
        try:
            data = json.loads(report.read_text())
            if data.get("status") == "complete":
                return time.perf_counter() - captured, data["root_cause"], report
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"no report after {timeout_s:.0f} s; see {folder.parent / (folder.name + '.launch.log')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--healthy", default="healthy_mlp")
    parser.add_argument("--fault", default="lr_too_high")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as root:
        best = overhead(args.healthy, args.steps, args.rounds, Path(root))
        base = best["none"]
        print(f"{args.healthy}: step time, fastest of {args.rounds} rounds of {args.steps} steps, one thread")
        for kind, seconds in best.items():
            print(f"  {kind:28s} {seconds * 1e3:7.3f} ms   x{seconds / base:.3f}")
        seconds, root_cause, report = capture_to_report(args.fault, Path(root))
        print(f"{args.fault}: capture to complete report {seconds:.1f} s (verdict {root_cause}; triage on 1 thread, "
              f"nice 10, beside this process)")


if __name__ == "__main__":
    main()
