"""How far ahead a sequence model's labels make it predict: the labels against the input tokens (are they the
tokens themselves, or the tokens one step on?) and the loss against the model's scores (does it score the
output at t against the label at t, or at t + 1, as Hugging Face's *ForCausalLM models do inside?).

A next-token model predicts 1 token ahead. Labels shifted by the dataset (labels = input_ids[1:]) and again
by the model train each output on the token 2 steps on: the model learns, slowly, a task with more noise in
it, and nothing is out of range.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from triage.batches import named_tensors, replace_tensor
from triage.contract import Setup
from triage.experiments.probes import first_floating
from triage.experiments.training import autocast, loss_value
from triage.judge.readings import label_shift, scores_shifted
from triage.outcomes.labels import LabelShift

SHIFTS = (0, 1, 2)  # the tokens ahead a label may be taken from


def measure_shift(setup: Setup, batch: Any, target: Optional[str], device: torch.device,
                  ignore_index: int) -> LabelShift:
    """The label shift of one batch whose labels (`target`) are (B, T) integer tensors beside input tokens
    of the same shape; an empty LabelShift where the batch has no such pair."""
    tensors = dict(named_tensors(batch))
    labels = tensors.get(target) if target else None
    tokens = _tokens_beside(tensors, labels)
    if labels is None or tokens is None:
        return LabelShift()
    agreements = [_agreement(labels, tokens, k, ignore_index) for k in SHIFTS]
    shift = label_shift(agreements)
    scored = _scored_against(setup, batch, labels, device, ignore_index)
    model_shifts = scores_shifted(*scored) if scored else None
    return LabelShift(label_shift=shift, shift_agreements=agreements, model_shifts_labels=model_shifts,
                      labelled_share=float((labels != ignore_index).double().mean()),
                      predicts_ahead=shift + int(model_shifts) if shift is not None and model_shifts is not None
                      else None)


def realigned(batch: Any, target: str, ahead: int, ignore_index: int) -> Any:
    """The batch with its labels moved back so that the loss trains each output on the next token: labels
    that make the model predict `ahead` tokens on, moved `ahead - 1` places later (the first places, which
    then have no label, are ignore_index)."""
    move = ahead - 1
    labels = dict(named_tensors(batch))[target]
    moved = torch.full_like(labels, ignore_index)
    moved[:, move:] = labels[:, :labels.shape[1] - move]
    return replace_tensor(batch, target, moved)


def _tokens_beside(tensors: dict[str, torch.Tensor], labels: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The integer inputs of the labels' (B, T) shape (T >= 4), other than the labels."""
    if labels is None or labels.dim() != 2 or labels.shape[1] < 4:
        return None
    return next((t for t in tensors.values() if t is not labels and t.shape == labels.shape
                 and not t.is_floating_point() and t.dtype != torch.bool), None)


def _agreement(labels: torch.Tensor, tokens: torch.Tensor, shift: int, ignore_index: int) -> Optional[float]:
    """The share of labelled places t where the label is the input token at t + shift."""
    t = labels.shape[1] - shift
    own, ahead = labels[:, :t], tokens[:, shift:shift + t]
    kept = own != ignore_index
    return float((own[kept] == ahead[kept]).double().mean()) if kept.any() else None


@torch.no_grad()
def _scored_against(setup: Setup, batch: Any, labels: torch.Tensor, device: torch.device,
                    ignore_index: int) -> Optional[tuple[float, float, float]]:
    """The run's loss on the batch, and, from the scores of the same forward, the cross-entropy of the
    output at t against the label at t and against the label at t + 1 (None: no (B, T, K) scores)."""
    captured: list[torch.Tensor] = []

    def hook(module, inputs, output):
        scores = first_floating(output, min_dim=3)
        if scores is not None and not captured:
            captured.append(scores.detach().float())

    handle = setup.model.register_forward_hook(hook)
    try:
        with autocast(setup.precision, device):
            loss = loss_value(setup.loss_fn(setup.model, batch))
    except Exception:  # noqa: BLE001 - a loss that fails here is the baseline's to report, not this check's
        return None
    finally:
        handle.remove()
    if not captured or captured[0].shape[:2] != labels.shape:
        return None
    scores, labels = captured[0], labels.to(captured[0].device).long()
    k = scores.shape[-1]
    same = F.cross_entropy(scores.reshape(-1, k), labels.reshape(-1), ignore_index=ignore_index)
    next_ = F.cross_entropy(scores[:, :-1].reshape(-1, k), labels[:, 1:].reshape(-1), ignore_index=ignore_index)
    return loss, float(same), float(next_)
