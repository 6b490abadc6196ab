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

from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.by_design import frozen_by_design, is_peft
from triage.experiments.training import autocast, loss_value
from triage.views import Bars


class GradientFlowParams(Params):
    batches: int = Field(default=1, ge=1, description="Snapshot batches to average the gradient over.")


class ParamGradNorm(Outcome):
    """One parameter's gradient: its L2 norm (0.0 when it got none) and its size."""

    name: str
    norm: float
    numel: int


class GradientFlowOutcome(Outcome):
    loss: Optional[float] = Field(default=None, description="Mean loss over the batches used.")
    layer_norms: list[ParamGradNorm] = Field(description="Per parameter, in registration (depth) order.")
    trainable_count: int = Field(description="Parameters with requires_grad that the optimizer holds.")
    no_grad: list[str] = Field(description="Trainable parameters that got no gradient at all (grad None): "
                                           "the graph from them to the loss is cut.")
    no_grad_count: int
    no_grad_fraction: float = Field(description="Of the trainable parameters' elements.")
    zero_grad: list[str] = Field(default_factory=list, description="Trainable parameters whose gradient is "
                                 "exactly zero through an intact graph (e.g. behind dead units).")
    zero_grad_fraction: float = Field(default=0.0, description="Of the trainable parameters' elements.")
    frozen: list[str] = Field(description="Parameters with requires_grad=False (those frozen by design left out).")
    frozen_count: int
    frozen_fraction: float = Field(description="Of all parameter elements.")
    not_in_optimizer: list[str] = Field(description="requires_grad=True but in no optimizer param group (those "
                                                    "left out by design not counted).")
    not_in_optimizer_count: int
    not_in_optimizer_fraction: float = Field(description="Of all parameter elements.")
    outside_with_grad_fraction: float = Field(
        default=0.0, description="Of all parameter elements, those in no optimizer that got a gradient: the "
                                 "loss trains them, nothing steps them.")
    by_design: list[str] = Field(default_factory=list, description="Parameters that do not train on purpose: a "
                                 "PEFT model's base, or the names Setup.frozen_by_design declares.")
    by_design_fraction: float = Field(default=0.0, description="Of all parameter elements.")
    peft: bool = Field(default=False, description="The model is a PEFT model (adapters on a frozen base).")
    loss_has_grad: bool = Field(description="The loss is attached to a graph (loss.requires_grad).",
                                json_schema_extra={"ranks": "all"})
    early_late_ratio: Optional[float] = Field(
        default=None, description="Median grad norm of the first quarter of weight matrices (dim >= 2) "
                                  "over that of the last quarter.")
    min_layer_norm: Optional[float] = Field(default=None, description="Over parameters that got a gradient.")
    max_layer_norm: Optional[float] = None


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
