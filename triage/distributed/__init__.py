"""Triage of a run trained with torch.distributed, on the engine it already uses: torchrun launches
one triage process per rank, each rank replays its own shard in lockstep with the others, and the
figures conditions read are reduced across ranks so that every rank takes the same branch.

    ranks.py        which rank this is; triage's own gloo groups and store keys; joining under torchrun
    settle.py       the end of each experiment: every rank's outcome, or which rank raised or hangs
    reduce.py       every rank's outcome reduced to one (a loss is the mean, finite only if finite everywhere)
    session.py      opening the session on every rank: naming a rank that fails, equal snapshot lengths
    checkpoint.py   torch.distributed.checkpoint folders; full state dicts into DDP / FSDP2 models
    launch.py       `triage run --nproc-per-node N`: torchrun started for the user; exit codes
    wrappers.py     DDP / FSDP2 / plain
    fingerprint.py  digests of tensors, batches and examples that ranks compare

Nothing here is imported by `import triage`; the command line reads only the constant below (without torch).
"""

DEFAULT_RANK_TIMEOUT_S = 180.0  # a rank silent this long inside a collective is taken to have hung

