"""The loss's gradient where the model is sure: a loss can be finite on a confident prediction and its gradient
not (a focal loss's (1 - p) ** gamma with gamma under 1 has an infinite derivative where p rounds to 1). Its
replay stays finite until one example is fitted that well; from that step on the batch's gradient is NaN.
Measured at the checkpoint by swapping the model's logits for a confident prediction of each example's target
(a forward hook) and taking the loss's gradient on them; where it is not finite, anomaly mode names the
backward op that made it and the user's line whose forward call built that op."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from triage.experiments.levels import margin_on_the_label, output_hooked, target_logit
from triage.experiments.locate_probe import anomaly_pass
from triage.experiments.training import untouched_buffers_and_rng
from triage.experiments.user_source import display_path, source_line

# Margins a classifier reaches in training: at 20 logits a softmax's top probability is exactly 1 in fp32.
CONFIDENT_MARGINS = (10.0, 20.0, 30.0)


@dataclass(frozen=True)
class Unstable:
    margin: float  # the least margin at which the gradient is not finite
    op: Optional[str]  # the backward op anomaly mode named
    source: Optional[str]  # file:line of the user's forward call that built it
    line: Optional[str]


def unstable_when_confident(setup: Any, batches: list[Any], kind: str, device: Any) -> Optional[Unstable]:
    """The least margin of CONFIDENT_MARGINS on every example's true class (on its 0/1 target's logit for
    binary targets) at which the run's loss is finite and its gradient on the output is not; None where
    it stays finite, or no such prediction can be built (a regressor, a structured output). The caller
    asks only where the output is logits (not probabilities, not an embedding whose labels name groups)."""
    if kind not in ("classification", "binary"):
        return None
    make = margin_on_the_label if kind == "classification" else target_logit
    with untouched_buffers_and_rng(setup.model):
        for margin in CONFIDENT_MARGINS:
            for batch in batches:
                def confident(output: torch.Tensor, b: Any = batch, m: float = margin) -> Optional[torch.Tensor]:
                    return make(output, b, m)
                if _gradient_finite(setup, batch, confident) is False:
                    return _located(setup, batch, confident, margin, device)
    return None


def _gradient_finite(setup: Any, batch: Any, swap: Callable) -> Optional[bool]:
    """Whether the loss's gradient on the model's output is finite where the output is `swap(output)`; None
    where that cannot be built, the loss refuses it, or the loss itself is not finite there."""
    swapped: list[torch.Tensor] = []

    def replace(module, inputs, output):
        made = swap(output) if isinstance(output, torch.Tensor) else None
        if made is None:
            raise _Refused
        swapped.append(made.to(output.device).detach().requires_grad_())
        return swapped[-1]

    try:
        with output_hooked(setup.model, replace), torch.enable_grad():
            loss = setup.loss_fn(setup.model, batch)
            if not isinstance(loss, torch.Tensor) or not swapped or not bool(torch.isfinite(loss).all()):
                return None
            (grad,) = torch.autograd.grad(loss.float().sum(), swapped[-1], allow_unused=True)
    except Exception:  # noqa: BLE001 - no such output, or the loss refuses it
        return None
    return None if grad is None else bool(torch.isfinite(grad).all())


def _located(setup: Any, batch: Any, swap: Callable, margin: float, device: Any) -> Unstable:
    """The op anomaly mode names for the non-finite gradient, and the user's line that built it."""
    def replace(module, inputs, output):
        return swap(output).to(output.device).detach().requires_grad_()

    op = frame = None
    try:
        with output_hooked(setup.model, replace), torch.enable_grad():
            traced, named, frame = anomaly_pass(setup, batch, "fp32", device)
        op = named or traced
    except Exception:  # noqa: BLE001 - the op is a detail; the margin was measured
        pass
    finally:
        for q in setup.model.parameters():  # the pass's backward left gradients; no step is to read them
            q.grad = None
    return Unstable(margin=margin, op=op, source=display_path(*frame) if frame else None,
                    line=source_line(*frame) if frame else None)


class _Refused(Exception):
    """The swap could not build a prediction for this output."""
