"""A validation figure for runs whose labels name groups, not output columns (metric learning: a triplet or
contrastive loss on an embedding): the share of distinct validation examples whose nearest other example, by
the model's output, carries the same label (leave-one-out precision@1, the figure such runs are judged by).

Such a loss's own value may not compare two models: a miner hands it the triplets that still violate its
margin, and averaging over the non-zero ones makes a better embedding score higher on validation (a triplet
run at its healthy LR: validation loss 0.136 -> 0.213 over 300 steps while precision@1 rose 0.77 -> 0.96).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from triage.batches import named_tensors, replace_tensor
from triage.experiments.probes import (IGNORE_INDEX, class_targets, first_batch_reads, model_output,
                                       output_gradient)
from triage.experiments.sequence_targets import distinct_inputs
from triage.experiments.training import untouched_buffers_and_rng

MAX_EXAMPLES = 2000  # validation examples compared (the distance matrix is this squared)
MIN_LABELS = 3  # a yes/no pair label (same or not) names no group an example's neighbour could share
PROBE_BATCHES = 4  # batches the labels' role is read on; every one must say the same
MIN_ROWS = 16  # rows with a gradient a batch needs to be read: a few rows hit a label's column by chance


@dataclass(frozen=True)
class NeighbourAgreement:
    agreement: float  # the share of examples whose nearest other one has the same label
    examples: int  # distinct examples compared


def labels_name_groups(session: Any) -> bool:
    """Whether the run's labels name groups of examples rather than columns of the output (a triplet or
    contrastive loss on an embedding). On each of the first PROBE_BATCHES batches: the loss couples examples
    through their labels (one example's label changed, the loss's gradient on the other examples' outputs
    changes: a cross-entropy, weighted or smoothed, an ordinal or multi-label loss score each example alone),
    and no label column is what it pushes up (in under half the rows is the most negative gradient at a column
    one of the batch's labels names: mixup's pair of labels and a class-balanced cross-entropy push one).
    Labels beyond the output's columns index none: coupled, they name groups, unless the loss also reads a float
    per example (a policy gradient's returns, grouped by episode ids). A batch on which it cannot be told (the
    labels name half the columns or more, fewer than MIN_LABELS of them, a gradient on under MIN_ROWS rows: a
    mined loss with few triplets left) is left out; every batch on which it can must say groups. False where the labels are
    no integer per output row that the loss reads. Measured once per session, the same on every rank."""
    def measure() -> bool:
        from triage.load.ranks import current

        found = [f for f in (_groups_in(session, b) for b in session.batches[:PROBE_BATCHES]) if f is not None]
        return current().all(bool(found) and all(found))
    return session.memoised("labels_name_groups", measure)


def _groups_in(session: Any, batch: Any) -> Optional[bool]:
    """labels_name_groups on one batch; None where it cannot be told there."""
    labels = class_targets(batch)
    name = next((n for n, t in named_tensors(batch) if t is labels), None)
    reads = first_batch_reads(session)
    if labels is None or labels.dim() != 1 or name not in reads.by_loss:
        return False
    if int(labels.unique().numel()) < MIN_LABELS:
        return None
    grad = output_gradient(session, batch, labels.shape[0])
    if grad is None or float(grad.abs().max()) == 0:
        return None
    changed = labels.clone()
    changed[0] = labels[labels != labels[0]][0]  # the first example takes another example's label
    moved = output_gradient(session, replace_tensor(batch, name, changed), labels.shape[0])
    if moved is None or float((moved[1:] - grad[1:]).abs().max()) <= 1e-6 * float(grad.abs().max()):
        return False  # each example scored alone
    labels = labels.to(grad.device)
    if bool(((labels < 0) | (labels >= grad.shape[1])).any()):
        return not reads.floats_by_loss
    named = labels.unique()
    if 2 * len(named) >= grad.shape[1]:
        return None  # any column could be a label's: not told apart
    rows = grad.abs().amax(1) > 0
    if int(rows.sum()) < MIN_ROWS:
        return None  # a mined loss near convergence: too few rows with a gradient to count
    pushed = torch.isin(grad[rows].argmin(1), named)
    return float(pushed.float().mean()) < 0.5


def neighbour_agreement(setup: Any, val_batches: list, device: torch.device) -> Optional[NeighbourAgreement]:
    """Leave-one-out 1-nearest-neighbour label agreement of the model's outputs in eval mode (cosine: metric
    learning normalises its embeddings), over the distinct examples of the validation batches (a copy would be
    its own nearest neighbour), buffers and RNG untouched. None where the outputs have no row per label or
    fewer than MIN_LABELS labels are present."""
    outputs, labels = [], []
    was_training = setup.model.training
    setup.model.eval()
    try:
        with untouched_buffers_and_rng(setup.model):
            for batch in val_batches:
                y = class_targets(batch)
                out = model_output(setup, batch, device) if y is not None and y.dim() == 1 else None
                if out is None or out.dim() != 2 or out.shape[0] != y.shape[0]:
                    return None
                keep = (torch.isfinite(out).all(1) & (y.to(out.device) != IGNORE_INDEX)).cpu()
                outputs.append(out.cpu()[keep])
                labels.append(y.cpu()[keep])
    finally:
        setup.model.train(was_training)
    if not labels:
        return None
    x, y = distinct_inputs(torch.cat(outputs), torch.cat(labels))
    x, y = x[:MAX_EXAMPLES], y[:MAX_EXAMPLES]
    if len(y) < 2 * MIN_LABELS or int(y.unique().numel()) < MIN_LABELS:
        return None
    return NeighbourAgreement(leave_one_out_agreement(F.normalize(x.double(), dim=1), y), len(y))


def leave_one_out_agreement(x: torch.Tensor, y: torch.Tensor) -> float:
    """The share of rows of `x` (N, D) whose nearest other row has the same label."""
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    return float((y[distances.argmin(dim=1)] == y).double().mean())
