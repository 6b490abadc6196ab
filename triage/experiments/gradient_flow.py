"""Gradient flow: one forward/backward at the checkpoint weights, the gradient each parameter gets.

Answers "which parameters should train but cannot": no gradient reaches them (a detached graph),
requires_grad is off (frozen), or the optimizer does not hold them; and whether gradients vanish
with depth (early weight matrices' norms against late ones'). Where the loss has auxiliary terms
(Setup.auxiliary_terms), also which parameters only those terms reach, and whether the objective reads
them all the same (a router whose choice is an argmax, trained by its load-balancing term alone).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.by_design import frozen_by_design, is_peft
from triage.experiments.training import autocast, loss_value, untouched_buffers_and_rng
from triage.batches import named_tensors
from triage.judge.named import OBJECTIVE_READS
from triage.load.loss_terms import dict_terms, read_as_auxiliary, scaled_terms, terms_of
from triage.views import Bars
from triage.outcomes.gradient_flow import GradientFlowOutcome, ParamGradNorm


# The parameters the objective's gradient misses are moved by a tenth of their own size (root mean square) to see
# whether the objective reads them at all: enough to flip an argmax near its edge, small beside training's moves.
PERTURBATION = 0.1


class GradientFlowParams(Params):
    batches: int = Field(default=1, ge=1, description="Snapshot batches to average the gradient over.")


def measure(ctx: Context, p: GradientFlowParams) -> GradientFlowOutcome:
    session = ctx.session
    setup = session.setup
    model = setup.model
    batches = session.batches[:p.batches]
    model.train()  # as the reference loop trains
    reach = _objective_reach(session, batches) if terms_of(setup) is not None else None
    # Unnamed terms: each term's reach measured before the main pass, as the named ones' is (the same masks).
    # One process only: a backward that leaves some parameters without a gradient stalls DDP's reduction.
    unnamed = {} if reach is not None or ctx.ranks.distributed else _reach_without_each(session, batches)
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
    outcome = _summarise(model, setup.optimizer, float(np.mean(losses)), loss_has_grad,
                         frozen_by_design(model, setup.optimizer, setup.frozen_by_design))
    if unnamed:
        return outcome.model_copy(update=_alone_trained(session, outcome, unnamed))
    if reach is None:
        return outcome
    return outcome.model_copy(update={**_missed_by_objective(session, outcome, *reach), "auxiliary_declared": True})


def _reach_without_each(session, batches: list) -> dict[str, dict[str, Optional[float]]]:
    """Where loss_fn returns several terms and Setup.auxiliary_terms names none (and one optimizer trains them
    all): for each term, every parameter's gradient norm from the other terms alone."""
    setup = session.setup
    with untouched_buffers_and_rng(setup.model):
        names = dict_terms(setup, setup.model, batches[0])
    reach = {}
    for name in names:
        with read_as_auxiliary(setup, (name,)):
            reach[name] = _objective_reach(session, batches)[0]
    return reach


def _alone_trained(session, outcome: GradientFlowOutcome, reach: dict[str, dict[str, Optional[float]]]) -> dict:
    """Each unnamed term read in turn as the auxiliary one: the term that alone trains the largest share of the
    weights the other terms read (their value moves when those weights move), reported as if named, with
    whether the other terms' gradient reaches any weight of a module that reads the batch's inputs (where it
    reaches none, everything it trains sits after a step that passes no gradient: a quantizer without its
    straight-through estimator)."""
    found, found_norms = {}, {}
    for name, norms in reach.items():
        with read_as_auxiliary(session.setup, (name,)):
            missed = _missed_by_objective(session, outcome, norms, (name,))
        reads = missed["objective_shift"] is not None and missed["objective_shift"] > OBJECTIVE_READS
        if reads and missed["objective_missed_fraction"] > found.get("objective_missed_fraction", 0.0):
            found, found_norms = missed, norms
    if not found:
        return {}
    readers = _input_readers(session)
    reaches = any(found_norms.get(n) is not None for n in readers) if readers else None
    return {**found, "objective_reaches_input": reaches, "auxiliary_declared": False}


