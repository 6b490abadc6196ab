"""Activation health: dead rectifier units, saturated sigmoid/tanh outputs, and how the spread grows.

Forward passes only (no gradient) over the first snapshot batches, through the run's own
`loss_fn`, with the model in train mode as the reference loop trains it. Train mode lets BatchNorm
update its running statistics, so every buffer is copied before and put back after.

What is seen: the outputs of activation *modules* (nn.ReLU, nn.GELU, nn.Sigmoid, ...). A model
that applies its activations functionally (`F.relu(x)` inside forward) shows no layers here
(`hooked_layers == 0`); reading Linear/Conv outputs as pre-activations instead was left out,
because which function follows them is unknown.

A unit is one feature: dim 1 (channels) of a 3-D+ output that follows a convolution or a
channel norm (BatchNorm, GroupNorm, InstanceNorm), else the last dim (a Linear's features, also
for (batch, time, features) sequences). A rectifier unit is dead when it is never > 0 for any
example and position of the batches checked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from pydantic import Field
from torch import nn

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.places import module_place
from triage.experiments.training import autocast
from triage.views import Bars
from triage.outcomes.activations import ActivationOutcome, LayerHealth
from triage.judge.readings import SATURATED

SMOOTH_RECTIFIERS = (nn.LeakyReLU, nn.PReLU, nn.ELU, nn.CELU, nn.SELU, nn.GELU, nn.SiLU, nn.Mish, nn.Hardswish)
# Units that pass no gradient while never above zero: only these can die. The smooth rectifiers keep
# a gradient below zero, so theirs are watched for spread but never counted dead.
RECTIFIERS = (nn.ReLU, nn.ReLU6)
SQUASHERS = (nn.Sigmoid, nn.Tanh)
# Layers whose 3-D+ outputs put features on dim 1; any other layer puts them last.
CHANNELS_FIRST = (nn.modules.conv._ConvNd, nn.modules.batchnorm._BatchNorm, nn.GroupNorm,
                  nn.modules.instancenorm._InstanceNorm)
FEATURE_LAYERS = CHANNELS_FIRST + (nn.Linear, nn.Bilinear, nn.LayerNorm, nn.Embedding)
log = logging.getLogger(__name__)



class ActivationParams(Params):
    batches: int = Field(default=8, ge=1, description="Snapshot batches to pass forward.")


@dataclass
class _Tally:
    """Running sums for one activation call site over all batches."""

    kind: str
    rectifier: bool
    units: int = 0
    ever_active: Optional[torch.Tensor] = None  # (units,) bool
    saturated: int = 0
    total: int = 0
    sum: float = 0.0
    sum_sq: float = 0.0

    def add(self, y: torch.Tensor, unit_dim: int) -> None:
        y = y.detach()
        self.units = self.units or y.shape[unit_dim]
        self.total += y.numel()
        self.sum += float(y.sum(dtype=torch.float64))
        self.sum_sq += float(torch.linalg.vector_norm(y, dtype=torch.float64)) ** 2
        if self.rectifier:
            # (units,): was the unit > 0 anywhere (any example, any position)
            active = (y > 0).movedim(unit_dim, 0).reshape(y.shape[unit_dim], -1).any(dim=1)
            if self.ever_active is None:
                self.ever_active = active
            elif self.ever_active.shape == active.shape:
                self.ever_active |= active
            else:  # the feature count changed between batches: count the first shape's units only
                log.debug("activation with %d units, then %d: kept the first", self.units, len(active))
                return
        elif self.kind == "Sigmoid":
            self.saturated += int(((y < 1 - SATURATED) | (y > SATURATED)).sum())
        elif self.kind == "Tanh":
            self.saturated += int((y.abs() > SATURATED).sum())

    @property
    def squasher(self) -> bool:
        return self.kind in ("Sigmoid", "Tanh")

    def health(self, name: str) -> LayerHealth:
        mean = self.sum / max(self.total, 1)
        var = max(self.sum_sq / max(self.total, 1) - mean * mean, 0.0)
        return LayerHealth(
            name=name, kind=self.kind, units=self.units, std=var ** 0.5,
            dead_fraction=1.0 - float(self.ever_active.float().mean()) if self.rectifier else None,
            saturated_fraction=self.saturated / self.total if self.squasher and self.total else None,
        )


class _Watch:
    """Forward hooks: activation outputs into tallies, and which kind of feature layer ran last."""

    def __init__(self, model: nn.Module):
        self.tallies: dict[tuple[str, int], _Tally] = {}  # (name, call) -> tally, in first-run order
        self.calls: dict[str, int] = {}
        self.channels_first = False
        self.handles = []
        for name, module in model.named_modules():
            if isinstance(module, RECTIFIERS + SMOOTH_RECTIFIERS + SQUASHERS):
                self.handles.append(module.register_forward_hook(self._activation(name)))
            elif isinstance(module, FEATURE_LAYERS):
                self.handles.append(module.register_forward_hook(self._feature_layer))

    def _feature_layer(self, module, args, output) -> None:
        self.channels_first = isinstance(module, CHANNELS_FIRST)

    def _activation(self, name: str):
        def hook(module, args, output):
            if not isinstance(output, torch.Tensor) or output.numel() == 0:
                return
            call = self.calls.get(name, 0)
            self.calls[name] = call + 1
            key = (name, call)
            if key not in self.tallies:
                self.tallies[key] = _Tally(type(module).__name__, isinstance(module, RECTIFIERS))
            unit_dim = 1 if output.dim() >= 3 and self.channels_first else output.dim() - 1
            self.tallies[key].add(output, unit_dim)
        return hook

    def new_forward(self) -> None:
        self.calls.clear()
        self.channels_first = False

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def measure(ctx: Context, p: ActivationParams) -> ActivationOutcome:
    session = ctx.session
    setup = session.setup
    model = setup.model
    batches = session.batches[:p.batches]
    watch = _Watch(model)
    try:
        model.train()
        with torch.no_grad(), autocast(setup.precision, session.device):
            for i, batch in enumerate(batches):
                watch.new_forward()
                setup.loss_fn(model, batch)
                ctx.progress(i + 1, len(batches))
    finally:
        watch.remove()
        ctx.restart()  # the train-mode forwards moved BatchNorm statistics; put back modes too
    layers = [t.health(name if call == 0 else f"{name}#{call + 1}") for (name, call), t in watch.tallies.items()]
    outcome = _summarise(layers, len(batches))
    place = module_place(model, outcome.worst_layer)
    return outcome.model_copy(update={"worst_layer_type": place.type, "worst_layer_previous": place.previous,
                                      "worst_layer_previous_type": place.previous_type})


def _summarise(layers: list[LayerHealth], batches: int) -> ActivationOutcome:
    rectifiers = [h for h in layers if h.dead_fraction is not None]
    squashers = [h for h in layers if h.saturated_fraction is not None]
    units = sum(h.units for h in rectifiers)
    worst = max(rectifiers, key=lambda h: h.dead_fraction, default=None) or \
        max(squashers, key=lambda h: h.saturated_fraction, default=None)
    return ActivationOutcome(
        batches_checked=batches, layers=layers, hooked_layers=len(layers), relu_layers=len(rectifiers),
        max_dead_fraction=max((h.dead_fraction for h in rectifiers), default=None),
        mean_dead_fraction=sum(h.dead_fraction * h.units for h in rectifiers) / units if units else None,
        worst_layer=worst.name if worst else None,
        max_saturated_fraction=max((h.saturated_fraction for h in squashers), default=None),
        std_growth=layers[-1].std / layers[0].std if len(layers) >= 2 and layers[0].std > 0 else None,
    )


ACTIVATION_HEALTH = Experiment(
    name="activation_health",
    summary="Forward passes over snapshot batches: the fraction of dead ReLU-family units and of "
            "saturated sigmoid/tanh outputs per activation layer, and how their spread grows with depth.",
    params=ActivationParams,
    outcome=ActivationOutcome,
    views=(Bars(title="Dead units per layer", field="layers", value="dead_fraction", labels="name",
                axis_label="fraction of units never active", limit=(0.0, 1.0), highlight_above=0.5,
                caption="Red: more than half of the layer's units never fired."),),
    measure=measure,
)
