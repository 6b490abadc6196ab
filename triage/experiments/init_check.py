"""Loss at initialisation: the checkpoint's, setup()'s own fresh init's and PyTorch's default init's
loss against ln(K), the loss of a classifier that guesses uniformly over K classes, and against the loss
of learning nothing (a constant prediction) for any model, regressors and binary classifiers included."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from pydantic import Field

from triage.contract import Setup
from triage.experiments.base import Context, Experiment, Params
from triage.experiments.levels import loss_levels
from triage.experiments.probes import class_targets, labels_unread, linear_layers, mean_loss, model_output
from triage.outcomes.init_check import InitCheckOutcome
from triage.judge.readings import same_init_scheme


class InitCheckParams(Params):
    batches: int = Field(default=4, ge=1, description="Average the loss over the first N snapshot batches.")


def measure(ctx: Context, p: InitCheckParams) -> InitCheckOutcome:
    session = ctx.session
    device = session.device
    batches = session.batches[:p.batches]
    k = None if labels_unread(session) else _num_classes(session.setup, batches[0], device)
    expected = math.log(k) if k else None
    figures, norms, spreads = {}, {}, {}
    for label, setup in (("checkpoint", session.setup), ("setup", None), ("default", None)):
        if setup is None:
            setup = session.fresh_setup(default_init=label == "default")
        figures[label] = (mean_loss(setup, batches, device), _activation_std_growth(setup, batches[0], device))
        norms[label], spreads[label] = _matrix_norm(setup.model), matrix_spreads(setup.model)
        ctx.progress(len(figures), 3)
    ctx.restart()  # the checkpoint model's forwards may have moved BatchNorm statistics

    def ratio(loss: float) -> Optional[float]:
        return loss / expected if expected else None

    nothing = loss_levels(session).nothing_learned

    return InitCheckOutcome(
        num_classes=k, expected_loss=expected,
        loss_checkpoint=figures["checkpoint"][0], loss_setup_init=figures["setup"][0],
        loss_default_init=figures["default"][0],
        checkpoint_ratio=ratio(figures["checkpoint"][0]), setup_init_ratio=ratio(figures["setup"][0]),
        default_init_ratio=ratio(figures["default"][0]),
        setup_init_vs_nothing=figures["setup"][0] / nothing
        if nothing and math.isfinite(figures["setup"][0]) else None,
        activation_std_growth_checkpoint=figures["checkpoint"][1],
        activation_std_growth_setup=figures["setup"][1],
        activation_std_growth_default=figures["default"][1],
        setup_init_is_default=same_scheme(spreads["setup"], spreads["default"]),
        weight_norm_checkpoint=norms["checkpoint"], weight_norm_setup_init=norms["setup"],
        weight_norm_vs_init=norms["checkpoint"] / norms["setup"] if norms["setup"] > 0 else None,
    )


def _num_classes(setup: Setup, batch: Any, device: torch.device) -> Optional[int]:
    """K when the batch carries integer labels and the model outputs K >= 2 scores per example."""
    if class_targets(batch) is None:
        return None
    logits = model_output(setup, batch, device)
    if logits is None or logits.shape[-1] < 2:
        return None
    return int(logits.shape[-1])


@torch.no_grad()
def _matrix_norm(model: torch.nn.Module) -> float:
    norms = [p.detach().float().norm() for p in model.parameters() if p.dim() >= 2]
    return float(torch.stack(norms).norm()) if norms else 0.0


@torch.no_grad()
def matrix_spreads(model: torch.nn.Module) -> dict[str, float]:
    """The standard deviation of each weight matrix (dim >= 2), by name."""
    return {name: float(p.detach().float().std()) for name, p in model.named_parameters() if p.dim() >= 2}


def same_scheme(setup: dict[str, float], default: dict[str, float]) -> Optional[bool]:
    """Every weight matrix's spread at setup()'s init within the judge's tolerance of the default init's (None: nothing to compare:
    no weight matrix, or a layer whose default spread is 0)."""
    if not setup or setup.keys() != default.keys() or not all(v > 0 for v in default.values()):
        return None
    return same_init_scheme([setup[n] / default[n] for n in setup])


@torch.no_grad()
def _activation_std_growth(setup: Setup, batch: Any, device: torch.device) -> Optional[float]:
    """std(output of the last Linear/Conv to run) / std(output of the first), on one batch."""
    stds: list[float] = []

    def spread(module, inputs, out) -> None:
        if out.dim() >= 1 and out.shape[0] > 1:  # a layer run on one example (a PINN's boundary point) has none
            stds.append(float(out.detach().float().std()))

    hooks = [m.register_forward_hook(spread) for _, m in linear_layers(setup.model)]
    try:
        mean_loss(setup, [batch], device)
    finally:
        for h in hooks:
            h.remove()
    if len(stds) < 2 or not stds[0] > 0:
        return None
    return stds[-1] / stds[0]


INIT_LOSS = Experiment(
    name="init_loss",
    summary="Compares the loss at the checkpoint, at setup()'s own init and at PyTorch's default init "
            "with ln(K), and how activations grow with depth at each.",
    params=InitCheckParams,
    outcome=InitCheckOutcome,
    measure=measure,
)
