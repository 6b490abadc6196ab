"""Curvature at the checkpoint: the top eigenvalue of the loss Hessian (the sharpness), set against the
largest a step of this optimizer at this LR can take and stay stable.

Gradient descent on a quadratic is stable while sharpness < 2/lr; heavy-ball momentum beta moves the edge
to 2(1+beta)/lr. Adam's steps are preconditioned by P = diag(sqrt(v_hat) + eps), so what counts is the
top eigenvalue of P^-1 H, stable below (2 + 2 beta1) / ((1 - beta1) lr) (38/lr at beta1 = 0.9; Cohen et
al., "Adaptive gradient methods at the edge of stability"). `edge_ratio` > 1 says the run's LR is past the
edge at the checkpoint: a too-high LR, a warmup peak, or a sharp region an init or a batch led into.
`stable_lr_scale` is the factor of the LR that would sit at the edge (each LR candidate's own ratio is
edge_ratio x its lr_scale).

Power iteration on Hessian-vector products (double backward), on the first few snapshot batches, from a
seeded random vector; for Adam on the symmetric P^-1/2 H P^-1/2.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, NotApplicable, Params
from triage.experiments.training import current_lr, trainable
from triage.views import Curve
from triage.outcomes.curvature import CurvatureOutcome


class CurvatureParams(Params):
    iterations: int = Field(default=20, ge=2, le=500, description="Power-iteration steps (Hessian-vector products).")
    batches: int = Field(default=2, ge=1, description="Snapshot batches the loss is averaged over.")
    tolerance: float = Field(default=1e-3, gt=0, description="Stop once the estimate moves less than this share.")


def measure(ctx: Context, p: CurvatureParams) -> CurvatureOutcome:
    setup = ctx.session.setup
    params = trainable(setup.model)
    if not params:
        raise NotApplicable("the model has no trainable parameter")
    edge, scale = _edge(setup.optimizer, params)
    batches = ctx.session.batches[:p.batches]
    generator = torch.Generator().manual_seed(0)
    v = [torch.randn(q.shape, generator=generator).to(q.device, q.dtype) for q in params]
    v = _normalised(v)
    estimates: list[float] = []
    setup.model.train()
    for i in range(p.iterations):
        hv = _hvp(setup, batches, params, [u * s for u, s in zip(v, scale)] if scale else v)
        if scale:
            hv = [h * s for h, s in zip(hv, scale)]
        estimate = float(sum((a * b).sum() for a, b in zip(v, hv)))
        estimates.append(estimate)
        ctx.progress(i + 1, p.iterations)
        norm = math.sqrt(float(sum((h * h).sum() for h in hv)))
        if not math.isfinite(norm) or norm == 0:
            break
        v = [h / norm for h in hv]
        if len(estimates) > 1 and abs(estimates[-1] - estimates[-2]) <= p.tolerance * abs(estimates[-1]):
            break
    setup.optimizer.zero_grad(set_to_none=True)
    sharpness = estimates[-1] if estimates and math.isfinite(estimates[-1]) else None
    lr = current_lr(setup.optimizer)
    ratio = sharpness / edge if sharpness is not None and edge else None
    return CurvatureOutcome(
        sharpness=sharpness, estimates=estimates, preconditioned=scale is not None, lr=lr, edge=edge,
        edge_ratio=ratio, stable_lr_scale=1 / ratio if ratio and ratio > 0 else None,
        converged=len(estimates) > 1 and abs(estimates[-1] - estimates[-2]) <= p.tolerance * abs(estimates[-1]))


def _edge(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[Optional[float], Optional[list]]:
    """The stability edge at the current LR, and for Adam the per-element scale P^-1/2 (None otherwise)."""
    group = optimizer.param_groups[0]
    lr = float(group.get("lr") or 0.0)
    if lr <= 0:
        return None, None
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        beta1 = float(group["betas"][0])
        scale = [_inverse_sqrt_preconditioner(optimizer, q, group) for q in params]
        if any(s is None for s in scale):  # no second moments yet (a run at step 0): plain H
            return None, None
        return (2 + 2 * beta1) / ((1 - beta1) * lr), scale
    if isinstance(optimizer, torch.optim.SGD):
        return 2 * (1 + float(group.get("momentum") or 0.0)) / lr, None
    return None, None


def _inverse_sqrt_preconditioner(optimizer, param, group) -> Optional[torch.Tensor]:
    state = optimizer.state.get(param, {})
    if "exp_avg_sq" not in state or "step" not in state:
        return None
    step = float(state["step"])
    v_hat = state["exp_avg_sq"] / (1 - group["betas"][1] ** step)
    return (v_hat.sqrt() + group["eps"]).rsqrt()


def _hvp(setup, batches, params, v) -> list[torch.Tensor]:
    with _twice_differentiable_attention():
        return _hvp_of(setup, batches, params, v)


def _twice_differentiable_attention():
    """Attention through its math kernel: the fused ones (flash, memory-efficient) have no double backward."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch before 2.3: one kernel choice of its own
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


def _hvp_of(setup, batches, params, v) -> list[torch.Tensor]:
    loss = sum(setup.loss_fn(setup.model, b) for b in batches) / len(batches)
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    grads = [g if g is not None else torch.zeros_like(q) for g, q in zip(grads, params)]
    dot = sum((g * u).sum() for g, u in zip(grads, v))
    try:
        hv = torch.autograd.grad(dot, params, allow_unused=True)
    except RuntimeError as exc:  # an op with no second derivative (ctc_loss's backward has none)
        if "not implemented" not in str(exc):
            raise
        raise NotApplicable(f"the loss has no second derivative to measure curvature with: {exc}") from None
    return [h.detach() if h is not None else torch.zeros_like(q) for h, q in zip(hv, params)]


def _normalised(v: list[torch.Tensor]) -> list[torch.Tensor]:
    norm = math.sqrt(float(sum((u * u).sum() for u in v)))
    return [u / norm for u in v]


CURVATURE = Experiment(
    name="curvature",
    summary="The top eigenvalue of the loss Hessian at the checkpoint (preconditioned for Adam), by power "
            "iteration on Hessian-vector products, against the edge of stability of the run's optimizer and LR.",
    params=CurvatureParams,
    outcome=CurvatureOutcome,
    measure=measure,
    views=(Curve(title="Sharpness (top Hessian eigenvalue) by power-iteration step", field="estimates",
                 xlabel="power-iteration step", ylabel="sharpness", threshold="edge",
                 threshold_label="edge of stability at the run's LR"),),
)
