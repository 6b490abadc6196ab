"""replica_sync: do the ranks of a data-parallel run hold the same parameters?

Under DDP every rank holds a full replica and DDP keeps the replicas identical: it broadcasts rank 0's
weights when it wraps the model, and averages the gradients every step so that every rank takes the
same update. Replicas that differ are N models trained on N shards, and whatever rank 0 saves is one of
them. Compared by parameter, at three moments:

- at the checkpoint: a checkpoint per rank that disagree, or weights loaded on some ranks only;
- at setup()'s own init (setup() called again): a rank-dependent init (a seed per rank) that nothing
  broadcasts (DDP would; a hand-written data-parallel loop must);
- after a short replay from the checkpoint, with the run's own train_step when it has one (it may be
  what averages the gradients): a model not wrapped at all, or a parameter updated outside DDP (left
  out of it, trained by another optimizer on the unwrapped module, changed in place by the run's code).

Equal digests of a parameter's bytes on every rank mean in sync; for those that differ, the spread (max
over elements of the largest minus the smallest rank's value) is measured relative to the parameter's
largest magnitude. A sharded (FSDP2) model has no replicas (each rank holds its own shard): not checked.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

import torch
from pydantic import Field

from triage.experiments.fingerprint import tensor_digest
from triage.load.wrappers import unwrap, wrapper_of
from triage.experiments.base import Context, Experiment, Params
from triage.experiments.replay import ReplayParams, measure as replay
from triage.outcomes.replicas import ParamSpread, ReplicaOutcome


class ReplicaParams(Params):
    steps: int = Field(default=10, ge=0, le=10_000, description="Replay this many steps from the checkpoint, "
                                                                "then compare again (0: no replay).")
    check_init: bool = Field(default=True, description="Also compare setup()'s own init across ranks "
                                                       "(setup() is called again).")
    tolerance: float = Field(default=1e-6, ge=0, description="A parameter differs when its spread across ranks "
                                                             "exceeds this share of its largest magnitude "
                                                             "(replicas DDP keeps are bitwise equal).")


def measure(ctx: Context, p: ReplicaParams) -> ReplicaOutcome:
    session, setup = ctx.session, ctx.session.setup
    world, wrapper = ctx.ranks.world_size, wrapper_of(setup.model)
    if world == 1 or wrapper == "fsdp2":
        return ReplicaOutcome(world_size=world, wrapper=wrapper, applies=False)
    module = unwrap(setup.model)
    at_checkpoint, apart = _differing(ctx, module, p.tolerance)
    at_init: list[tuple[str, float]] = []
    if p.check_init:
        fresh = session.fresh_setup()  # collective under DDP (its broadcast): every rank calls it here
        at_init, apart_init = _differing(ctx, unwrap(fresh.model), p.tolerance)
        apart = apart or apart_init
        del fresh
        ctx.restart()  # setup() reseeded and drew random numbers
    drifted: list[tuple[str, float]] = []
    steps_run, loop = 0, None
    if p.steps:
        loop = "user" if setup.train_step is not None else "reference"
        steps_run = replay(ctx, ReplayParams(steps=p.steps, loop=loop)).steps_run
        before = {name for name, _ in at_checkpoint}
        after, apart_replay = _differing(ctx, module, p.tolerance)
        drifted = [(n, s) for n, s in after if n not in before]
        apart = apart or apart_replay
    spreads = ([ParamSpread(name=n, moment="checkpoint", spread=s) for n, s in at_checkpoint]
               + [ParamSpread(name=n, moment="init", spread=s) for n, s in at_init]
               + [ParamSpread(name=n, moment="replay", spread=s) for n, s in drifted])
    worst = max(spreads, key=lambda x: x.spread, default=None)
    names = list(dict.fromkeys(x.name for x in sorted(spreads, key=lambda x: -x.spread)))
    first = next((m for m, found in (("checkpoint", at_checkpoint), ("init", at_init), ("replay", drifted)) if found),
                 None)
    return ReplicaOutcome(
        world_size=world, wrapper=wrapper, applies=True, parameter_count=sum(1 for _ in module.parameters()),
        differ_at_checkpoint=[n for n, _ in at_checkpoint], differ_at_init=[n for n, _ in at_init],
        drifted=[n for n, _ in drifted], parameters=names, out_of_sync_count=len(names), first_moment=first,
        worst_parameter=worst.name if worst else None, max_spread=worst.spread if worst else None,
        ranks_apart=apart, steps_run=steps_run, loop=loop,
        spreads=sorted(spreads, key=lambda x: -x.spread)[:20],
        explanation=_explain(wrapper, type(module).__name__, first, session.checkpoint is not None),
    )


def _differing(ctx: Context, module: torch.nn.Module, tolerance: float) -> tuple[list[tuple[str, float]], list[int]]:
    """(name, relative spread) of the parameters whose ranks' copies differ, and the ranks apart on the
    worst. The digests are gathered from every rank, so every rank measures the same parameters."""
    named = list(module.named_parameters())
    mine = [tensor_digest(q) for _, q in named]
    every = ctx.ranks.gather(mine)
    out: list[tuple[str, float]] = []
    apart: list[int] = []
    worst = -1.0
    for i, (name, q) in enumerate(named):
        digests = [e[i] for e in every]
        if len(set(digests)) == 1:
            continue
        scale = max(row[0] for row in ctx.ranks.gather_floats([float(q.detach().abs().max())]))
        spread = ctx.ranks.spread(q) / max(scale, 1e-12)
        if spread > tolerance:
            out.append((name, spread))
        if spread > worst:
            common = Counter(digests).most_common(1)[0][0]
            worst, apart = spread, [r for r, d in enumerate(digests) if d != common] or list(range(1, len(digests)))
    return out, apart


def _explain(wrapper: str, kind: str, first: Optional[str], has_checkpoint: bool) -> Optional[str]:
    if first is None:
        return None
    if first == "checkpoint":
        return ("The ranks hold different weights at the checkpoint: per-rank checkpoints that disagree, or "
                "weights loaded on some ranks only." if has_checkpoint else
                "The ranks start from different weights (setup()'s init, no checkpoint given): a seed per rank "
                "and nothing that broadcasts rank 0's weights.")
    if first == "init":
        return ("setup() builds different weights on each rank (a seed per rank?) and nothing broadcasts them: "
                "DDP would (it broadcasts rank 0's weights when it wraps the model); a hand-written "
                "data-parallel loop must call dist.broadcast on every parameter.")
    if wrapper == "plain":
        return (f"setup() returned an unwrapped {kind}: nothing averages the ranks' gradients, so each rank "
                "trains its own copy on its own shard. Wrap it in DistributedDataParallel (or fully_shard).")
    return ("DDP wraps the model, yet these parameters drift apart: they are updated outside DDP's gradient "
            "all-reduce (left out of DDP, trained by another optimizer on the unwrapped module, or changed in "
            "place by the run's own code).")


REPLICA_SYNC = Experiment(
    name="replica_sync",
    summary="Compares every parameter across ranks at the checkpoint, at setup()'s init and after a short "
            "replay: replicas of a data-parallel model must stay identical.",
    params=ReplicaParams,
    outcome=ReplicaOutcome,
    measure=measure,
)
