"""A verdict at every model size: triage on a small GPT-style language model at ~1M, ~8M, ~40M parameters.

    python benchmarks/scale.py                       # 1M, 8M and 40M, healthy and LR too high, on one thread
    python benchmarks/scale.py --sizes 1M            # one size; --sizes tiny (0.17M) for CI: 1-2 minutes
    python benchmarks/scale.py --sizes 300M --device cuda

The model is plain torch: token and position embeddings, pre-norm blocks (LayerNorm -> causal
self-attention, LayerNorm -> 4x MLP with GELU), a final LayerNorm and an untied head; AdamW (weight decay
0.1), no schedule. The data is made here: token sequences of a fixed random Markov chain over 512 tokens
(each token has 8 likely successors), batch 16 x 128 tokens, a snapshot of 16 batches the run cycles
through. For each size and run (healthy: the size's HEALTHY_LR, below; lr_high: lr 0.1, at which the model spikes and then
sits at the loss of learning nothing; lr_stall, at 40M and 300M only: lr 1e-3, at which they learn nothing) it trains the run for --train-steps steps from init, saves a
checkpoint (model, AdamW state, step, loss history), times one plain training step of the same model and
batch on the same thread (the median of 10 after 3 warm-ups; --threads sets the threads of both), then
triages the checkpoint in a fresh process as `triage run` does (candidates two at a time where a fork is
allowed) and prints:

- verdict and confidence, and whether the verdict is the one expected (healthy / lr_too_high);
- step-equivalents: triage.run's wall time (load, walk, report) over one plain training step (the
  process's start, Python and torch imports, is left out: --json gives it as startup_s);
- the training steps the walk replayed: every optimizer step triage took, in its process and its forked
  copy (each trial of a search, and a reference replayed again over an extended fix's steps, included);
- peak memory: the triage process's peak resident set (VmHWM) and its forked copy's (ru_maxrss of its
  children), against the checkpoint's size on disk; and above `import torch` (the process's resident set
  just after it), the walk's peak before its first replay (the run replayed at the baseline node) and its
  peak overall.

Timings move with the machine's load (say it when you quote them); the verdicts do not: every experiment
is bounded by its steps, not by seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

VOCAB, CONTEXT, BATCH, SNAPSHOT_BATCHES = 512, 128, 16, 16
SUCCESSORS = 8  # likely next tokens of each token: the chain's entropy is about ln 8 + a little


@dataclass(frozen=True)
class Size:
    width: int
    layers: int
    heads: int


SIZES = {  # name -> shape; parameters with embeddings and head, at VOCAB 512 and CONTEXT 128
    "tiny": Size(64, 2, 2),  # ~0.17M: seconds, for CI
    "1M": Size(128, 4, 4),  # ~0.93M
    "8M": Size(320, 6, 5),  # ~7.6M
    "40M": Size(512, 12, 8),  # ~38M
    "300M": Size(1024, 24, 16),  # ~303M: --device cuda only
}
# The run's AdamW learning rate. lr_stall: 1e-3, which trains up to 8M but learns nothing in 80 steps at 40M
# and 300M (below), so it is a fault (lr_too_high) only at those sizes.
RUNS = {"healthy": 1e-3, "lr_high": 0.1, "lr_stall": 1e-3}
# A deeper model needs a smaller LR to train without warmup: at 1e-3 the 40M and 300M models learn nothing in
# 80 steps (6.33 -> 6.21 and 6.44 -> 6.23 against ln 512 = 6.24, on an H200), so 1e-3 is not "healthy" there.
# Each size's healthy LR is one of --sweep's grid whose loss after 80 steps is within 10% of the grid's best
# (40M: 4.45 at 3e-4, best 4.15 at 1e-4; 300M: 4.70 at 3e-5, the best; see the table in docs/accuracy.md).
HEALTHY_LR = {"tiny": 1e-3, "1M": 1e-3, "8M": 1e-3, "40M": 3e-4, "300M": 3e-5}
SWEEP = (3e-3, 1e-3, 3e-4, 1e-4, 3e-5)
EXPECTED = {"healthy": "healthy", "lr_high": "lr_too_high", "lr_stall": "lr_too_high"}
STALLS_AT = ("40M", "300M")  # the sizes at which lr_stall's 1e-3 learns nothing


def _torch():
    import torch

    return torch


def build_model(size: Size):
    torch = _torch()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(size.width), nn.LayerNorm(size.width)
            self.qkv = nn.Linear(size.width, 3 * size.width)
            self.proj = nn.Linear(size.width, size.width)
            self.mlp = nn.Sequential(nn.Linear(size.width, 4 * size.width), nn.GELU(),
                                     nn.Linear(4 * size.width, size.width))

        def forward(self, x):  # (B, T, C)
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, size.heads, c // size.heads).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, size.width), nn.Embedding(CONTEXT, size.width)
            self.blocks = nn.ModuleList(Block() for _ in range(size.layers))
            self.ln, self.head = nn.LayerNorm(size.width), nn.Linear(size.width, VOCAB, bias=False)
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)

        def forward(self, idx):  # (B, T) -> (B, T, VOCAB)
            x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return GPT()


def token_batches(n: int, seed: int = 0):
    """n batches of (inputs, next tokens), each (BATCH, CONTEXT), from one fixed Markov chain."""
    torch = _torch()
    g = torch.Generator().manual_seed(1234)
    successors = torch.randint(0, VOCAB, (VOCAB, SUCCESSORS), generator=g)  # the chain: fixed for every seed
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        seq = torch.empty(BATCH, CONTEXT + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
        for t in range(CONTEXT):
            pick = torch.randint(0, SUCCESSORS, (BATCH,), generator=g)
            noise = torch.rand(BATCH, generator=g) < 0.1  # one step in ten: any token
            nxt = successors[seq[:, t], pick]
            seq[:, t + 1] = torch.where(noise, torch.randint(0, VOCAB, (BATCH,), generator=g), nxt)
        batches.append((seq[:, :-1].clone(), seq[:, 1:].clone()))
    return batches


def lm_loss(model, batch):
    x, y = batch
    logits = model(x)
    return _torch().nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def setup(size: str = "1M", run: str = "healthy", device: str = "cpu", lr: Optional[float] = None):
    """The run's Setup: `run`'s LR (healthy: the size's own), or `lr` where given (the sweep)."""
    import triage

    torch = _torch()
    model = build_model(SIZES[size]).to(device)
    lr = lr if lr is not None else HEALTHY_LR[size] if run == "healthy" else RUNS[run]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    batches = [tuple(t.to(device) for t in b) for b in token_batches(SNAPSHOT_BATCHES)]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=lm_loss, batches=batches, device=device)


