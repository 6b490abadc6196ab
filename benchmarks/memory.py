"""Peak memory of a triage run against the size of its checkpoint (docs/limits-and-time.md, "Memory").

    python benchmarks/memory.py                     # 100 MB and 1 GB checkpoints, the short playbook
    python benchmarks/memory.py --mb 100 --playbook default --steps 2
    python benchmarks/memory.py --spill             # the snapshot in a memory-mapped file (--snapshot-dir)

For each size it writes a checkpoint of an MLP (2048-wide Linear layers) with its Adam state (weights
plus two moments: a third of the file each), then triages it in a fresh process and prints that
process's peak resident memory (ru_maxrss). What does not grow with the checkpoint (Python, torch,
torch.optim's lazy imports, matplotlib for the report: about 400 MB) is measured the same way on a
tiny checkpoint (one 64-wide layer, 50 KB); the figure that matters is the peak above that, against
the checkpoint's size on disk. The target is at most 3x the checkpoint on CPU. "anon" is the peak of
anonymous memory alone (sampled every 10 ms): with --spill the snapshot's pages are file-backed, which
RSS counts while they are mapped but the kernel can drop under pressure; anonymous memory it cannot.

The short playbook is what every triage does with the whole state: read the checkpoint, load it, take
the snapshot, scan it for NaN/Inf, and replay two steps from it (a restore, gradients and an Adam step).
One thread; the model is built on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WIDTH = 2048
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # one Linear(2048, 2048) in float32

SHORT_PLAYBOOK = """
name: memory
entry: checkpoint
nodes:
  checkpoint:
    run: checkpoint_check
    branches:
      - when: checkpoint.nonfinite_count > 0
        goto: broken
    otherwise: baseline
  baseline:
    run: replay
    with: {steps: 2, extend_to: 0}
    otherwise: done
  broken:
    diagnosis: nonfinite_checkpoint
    fix: take an earlier checkpoint
  done:
    diagnosis: healthy
    fix: nothing
"""

ENTRY = """
import os
import torch
from torch import nn
import triage

WIDTH = int(os.environ["TRIAGE_BENCH_WIDTH"])


def model():
    layers = int(os.environ["TRIAGE_BENCH_LAYERS"])
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()) for _ in range(layers)])


def batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, WIDTH, generator=g), torch.randn(8, WIDTH, generator=g)) for _ in range(4)]


def mse(m, batch):
    return nn.functional.mse_loss(m(batch[0]), batch[1])


def setup():
    m = model()
    return triage.Setup(model=m, optimizer=torch.optim.Adam(m.parameters(), lr=1e-4), loss_fn=mse,
                        batches=batches())
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class AnonymousPeak:
    """Samples RssAnon (memory only swap could free; file-backed pages such as a spilled snapshot's
    are not in it) every 10 ms in a thread and keeps the largest."""

    def __init__(self) -> None:
        import threading

        self.peak, self.stop = 0.0, threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self) -> None:
        while not self.stop.wait(0.01):
            with open("/proc/self/status") as handle:
                for line in handle:
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) / 1024)

    def done(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak


def child(folder: Path, playbook: str, steps: int | None, spill: bool) -> None:
    """Runs in the measured process: triage on the checkpoint in `folder`; prints one JSON line."""
    import torch

    torch.set_num_threads(1)
    import triage

    sys.path.insert(0, str(folder))
    before = rss_mb()
    anonymous = AnonymousPeak()
    book = None if playbook == "default" else folder / "playbook.yaml"
    report, _ = triage.run("bench_entry:setup", folder / "ckpt.pt", out=folder / "report", playbook=book,
                           steps=steps, snapshot_dir=folder / "spill" if spill else None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"before_mb": before, "peak_mb": peak, "anon_mb": anonymous.done(), "verdict": report.root_cause,
                      "experiments": len(report.experiments)}))


def write_checkpoint(folder: Path, env: dict) -> float:
    """An MLP of `layers` Linear(2048, 2048) and its Adam state after one step; the file's size in MB."""
    code = textwrap.dedent(f"""
        import torch, sys
        sys.path.insert(0, {str(folder)!r})
        import bench_entry
        s = bench_entry.setup()
        s.loss_fn(s.model, s.batches[0]).backward()
        s.optimizer.step()
        torch.save({{"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(), "step": 1}},
                   {str(folder / "ckpt.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return (folder / "ckpt.pt").stat().st_size / 2**20


def measure(mb: float, playbook: str, steps: int | None, spill: bool = False) -> dict:
    """Triage a checkpoint of about `mb` MB (0: the tiny reference) in a fresh process."""
    width, layers = (64, 1) if mb == 0 else (WIDTH, max(1, round(mb * 2**20 / 3 / LAYER_BYTES)))
    env = {**os.environ, "TRIAGE_BENCH_WIDTH": str(width), "TRIAGE_BENCH_LAYERS": str(layers)}
    with tempfile.TemporaryDirectory(prefix="triage-memory-") as tmp:
        folder = Path(tmp)
        (folder / "bench_entry.py").write_text(ENTRY)
        (folder / "playbook.yaml").write_text(SHORT_PLAYBOOK)
        size = write_checkpoint(folder, env)
        command = [sys.executable, __file__, "--child", str(folder), "--playbook", playbook]
        if steps:
            command += ["--steps", str(steps)]
        if spill:
            command += ["--spill"]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"triage failed on the {mb} MB checkpoint:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"target_mb": mb, "layers": layers, "checkpoint_mb": size, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, nargs="*", default=[100, 1000], help="checkpoint sizes, MB")
    parser.add_argument("--playbook", default="short", choices=["short", "default"])
    parser.add_argument("--steps", type=int, default=None, help="--steps for the default playbook")
    parser.add_argument("--spill", action="store_true", help="keep the snapshot in a file (--snapshot-dir)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.playbook, args.steps, args.spill)
        return
    print(f"playbook: {args.playbook}" + (f", --steps {args.steps}" if args.steps else "")
          + (", snapshot spilled to disk (--snapshot-dir)" if args.spill else ", snapshot in memory"))
    fixed = measure(0, args.playbook, args.steps)
    print(f"fixed cost (a {fixed['checkpoint_mb'] * 1024:.0f} KB checkpoint): peak {fixed['peak_mb']:.0f} MB "
          f"({fixed['before_mb']:.0f} MB with torch and triage imported)")
    print(f"{'checkpoint MB':>14} {'peak RSS':>9} {'above fixed':>12} {'x checkpoint':>13} {'anon x ckpt':>12}  verdict")
    for mb in args.mb:
        r = measure(mb, args.playbook, args.steps, args.spill)
        grown = r["peak_mb"] - fixed["peak_mb"]
        anon = r["anon_mb"] - fixed["anon_mb"]
        print(f"{r['checkpoint_mb']:14.0f} {r['peak_mb']:9.0f} {grown:12.0f} {grown / r['checkpoint_mb']:13.2f} "
              f"{anon / r['checkpoint_mb']:12.2f}  {r['verdict']} ({r['experiments']} experiments)", flush=True)


if __name__ == "__main__":
    main()
