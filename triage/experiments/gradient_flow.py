"""Gradient flow: one forward/backward at the checkpoint weights, the gradient each parameter gets.

Answers "which parameters should train but cannot": no gradient reaches them (a detached graph),
requires_grad is off (frozen), or the optimizer does not hold them; and whether gradients vanish
with depth (early weight matrices' norms against late ones').
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.by_design import frozen_by_design, is_peft
from triage.experiments.training import autocast, loss_value
from triage.views import Bars
from triage.outcomes.gradient_flow import GradientFlowOutcome, ParamGradNorm


class GradientFlowParams(Params):
    batches: int = Field(default=1, ge=1, description="Snapshot batches to average the gradient over.")


def measure(ctx: Context, p: GradientFlowParams) -> GradientFlowOutcome:
    session = ctx.session
    setup = session.setup
    model = setup.model
    batches = session.batches[:p.batches]
    model.train()  # as the reference loop trains
    setup.optimizer.zero_grad(set_to_none=True)
    losses, loss_has_grad = [], True
    for i, batch in enumerate(batches):
        with autocast(setup.precision, session.device):
            loss = setup.loss_fn(model, batch)
        losses.append(loss_value(loss))
        loss_has_grad = loss_has_grad and isinstance(loss, torch.Tensor) and loss.requires_grad
        if loss_has_grad:
            (loss / len(batches)).backward()  # the mean gradient over the batches
        ctx.progress(i + 1, len(batches))
    if not loss_has_grad:  # a partial sum would not be the mean gradient
        setup.optimizer.zero_grad(set_to_none=True)
    return _summarise(model, setup.optimizer, float(np.mean(losses)), loss_has_grad,
                      frozen_by_design(model, setup.optimizer, setup.frozen_by_design))


def _summarise(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: float,
               loss_has_grad: bool, by_design: set[str]) -> GradientFlowOutcome:
    in_optimizer = {id(q) for group in optimizer.param_groups for q in group["params"]}
    named = list(model.named_parameters())
    total = sum(q.numel() for _, q in named) or 1
    designed = [(n, q) for n, q in named if n in by_design]
    frozen = [(n, q) for n, q in named if not q.requires_grad and n not in by_design]
    outside = [(n, q) for n, q in named if q.requires_grad and id(q) not in in_optimizer and n not in by_design]
    trainable = [(n, q) for n, q in named if q.requires_grad and id(q) in in_optimizer]
    norms = {n: _grad_norm(q) for n, q in named}
    no_grad = [(n, q) for n, q in trainable if norms[n] is None]
    zero_grad = [(n, q) for n, q in trainable if norms[n] == 0.0]
    with_grad = [norms[n] for n, q in named if q.grad is not None]
    return GradientFlowOutcome(
        loss=loss,
        layer_norms=[ParamGradNorm(name=n, norm=norms[n] or 0.0, numel=q.numel()) for n, q in named],
        trainable_count=len(trainable),
        no_grad=[n for n, _ in no_grad], no_grad_count=len(no_grad),
        no_grad_fraction=_elements(no_grad) / (_elements(trainable) or 1),
        zero_grad=[n for n, _ in zero_grad], zero_grad_fraction=_elements(zero_grad) / (_elements(trainable) or 1),
        frozen=[n for n, _ in frozen], frozen_count=len(frozen), frozen_fraction=_elements(frozen) / total,
        not_in_optimizer=[n for n, _ in outside], not_in_optimizer_count=len(outside),
        not_in_optimizer_fraction=_elements(outside) / total,
        outside_with_grad_fraction=_elements([(n, q) for n, q in outside if norms[n] is not None]) / total,
        by_design=[n for n, _ in designed], by_design_fraction=_elements(designed) / total, peft=is_peft(model),
        loss_has_grad=loss_has_grad,
        early_late_ratio=_early_late_ratio([norms[n] for n, q in named if q.dim() >= 2 and q.grad is not None]),
        min_layer_norm=min(with_grad) if with_grad else None,
        max_layer_norm=max(with_grad) if with_grad else None,
    )


def _grad_norm(param: torch.nn.Parameter) -> Optional[float]:
    """The gradient's L2 norm; None when it got no gradient at all."""
    if param.grad is None:
        return None
    return float(param.grad.detach().float().norm().item())


def _elements(named: list[tuple[str, torch.nn.Parameter]]) -> int:
    return sum(q.numel() for _, q in named)


def _early_late_ratio(weight_norms: list[float]) -> Optional[float]:
    """Median of the first quarter over median of the last quarter, in registration order.

    Weight matrices and kernels only (dim >= 2): biases and norm scales have gradients of another
    scale and would blur the trend with depth.
    """
    if len(weight_norms) < 2:
        return None
    k = max(1, len(weight_norms) // 4)
    late = float(np.median(weight_norms[-k:]))
    return float(np.median(weight_norms[:k])) / late if late > 0 else None


GRADIENT_FLOW = Experiment(
    name="gradient_flow",
    summary="One forward/backward at the checkpoint weights: which parameters get no gradient, are "
            "frozen or missing from the optimizer, and how gradient norms change with depth.",
    params=GradientFlowParams,
    outcome=GradientFlowOutcome,
    views=(Bars(title="Gradient norm per parameter", field="layer_norms", value="norm", labels="name",
                axis_label="gradient norm", log=True,
                caption="In depth order, input side at the top; a red 0 got no gradient."),),
    measure=measure,
)