def train(size: str, run: str, device: str, steps: int, path: Path) -> tuple[list[float], float, int]:
    """The run: `steps` AdamW steps from init over the snapshot. Returns its losses, one plain step's
    seconds (median of 10 after 3 warm-ups, same model and batch), and the parameter count."""
    import triage

    torch = _torch()
    s = setup(size, run, device)
    model, opt, batches = s.model, s.optimizer, s.batches
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model, batches[step % len(batches)])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    triage.save_checkpoint(path, model, opt, step=steps, history=losses)
    s2 = setup(size, run, device)  # timed on a copy, so the saved run is untouched
    times = []
    for i in range(13):
        t0 = time.perf_counter()
        s2.optimizer.zero_grad(set_to_none=True)
        lm_loss(s2.model, s2.batches[0]).backward()
        s2.optimizer.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return losses, statistics.median(times[3:]), sum(p.numel() for p in model.parameters())


def sweep(size: str, device: str, steps: int) -> str:
    """The loss after `steps` steps from init at each LR of SWEEP: which LR trains this size (a row)."""
    ends = []
    for lr in SWEEP:
        s = setup(size, device=device, lr=lr)
        for step in range(steps):
            s.optimizer.zero_grad(set_to_none=True)
            loss = lm_loss(s.model, s.batches[step % len(s.batches)])
            loss.backward()
            s.optimizer.step()
        ends.append(loss.item())
    best = SWEEP[min(range(len(SWEEP)), key=lambda i: ends[i] if math.isfinite(ends[i]) else math.inf)]
    return (f"| {size} | " + " | ".join(f"{e:.2f}" for e in ends) + f" | {best:g} | {HEALTHY_LR[size]:g} |")


