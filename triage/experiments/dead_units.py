"""Reviving dead ReLU units: the counterfactual fix for `dead_relu`.

A unit is dead when its ReLU output is never above zero on the snapshot (as activation_health counts
it). Its producer is the Linear or Conv layer that ran last before that ReLU in the forward; a norm
layer (BatchNorm, LayerNorm, ...) between them is part of the path. Reviving a unit re-initialises its
producer's row (the weights and bias of that output feature) as the layer's default init would, resets
the norm's scale and shift for that feature to 1 and 0, and clears the optimizer's moments of those
rows. Everything else keeps the checkpoint's values, so a run that then learns was held back by its
dead units and nothing else.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from triage.experiments.activations import CHANNELS_FIRST, RECTIFIERS
from triage.experiments.training import autocast, untouched_buffers_and_rng

PRODUCERS = (nn.Linear, nn.modules.conv._ConvNd)
NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)


@dataclass
class _Site:
    """One ReLU call site and the layers that fed it."""

    producer: nn.Module
    norm: Optional[nn.Module]
    ever_active: Optional[torch.Tensor] = None  # (units,) bool


def find_dead_units(setup: Any, batches: list[Any], device: torch.device) -> list[tuple[nn.Module, Optional[nn.Module], torch.Tensor]]:
    """(producer, norm between, dead mask over its output features) for each ReLU with dead units whose
    producer is known. Forward passes only; BatchNorm statistics and RNG are left as they were."""
    model = setup.model
    sites: dict[int, _Site] = {}
    last: dict[str, Optional[nn.Module]] = {"producer": None, "norm": None}

    def on_layer(module, inputs, output):
        if isinstance(module, PRODUCERS):
            last["producer"], last["norm"] = module, None
        elif isinstance(module, NORMS):
            last["norm"] = module

    def on_relu(module, inputs, output):
        producer = last["producer"]
        if producer is None or not isinstance(output, torch.Tensor):
            return
        unit_dim = 1 if output.dim() >= 3 and isinstance(producer, CHANNELS_FIRST) else output.dim() - 1
        units = _out_features(producer)
        if output.shape[unit_dim] != units:
            return  # not the producer's features (a reshape in between): leave it alone
        site = sites.setdefault(id(module), _Site(producer, last["norm"]))
        active = (output > 0).movedim(unit_dim, 0).reshape(units, -1).any(dim=1)
        site.ever_active = active if site.ever_active is None else site.ever_active | active

    handles = [m.register_forward_hook(on_relu if isinstance(m, RECTIFIERS) else on_layer)
               for m in model.modules() if isinstance(m, RECTIFIERS + PRODUCERS + NORMS)]
    was_training = model.training
    try:
        model.train()
        with untouched_buffers_and_rng(model), torch.no_grad(), autocast(setup.precision, device):
            for batch in batches:
                last["producer"] = last["norm"] = None
                setup.loss_fn(model, batch)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return [(s.producer, s.norm, ~s.ever_active) for s in sites.values()
            if s.ever_active is not None and not bool(s.ever_active.all())]


@torch.no_grad()
def revive(dead: list[tuple[nn.Module, Optional[nn.Module], torch.Tensor]],
           optimizer: torch.optim.Optimizer) -> int:
    """Re-initialise the dead units' rows in place; returns how many units were revived."""
    revived = 0
    for producer, norm, mask in dead:
        fresh = copy.deepcopy(producer)
        fresh.reset_parameters()
        rows = mask.nonzero().squeeze(1)
        for name in ("weight", "bias"):
            param = getattr(producer, name, None)
            if param is None:
                continue
            param[rows] = getattr(fresh, name)[rows].to(param.dtype)
            _clear_moments(optimizer, param, rows)
        if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape[0] == mask.numel():
            norm.weight[rows] = 1.0
            norm.bias[rows] = 0.0
            _clear_moments(optimizer, norm.weight, rows)
            _clear_moments(optimizer, norm.bias, rows)
        revived += int(mask.sum())
    return revived


def _clear_moments(optimizer: torch.optim.Optimizer, param: torch.Tensor, rows: torch.Tensor) -> None:
    for value in optimizer.state.get(param, {}).values():
        if isinstance(value, torch.Tensor) and value.shape == param.shape:
            value[rows] = 0


def _out_features(layer: nn.Module) -> int:
    return layer.out_features if isinstance(layer, nn.Linear) else layer.out_channels