def _input_readers(session) -> list[str]:
    """The parameters of the modules handed a tensor of the first batch as it is (equal in shape and values:
    the loss may be handed a guarded copy) in a forward."""
    setup, batch = session.setup, session.batches[0]
    inputs = [t for _, t in named_tensors(batch)]

    def is_input(a: object) -> bool:
        return isinstance(a, torch.Tensor) and any(a.shape == t.shape and a.dtype == t.dtype
                                                   and torch.equal(a, t.to(a.device)) for t in inputs)

    readers: list[str] = []

    def pre_hook(name):
        def hook(module, args):
            if any(is_input(a) for a in args):
                readers.extend(f"{name}.{n}" if name else n for n, _ in module.named_parameters(recurse=False))
        return hook

    handles = [m.register_forward_pre_hook(pre_hook(name)) for name, m in setup.model.named_modules()]
    try:
        with torch.no_grad(), untouched_buffers_and_rng(setup.model):
            setup.loss_fn(setup.model, batch)
    except Exception:  # noqa: BLE001 - not read: the rule cannot fire on it
        return []
    finally:
        for handle in handles:
            handle.remove()
    return readers


def _objective_reach(session, batches: list) -> tuple[dict[str, Optional[float]], tuple[str, ...]]:
    """Each parameter's gradient norm from the objective alone (the auxiliary terms weighted 0)."""
    setup = session.setup
    setup.optimizer.zero_grad(set_to_none=True)
    with scaled_terms(setup, 0.0), untouched_buffers_and_rng(setup.model):  # the main pass draws the same masks
        for batch in batches:
            with autocast(setup.precision, session.device):
                loss = setup.loss_fn(setup.model, batch)
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                (loss / len(batches)).backward()
    norms = {n: _grad_norm(q) for n, q in setup.model.named_parameters()}
    return norms, terms_of(setup).auxiliary


def _missed_by_objective(session, outcome: GradientFlowOutcome, objective_norms: dict[str, Optional[float]],
                         auxiliary: tuple[str, ...]) -> dict:
    """Trainable parameters the whole loss's gradient reaches and the objective's does not, and how much the
    objective's value moves when they move (it may read them through a step that passes no gradient: an
    argmax, an index, a .detach())."""
    full = {r.name: r.norm for r in outcome.layer_norms}
    params = dict(session.setup.model.named_parameters())
    trainable = {n for n in full if n not in outcome.no_grad and n not in outcome.frozen
                 and n not in outcome.not_in_optimizer and n not in outcome.by_design}
    # No path from the objective at all (grad None), not a zero through an intact path (units that never fire)
    missed = [n for n in full if n in trainable and full[n] > 0 and objective_norms.get(n) is None]
    size = sum(params[n].numel() for n in trainable) or 1
    return {"auxiliary_terms": list(auxiliary), "objective_missed": missed,
            "objective_missed_fraction": sum(params[n].numel() for n in missed) / size,
            "objective_shift": _objective_shift(session, [params[n] for n in missed]) if missed else None}


def _objective_shift(session, params: list[torch.nn.Parameter]) -> Optional[float]:
    """|objective after - before| / |before| on the first batch, in eval mode, with `params` moved by a tenth of
    their own size in random directions (then put back)."""
    setup = session.setup
    model, batch = setup.model, session.batches[0]
    saved = [q.detach().clone() for q in params]
    generator = torch.Generator().manual_seed(session.seed)
    was_training = model.training
    model.eval()  # no dropout: the same forward twice gives the same value
    try:
        with torch.no_grad(), untouched_buffers_and_rng(model), autocast(setup.precision, session.device):
            before = loss_value(setup.loss_fn(model, batch))
            for q in params:
                size = float(q.detach().float().pow(2).mean().sqrt()) or 1e-2
                noise = torch.randn(q.shape, generator=generator).to(q.device, q.dtype)
                q.add_(noise * (PERTURBATION * size))
            after = loss_value(setup.loss_fn(model, batch))
    except Exception:  # noqa: BLE001 - a loss that needs train mode, weights that take no add_: not measured
        return None
    finally:
        with torch.no_grad():
            for q, value in zip(params, saved):
                q.copy_(value)
        model.train(was_training)
    if not (np.isfinite(before) and np.isfinite(after)) or before == 0:
        return None
    return abs(after - before) / abs(before)


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
