"""A validation figure for runs whose labels name groups, not output columns (metric learning: a triplet or
contrastive loss on an embedding): the share of validation examples whose nearest other example, by the model's
output, carries the same label (leave-one-out precision@1, the figure such runs are judged by).

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
from triage.experiments.probes import class_targets, first_batch_reads, model_output, output_gradient
from triage.experiments.training import untouched_buffers_and_rng

MAX_EXAMPLES = 2000  # validation examples compared (the distance matrix is this squared)
MIN_LABELS = 3  # a yes/no pair label (same or not) names no group an example's neighbour could share


@dataclass(frozen=True)
class NeighbourAgreement:
    agreement: float  # the share of examples whose nearest other one has the same label
    examples: int


def labels_name_groups(session: Any) -> bool:
    """Whether the run's labels name groups of examples rather than columns of the output (a triplet, contrastive
    or proxy loss on an embedding). Both must hold on the first batch: the loss couples examples through their
    labels (one example's label changed, the loss's gradient on the other examples' outputs changes: a
    cross-entropy, weighted or smoothed, a policy gradient's actions, an ordinal or multi-label loss score each
    example alone), and it does not push the label's column up (its gradient there is not the row's most
    negative in half the rows: a class-balanced cross-entropy with weights from the batch's counts couples
    examples too). Measured once per session; False where not measured (no integer label per output row, fewer
    than MIN_LABELS labels, a label beyond the output's columns, no gradient on the output)."""
    def measure() -> bool:
        batch = session.batches[0]
        labels = class_targets(batch)
        reads = first_batch_reads(session)
        name = next((n for n, t in named_tensors(batch) if t is labels), None)
        if labels is None or labels.dim() != 1 or name not in reads.by_loss \
                or int(labels.unique().numel()) < MIN_LABELS:
            return False
        grad = output_gradient(session, batch, labels.shape[0])
        if grad is None:
            return False
        changed = labels.clone()
        changed[0] = labels[labels != labels[0]][0]  # the first example takes another example's label
        moved = output_gradient(session, replace_tensor(batch, name, changed), labels.shape[0])
        largest = float(grad.abs().max())
        if moved is None or largest == 0:
            return False
        if float((moved[1:] - grad[1:]).abs().max()) <= 1e-6 * largest:
            return False  # each example scored alone
        labels = labels.to(grad.device)
        if bool(((labels < 0) | (labels >= grad.shape[1])).any()):
            return False  # not measured: no column to read (episode ids grouping a policy gradient's returns)
        rows = grad.abs().amax(1) > 0
        return float((grad[rows].argmin(1) == labels[rows]).float().mean()) < 0.5
    return session.memoised("labels_name_groups", measure)


def neighbour_agreement(setup: Any, val_batches: list, device: torch.device) -> Optional[NeighbourAgreement]:
    """Leave-one-out 1-nearest-neighbour label agreement of the model's outputs (cosine: metric learning
    normalises its embeddings) over the validation batches, buffers and RNG untouched. None where the
    outputs have no row per label or fewer than MIN_LABELS labels are present."""
    outputs, labels = [], []
    with untouched_buffers_and_rng(setup.model):
        for batch in val_batches:
            y = class_targets(batch)
            out = model_output(setup, batch, device) if y is not None and y.dim() == 1 else None
            if out is None or out.dim() != 2 or out.shape[0] != y.shape[0]:
                return None
            keep = torch.isfinite(out).all(1).cpu()
            outputs.append(out.cpu()[keep])
            labels.append(y.cpu()[keep])
            if sum(len(t) for t in labels) >= MAX_EXAMPLES:
                break
    if not labels:
        return None
    x, y = torch.cat(outputs)[:MAX_EXAMPLES], torch.cat(labels)[:MAX_EXAMPLES]
    if len(y) < 2 * MIN_LABELS or int(y.unique().numel()) < MIN_LABELS:
        return None
    x = F.normalize(x.double(), dim=1)
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    return NeighbourAgreement(float((y[distances.argmin(1)] == y).double().mean()), len(y))
