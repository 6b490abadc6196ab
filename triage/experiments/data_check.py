"""Data checks on the snapshot: non-finite values in any tensor of any batch."""

from __future__ import annotations

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.batches import named_tensors, sample_ids
from triage.outcomes.data_check import DataCheckOutcome, NonFiniteTensor


class DataCheckParams(Params):
    include_val: bool = Field(default=True, description="Check val_batches too.")


def measure(ctx: Context, p: DataCheckParams) -> DataCheckOutcome:
    splits = [("train", ctx.session.batches)]
    if p.include_val:
        splits.append(("val", ctx.session.val_batches))
    found, tensors, batches = [], 0, 0
    for split, split_batches in splits:
        for index, batch in enumerate(split_batches):
            batches += 1
            for key, tensor in named_tensors(batch):
                tensors += 1
                if not tensor.is_floating_point() and not tensor.is_complex():
                    continue
                nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
                if nan or inf:
                    where = _first_nonfinite(tensor)
                    ids = sample_ids(batch)
                    found.append(NonFiniteTensor(
                        split=split, batch=index, key=key, nan=nan, inf=inf, numel=tensor.numel(),
                        first_index=where, first_value=float(tensor[tuple(where)].item()),
                        sample_id=ids[where[0]] if ids and where and where[0] < len(ids) else None))
    train_bad = [f.batch for f in found if f.split == "train"]
    return DataCheckOutcome(batches_checked=batches, tensors_checked=tensors, nonfinite_count=len(found),
                            train_nonfinite_count=len(train_bad), nonfinite=found,
                            first_bad_batch=min(train_bad) if train_bad else None)


def _first_nonfinite(tensor: torch.Tensor) -> list[int]:
    """The index of the first NaN/Inf of `tensor`, row-major ([] for a 0-d tensor)."""
    bad = (~torch.isfinite(tensor)).reshape(-1).nonzero()
    if tensor.dim() == 0:
        return []
    return [int(i) for i in torch.unravel_index(bad[0, 0], tensor.shape)]


DATA_CHECK = Experiment(
    name="data_check",
    summary="Scans every tensor of every snapshot batch (inputs and targets) for NaN and Inf.",
    params=DataCheckParams,
    outcome=DataCheckOutcome,
    measure=measure,
)
