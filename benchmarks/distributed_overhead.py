"""What triaging a distributed run costs: for the same small model (the distributed zoo's healthy digits MLP,
a checkpoint written by its DDP run), the wall time of a whole triage walk in one process and under
torchrun with 2 ranks (gloo, CPU), and the per-step cost of triage's replay against a plain DDP step loop
(zero_grad, forward, backward, grad norm, step) on the same model and batches, in the same process group.

    python benchmarks/distributed_overhead.py [--steps 200] [--rounds 3]

Figures are the fastest of `rounds` (the machine may be shared); the walk times exclude process start-up
(importing torch), which the torchrun launch line shows separately.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed" / "healthy.py"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(EXAMPLE.parent))


def step_costs(steps: int, rounds: int, checkpoint: Path) -> dict:
    """ms per step of a plain loop and of triage's replay (fastest of `rounds`), in this process's world."""
    import torch

    from triage.distributed.ranks import joined
    from triage.distributed.session import open_on_every_rank
    from triage.experiments import Context
    from triage.experiments.replay import ReplayParams, measure as replay
    from triage.session import open_session

    with joined(60) as ranks:
        session = open_on_every_rank(ranks, lambda: open_session(f"{EXAMPLE}:setup", checkpoint))
        setup = session.setup
        params = [p for p in setup.model.parameters() if p.requires_grad]
        plain, triaged = [], []
        for _ in range(rounds):
            session.restore()
            setup.model.train()
            started = time.perf_counter()
            for step in range(steps):
                setup.optimizer.zero_grad(set_to_none=True)
                loss = setup.loss_fn(setup.model, session.batches[step % len(session.batches)])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, float("inf"))
                setup.optimizer.step()
                float(loss.detach())
            plain.append((time.perf_counter() - started) / steps)
            session.restore()
            started = time.perf_counter()
            outcome = replay(Context(session=session, budget_s=1e9), ReplayParams(steps=steps))
            triaged.append((time.perf_counter() - started) / outcome.steps_run)
        session.restore()
    return {"plain_ms": 1e3 * min(plain), "replay_ms": 1e3 * min(triaged)}


def walk_seconds(checkpoint: Path, out: Path) -> float:
    import triage

    started = time.perf_counter()
    report, _ = triage.run(f"{EXAMPLE}:setup", checkpoint, out=out, rank_timeout=60)
    assert report.root_cause == "healthy", report.root_cause
    return time.perf_counter() - started


def worker(folder: Path, steps: int, rounds: int) -> None:
    """One rank under torchrun: write the checkpoint (the DDP run), time the steps, then the walk."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=120))
    from healthy import write_checkpoint

    checkpoint = write_checkpoint(folder / "healthy.pt")
    costs = step_costs(steps, rounds, checkpoint)
    seconds = walk_seconds(checkpoint, folder / "report-2ranks")
    if dist.get_rank() == 0:
        (folder / "ranks.json").write_text(json.dumps({**costs, "walk_s": seconds}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.rounds)
        return
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        __file__, "--worker", str(folder), "--steps", str(args.steps), "--rounds", str(args.rounds)],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        launch_s = time.perf_counter() - started
        ranks = json.loads((folder / "ranks.json").read_text())
        single = step_costs(args.steps, args.rounds, folder / "healthy.pt")
        single["walk_s"] = walk_seconds(folder / "healthy.pt", folder / "report-1process")
    print(f"\nthe distributed zoo's healthy MLP (digits, 17226 parameters), global batch 64, {args.steps} steps, "
          f"fastest of {args.rounds}")
    print(f"{'':28}{'walk s':>9}{'plain step ms':>15}{'replay step ms':>16}{'replay overhead':>17}")
    for name, f in (("1 process", single), ("torchrun, 2 ranks (gloo)", ranks)):
        overhead = 100 * (f["replay_ms"] / f["plain_ms"] - 1)
        print(f"{name:28}{f['walk_s']:9.1f}{f['plain_ms']:15.2f}{f['replay_ms']:16.2f}{overhead:16.1f}%")
    print(f"torchrun launch, end to end (2 processes importing torch, checkpoint, steps, walk): {launch_s:.1f} s")


if __name__ == "__main__":
    main()
