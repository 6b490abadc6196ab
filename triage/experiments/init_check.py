"""Loss at initialisation: the checkpoint's, setup()'s own fresh init's and PyTorch's default init's
loss against ln(K), the loss of a classifier that guesses uniformly over K classes, and against the loss
of learning nothing (a constant prediction) for any model, regressors and binary classifiers included."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from pydantic import Field

from triage.contract import Setup
from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.levels import loss_levels
from triage.experiments.probes import class_targets, linear_layers, mean_loss, model_output


class InitCheckParams(Params):
    batches: int = Field(default=4, ge=1, description="Average the loss over the first N snapshot batches.")


class InitCheckOutcome(Outcome):
    num_classes: Optional[int] = Field(default=None, description="K, the logits' last dim (classification).")
    expected_loss: Optional[float] = Field(default=None, description="ln K: uniform guessing.")
    loss_checkpoint: float
    loss_setup_init: float = Field(description="Loss with setup()'s own init (setup() called again).")
    loss_default_init: float = Field(description="Loss with every module's reset_parameters().")
    checkpoint_ratio: Optional[float] = Field(default=None, description="loss_checkpoint / ln K.")
    setup_init_ratio: Optional[float] = Field(default=None, description="loss_setup_init / ln K.")
    default_init_ratio: Optional[float] = Field(default=None, description="loss_default_init / ln K.")
    setup_init_vs_nothing: Optional[float] = Field(
        default=None, description="loss_setup_init / the loss of learning nothing (label entropy, binary "
                                  "entropy, target variance): >> 1 is an init that starts far from sane, for "
                                  "models without ln K too.")
    activation_std_growth_checkpoint: Optional[float] = Field(
        default=None, description="Std of the last Linear/Conv output over the first's, at the checkpoint.")
    activation_std_growth_setup: Optional[float] = Field(
        default=None, description="The same at setup()'s init: >> 1 is activations exploding with depth.")
    activation_std_growth_default: Optional[float] = Field(default=None, description="The same at default init.")
    setup_init_is_default: Optional[bool] = Field(
        default=None, description="setup()'s init is PyTorch's default scheme: every weight matrix's spread at "
                                  "setup()'s init within 25% of its spread after reset_parameters(). A restart "
                                  "with the default init is then the run's own init redrawn, a control.")
    weight_norm_checkpoint: float = Field(description="Norm of all the checkpoint's weight matrices (dim >= 2).")
    weight_norm_setup_init: float = Field(description="The same at setup()'s own init.")
    weight_norm_vs_init: Optional[float] = Field(
        default=None, description="weight_norm_checkpoint / weight_norm_setup_init: well below 1 is weights that "
                                  "collapsed since the start (weight decay, say); well above, weights that blew up.")


def measure(ctx: Context, p: InitCheckParams) -> InitCheckOutcome:
    session = ctx.session
    device = session.device
    batches = session.batches[:p.batches]
    k = _num_classes(session.setup, batches[0], device)
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


DEFAULT_SPREAD_TOLERANCE = 1.25  # two draws of one scheme differ by a few %; a custom scheme by 2x or more


def same_scheme(setup: dict[str, float], default: dict[str, float]) -> Optional[bool]:
    """Every weight matrix's spread at setup()'s init within 25% of the default init's (None: nothing to compare:
    no weight matrix, or a layer whose default spread is 0)."""
    if not setup or setup.keys() != default.keys() or not all(v > 0 for v in default.values()):
        return None
    return all(1 / DEFAULT_SPREAD_TOLERANCE <= setup[n] / default[n] <= DEFAULT_SPREAD_TOLERANCE for n in setup)


@torch.no_grad()
def _activation_std_growth(setup: Setup, batch: Any, device: torch.device) -> Optional[float]:
    """std(output of the last Linear/Conv to run) / std(output of the first), on one batch."""
    stds: list[float] = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: stds.append(float(out.detach().float().std())))
             for _, m in linear_layers(setup.model)]
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