def triage_one(size: str, run: str, device: str, checkpoint: Path, out: Path, max_minutes, race: bool = True) -> dict:
    """In a fresh process (below): triage the checkpoint as `triage run` does, and measure it."""
    started = time.perf_counter()
    from triage.cli import api
    steps = _count_optimizer_steps()

    imported = time.perf_counter()
    options = {"max_minutes": max_minutes} if max_minutes is not None else {}  # (older triage: no ceiling)
    options |= {} if race else {"race": False}  # (older triage: no racing)
    from triage.speedups import Speedups
    from triage.walk.listener import SilentListener

    class FirstReplay(SilentListener):
        """Notes the peak resident set when the walk's first replay starts (the baseline: a run node, announced
        before it is measured)."""
        held_mb = None

        def started(self, node, experiment, title):
            if self.held_mb is None and experiment in REPLAYING:
                self.held_mb = _vm_hwm_mb()

    first = FirstReplay()
    report, _ = api.run(lambda: setup(size, run, device), checkpoint, out=out, speedups=Speedups(draw_ahead=False),
                        listener=first, **options)
    done = time.perf_counter()
    return {"verdict": report.root_cause, "confidence": report.confidence, "seconds": done - imported,
            "startup_s": imported - started, "cut": getattr(report, "cut", []), "path": report.path,
            "peak_mb": _vm_hwm_mb(), "copy_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "torch_mb": TORCH_MB, "held_before_replay_mb": first.held_mb, "replayed_steps": steps.value}


REPLAYING = {"replay", "lr_search", "init_search", "standard_loss_swap"}  # experiments that replay the run
TORCH_MB = None  # the resident set just after `import torch` (set by the --_one process)


def _count_optimizer_steps():
    """A counter of every optimizer step taken from now on, in this process and in the copies it forks
    (shared memory): the training steps the walk replayed, every trial of a search and every reference
    replayed again over an extended fix's steps included."""
    import multiprocessing

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    counter = multiprocessing.Value("q", 0)

    def count(optimizer, args, kwargs) -> None:
        with counter.get_lock():
            counter.value += 1
    register_optimizer_step_pre_hook(count)
    return counter


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(size: str, run: str, device: str, train_steps: int, folder: Path, max_minutes, threads: int = 1,
            race: bool = True) -> dict:
    checkpoint = folder / f"{size}-{run}.pt"
    losses, step_s, params = train(size, run, device, train_steps, checkpoint)
    t0 = time.perf_counter()
    child = subprocess.run([sys.executable, __file__, "--_one", size, run, device, str(checkpoint),
                            str(folder / f"{size}-{run}"), json.dumps(max_minutes), str(threads), json.dumps(race)],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    if child.returncode != 0:
        raise SystemExit(f"triage of {size}/{run} failed:\n{child.stderr[-3000:]}")
    result = json.loads(child.stdout.strip().splitlines()[-1])
    result.update(size=size, run=run, params=params, step_s=step_s, process_s=time.perf_counter() - t0,
                  loss_first=losses[0], loss_last=losses[-1], checkpoint_mb=checkpoint.stat().st_size / 2**20,
                  step_eq=result["seconds"] / step_s, right=result["verdict"] == EXPECTED[run])
    return result


def _row(r: dict) -> str:
    loss = f"{r['loss_first']:.2f} -> {r['loss_last']:.2f}" if math.isfinite(r["loss_last"]) else \
        f"{r['loss_first']:.2f} -> {r['loss_last']}"
    return (f"| {r['params'] / 1e6:.2f}M | {r['run']} | {loss} | {r['verdict']} ({r['confidence']})"
            f"{'' if r['right'] else ' **wrong**'} | {r['step_eq']:.0f} | {r['seconds']:.1f} s | "
            f"{r['step_s'] * 1000:.1f} ms | {r['replayed_steps']} | {r['peak_mb']:.0f} / {r['copy_peak_mb']:.0f} MB | "
            f"{_above_torch(r, 'held_before_replay_mb')} / {_above_torch(r, 'peak_mb')} MB | "
            f"{r['checkpoint_mb']:.1f} MB |")


def _above_torch(r: dict, key: str) -> str:
    value, torch_mb = r.get(key), r.get("torch_mb")
    return "?" if value is None or torch_mb is None else f"{value - torch_mb:.0f}"


HEADER = ("| params | run | its loss | verdict | step-eq | triage | one step | steps replayed | "
          "peak RSS (walk / copy) | peak above import torch (before 1st replay / all) | checkpoint |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,8M,40M", help=f"comma-separated, of {list(SIZES)}")
    parser.add_argument("--runs", default="healthy,lr_high", help=f"comma-separated, of {list(RUNS)}")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (required for 300M)")
    parser.add_argument("--train-steps", type=int, default=80, help="steps the run trains before its checkpoint")
    parser.add_argument("--max-minutes", type=float, default=None, help="triage's ceiling (default: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, for training and triage alike")
    parser.add_argument("--no-race", action="store_true", help="every candidate to its last step (triage run --no-race)")
    parser.add_argument("--keep", type=Path, default=None, help="keep checkpoints and reports here")
    parser.add_argument("--json", action="store_true", help="print one JSON line per case as well")
    parser.add_argument("--sweep", action="store_true",
                        help="no triage: each size's loss after --train-steps at each LR of the grid, to choose its "
                             "healthy LR")
    args = parser.parse_args(argv)
    sizes, runs = args.sizes.split(","), args.runs.split(",")
    unknown = [s for s in sizes if s not in SIZES] + [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"expected sizes from {list(SIZES)} and runs from {list(RUNS)}, found {unknown}")
    if "lr_stall" in runs and any(s not in STALLS_AT for s in sizes):
        parser.error(f"lr_stall is a fault only at {list(STALLS_AT)} (at smaller sizes its 1e-3 trains), found "
                     f"{sizes}: run it with --sizes 40M or 300M")
    if "300M" in sizes and not args.device.startswith("cuda"):
        parser.error("300M trains only with --device cuda (on one CPU thread it would take hours)")
    _torch().set_num_threads(args.threads)
    if args.sweep:
        print(f"| size | loss after {args.train_steps} steps at lr " + " | ".join(f"{lr:g}" for lr in SWEEP)
              + " | best | healthy LR used |\n|---|" + "---|" * (len(SWEEP) + 2), flush=True)
        for size in sizes:
            print(sweep(size, args.device, args.train_steps), flush=True)
        return 0
    print(f"threads {args.threads}; load: {os.getloadavg()[0]:.2f} (1 min average) on {os.cpu_count()} cores; device {args.device}")
    print(HEADER, flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            for run in runs:
                result = measure(size, run, args.device, args.train_steps, folder, args.max_minutes, args.threads,
                                 not args.no_race)
                results.append(result)
                print(_row(result), flush=True)
                if args.json:
                    print(json.dumps(result), flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0 if all(r["right"] for r in results) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_one":
        size, run, device, checkpoint, out, ceiling, threads, race = sys.argv[2:10]
        _torch().set_num_threads(int(threads))
        TORCH_MB = _vm_hwm_mb()
        print(json.dumps(triage_one(size, run, device, Path(checkpoint), Path(out), json.loads(ceiling),
                                    json.loads(race))))
    else:
        sys.exit(main())
