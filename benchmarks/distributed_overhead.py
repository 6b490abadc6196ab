"""What triaging a distributed run costs: for the same small model (the distributed zoo's healthy digits MLP,
a checkpoint written by its DDP run), the wall time of a whole triage walk in one process and under
torchrun with 2 ranks (gloo, CPU), and the per-step cost of triage's replay against a plain DDP step loop
(zero_grad, forward, backward, grad norm, step) on the same model and batches, in the same process group;
"+ gather" is that loop plus the one collective a replay adds per step (every rank's loss and grad norm).

    python benchmarks/distributed_overhead.py [--steps 200] [--rounds 5]

Figures are the fastest of `rounds` (the machine may be shared): step costs over `steps` steps, the plain
loops and the replay alternating in each round, and whole walks of the default playbook (open the session,
every experiment, the report). The walk times exclude process start-up (importing torch), which the
torchrun launch line shows separately. One torch thread per process.
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
    """ms per step (fastest of `rounds`), in this process's world: a plain loop, the same loop with the one
    collective a replay adds per step (every rank's loss and gradient norm), and triage's replay itself."""
    from triage.load.ranks import joined
    from triage.load.every_rank import open_on_every_rank
    from triage.experiments import Context
    from triage.experiments.replay import ReplayParams, measure as replay
    from triage.load.session import open_session

    with joined(60) as ranks:
        session = open_on_every_rank(ranks, lambda: open_session(f"{EXAMPLE}:setup", checkpoint))
        plain, gathered, triaged = [], [], []
        for _ in range(rounds):
            plain.append(_plain_loop(session, steps, None))
            gathered.append(_plain_loop(session, steps, ranks))
            session.restore()
            started = time.perf_counter()
            outcome = replay(Context(session=session, budget_s=1e9), ReplayParams(steps=steps))
            triaged.append((time.perf_counter() - started) / outcome.steps_run)
        session.restore()
    return {"plain_ms": 1e3 * min(plain), "gather_ms": 1e3 * min(gathered), "replay_ms": 1e3 * min(triaged)}


def _plain_loop(session, steps: int, ranks) -> float:
    """Seconds per step of the run's step as a training script writes it (zero_grad, forward, backward,
    grad norm, step, the loss read back), from the snapshot; with `ranks`, plus one gather of the figures."""
    import torch

    setup = session.setup
    params = [p for p in setup.model.parameters() if p.requires_grad]
    session.restore()
    setup.model.train()
    started = time.perf_counter()
    for step in range(steps):
        setup.optimizer.zero_grad(set_to_none=True)
        loss = setup.loss_fn(setup.model, session.batches[step % len(session.batches)])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
        setup.optimizer.step()
        figures = (float(loss.detach()), float(norm))
        if ranks is not None:
            ranks.gather_floats((*figures, 0.0))
    return (time.perf_counter() - started) / steps


def walk_seconds(checkpoint: Path, out: Path, rounds: int) -> dict:
    """The fastest of `rounds` whole triage walks (default playbook), and how many experiments one ran."""
    import triage

    times = []
    for i in range(rounds):
        started = time.perf_counter()
        report, _ = triage.run(f"{EXAMPLE}:setup", checkpoint, out=out / f"round-{i}", rank_timeout=60)
        times.append(time.perf_counter() - started)
        assert report.root_cause == "healthy", report.root_cause
    return {"walk_s": min(times), "experiments": len(report.experiments)}


def worker(folder: Path, steps: int, rounds: int) -> None:
    """One rank under torchrun: write the checkpoint (the DDP run), time the steps, then the walk."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=120))
    from healthy import write_checkpoint

    checkpoint = write_checkpoint(folder / "healthy.pt")
    costs = step_costs(steps, rounds, checkpoint)
    walks = walk_seconds(checkpoint, folder / "report-2ranks", rounds)
    if dist.get_rank() == 0:
        (folder / "ranks.json").write_text(json.dumps({**costs, **walks}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
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
        single.update(walk_seconds(folder / "healthy.pt", folder / "report-1process", args.rounds))
    print(f"\nthe distributed zoo's healthy MLP (digits, 17226 parameters), global batch 64, {args.steps} steps, "
          f"fastest of {args.rounds}; torch {torch.__version__}, {len(os.sched_getaffinity(0))} CPU cores")
    print(f"{'':26}{'walk s':>8}{'experiments':>12}{'plain step ms':>15}{'+ gather ms':>13}{'replay step ms':>16}"
          f"{'replay overhead':>17}")
    for name, f in (("1 process", single), ("torchrun, 2 ranks (gloo)", ranks)):
        overhead = 100 * (f["replay_ms"] / f["plain_ms"] - 1)
        print(f"{name:26}{f['walk_s']:8.1f}{f['experiments']:12d}{f['plain_ms']:15.2f}{f['gather_ms']:13.2f}"
              f"{f['replay_ms']:16.2f}{overhead:16.1f}%")
    ratio = {key: ranks[key] / single[key] for key in ("walk_s", "plain_ms", "replay_ms")}
    print(f"2 ranks against 1 process: walk x{ratio['walk_s']:.2f}, plain step x{ratio['plain_ms']:.2f}, "
          f"replay step x{ratio['replay_ms']:.2f}")
    print(f"torchrun launch, end to end (2 processes importing torch, checkpoint, steps, walks): {launch_s:.1f} s")


if __name__ == "__main__":
    main()
