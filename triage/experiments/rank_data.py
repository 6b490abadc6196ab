"""rank_data: does each rank of a data-parallel run train on its own data?

Each rank's snapshot is what its sampler gave it. With a DistributedSampler the ranks' shards are
disjoint; without one (or with the same seed on every rank) every rank draws the same batches, and N
ranks train on one rank's data at N times the cost. Compared by digest: batch by batch (the same
position on every rank), and example by example (how many of a rank's examples another rank also holds).

When setup() gave its DataLoader (not a list), the counterfactual is measured too: a DistributedSampler
over the same dataset, with the loader's batch size and collate_fn, gives every rank a different batch.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field
from torch.utils.data import DataLoader, IterableDataset

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.fingerprint import batch_digest, example_digests
from triage.outcomes.rank_data import RankDataOutcome


class RankDataParams(Params):
    max_batches: int = Field(default=64, ge=1, description="Compare the first N snapshot batches of each rank.")
    max_examples: int = Field(default=1024, ge=1, description="Compare at most N examples of each rank.")


def measure(ctx: Context, p: RankDataParams) -> RankDataOutcome:
    session, ranks = ctx.session, ctx.ranks
    if ranks.world_size == 1:
        return RankDataOutcome(world_size=1)
    batches = session.batches[:p.max_batches]  # as long on every rank (the session aligned them)
    digests = ranks.gather([batch_digest(b) for b in batches])
    same_position = [len({d[i] for d in digests}) == 1 for i in range(len(batches))]
    examples = ranks.gather(set(example_digests(batches, p.max_examples)))
    shared = [len(mine & set().union(*(o for r, o in enumerate(examples) if r != me))) / len(mine)
              for me, mine in enumerate(examples) if mine]
    loader = session.setup.batches if isinstance(session.setup.batches, DataLoader) else None
    return RankDataOutcome(
        world_size=ranks.world_size, batches_compared=len(batches),
        identical_batch_fraction=sum(same_position) / len(batches) if batches else None,
        identical_groups=_groups(digests), shared_example_fraction=sum(shared) / len(shared) if shared else None,
        sampler=type(loader.sampler).__name__ if loader is not None else None,
        sampler_shards=_sampler_shards(ctx, loader),
    )


def _groups(digests: list[list[bytes]]) -> list[list[int]]:
    by_data: dict[tuple[bytes, ...], list[int]] = {}
    for rank, d in enumerate(digests):
        by_data.setdefault(tuple(d), []).append(rank)
    return [g for g in by_data.values() if len(g) > 1]


def _sampler_shards(ctx: Context, loader: Optional[DataLoader]) -> Optional[bool]:
    """The fix, tried: the first batch a DistributedSampler gives each rank. Every rank takes part (the
    outcome is gathered), with None where no map-style DataLoader with a batch size was given."""
    first: Optional[bytes] = None
    if loader is not None and loader.batch_size is not None and not isinstance(loader.dataset, IterableDataset):
        from torch.utils.data.distributed import DistributedSampler

        sampler = DistributedSampler(loader.dataset, num_replicas=ctx.ranks.world_size, rank=ctx.ranks.rank,
                                     shuffle=False)
        probe: Any = DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                                collate_fn=loader.collate_fn, drop_last=loader.drop_last)
        first = next((batch_digest(b) for b in probe), None)
    every = ctx.ranks.gather(first)
    if any(d is None for d in every):
        return None
    return len(set(every)) == len(every)


RANK_DATA = Experiment(
    name="rank_data",
    summary="Compares the ranks' data snapshots batch by batch and example by example: each rank of a "
            "data-parallel run should train on its own shard.",
    params=RankDataParams,
    outcome=RankDataOutcome,
    measure=measure,
)
