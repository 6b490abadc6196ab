"""The flight recorder's cost per step on the fault zoo's models, and the size of a capture folder.

    python benchmarks/recorder_overhead.py [NAMES...] [--steps 100] [--rounds 5]

Each model trains with its own stock loop (zero_grad, forward under its autocast, backward, clip, step,
scheduler) on one torch thread, calling `recorder.step(loss, batch)` after every step under the default
RecorderSettings. The step and the recorder are timed separately, every step, in rounds of `steps`
steps (each round holds its snapshots: `snapshot_every` divides it); the overhead is the fastest round's
recorder time over the fastest round's step time. Timing each part inside the same round, and taking
the fastest round, keeps other work on a shared machine out of the figure. A capture is then written to
measure its size on disk (the trigger column says what fired on its own in those steps, '-' for nothing).
Target: under 5 % per step.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import triage
from triage.cli.zoo import example_names, load_example


def one_step(setup: triage.Setup, batch) -> torch.Tensor:
    if setup.train_step is not None:
        loss = setup.train_step(setup.model, setup.optimizer, batch)
    else:
        setup.optimizer.zero_grad()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = setup.loss_fn(setup.model, batch)
        loss.backward()
        if setup.grad_clip:
            torch.nn.utils.clip_grad_norm_(setup.model.parameters(), setup.grad_clip)
        setup.optimizer.step()
    if setup.scheduler is not None:
        setup.scheduler.step()
    return loss if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))


def measure(name: str, steps: int, rounds: int, root: Path) -> dict:
    torch.manual_seed(0)
    setup = load_example(name).setup()
    batches = list(setup.batches)
    recorder = triage.Recorder(setup.model, setup.optimizer, setup.scheduler, dir=root / name)
    i = 0

    def run() -> tuple[float, float]:
        nonlocal i
        step_s = record_s = 0.0
        for _ in range(steps):
            batch = batches[i % len(batches)]
            i += 1
            t0 = time.perf_counter()
            loss = one_step(setup, batch)
            t1 = time.perf_counter()
            recorder.step(loss, batch)
            step_s, record_s = step_s + t1 - t0, record_s + time.perf_counter() - t1
        return step_s / steps, record_s / steps

    run()  # warm up; a run that fails at once writes its capture here, outside the timing
    rounds_ = [run() for _ in range(rounds)]
    base, rec = min(r[0] for r in rounds_), min(r[1] for r in rounds_)
    fired = recorder.captures[0].name.split("-", 2)[2] if recorder.captures else "-"
    folder = recorder.captures[0] if recorder.captures else recorder.capture("benchmark")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {"name": name, "fired": fired, "step_ms": base * 1e3, "recorder_us": rec * 1e6, "overhead": rec / base,
            "capture_kb": size / 1024, "params": sum(p.numel() for p in setup.model.parameters())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in args.names or example_names():
            try:
                rows.append(measure(name, args.steps, args.rounds, Path(root)))
            except Exception as exc:  # an example whose fault raises in its own loop
                print(f"{name:28s} skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
    print(f"{'example':28s} {'params':>8s} {'step ms':>8s} {'recorder us':>12s} {'overhead':>9s} "
          f"{'capture KiB':>12s}  trigger")
    for r in rows:
        print(f"{r['name']:28s} {r['params']:8d} {r['step_ms']:8.2f} {r['recorder_us']:12.1f} "
              f"{r['overhead']:9.1%} {r['capture_kb']:12.0f}  {r['fired']}")
    overheads = [r["overhead"] for r in rows if math.isfinite(r["overhead"])]
    if overheads:
        print(f"median overhead {statistics.median(overheads):.1%}, worst {max(overheads):.1%} "
              f"over {len(rows)} models (default settings, one thread)")


if __name__ == "__main__":
    main()
