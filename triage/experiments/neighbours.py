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

from triage.experiments.probes import output_gradient, class_targets, model_output
from triage.experiments.training import untouched_buffers_and_rng

MAX_EXAMPLES = 2000  # validation examples compared (the distance matrix is this squared)
MIN_LABELS = 3  # a yes/no pair label (same or not) names no group an example's neighbour could share


@dataclass(frozen=True)
class NeighbourAgreement:
    agreement: float  # the share of examples whose nearest other one has the same label
    examples: int


def labels_name_groups(session: Any) -> bool:
    """Whether the run's labels name groups of examples rather than columns of the output: the loss's gradient
    on the model's output is not at its most negative on the label's column in at least half the rows that
    carry one (cross-entropy, focal or label-smoothed, pushes exactly that column up), or a label lies outside
    the output's columns. Measured once per session on the first batch; False where not measured (no integer
    label per output row, or no gradient on the output)."""
    def measure() -> bool:
        batch = session.batches[0]
        labels = class_targets(batch)
        if labels is None or labels.dim() != 1 or int(labels.unique().numel()) < MIN_LABELS:
            return False
        grad = output_gradient(session, batch, labels.shape[0])
        if grad is None:
            return False
        labels = labels.to(grad.device)
        if bool(((labels < 0) | (labels >= grad.shape[1])).any()):
            return True
        moving = grad.abs().amax(1) > 0
        if int(moving.sum()) < MIN_LABELS:
            return False
        at_label = grad[moving].argmin(1) == labels[moving]
        return float(at_label.float().mean()) < 0.5
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
