"""Alternative initialisations of a freshly built model: the counterfactuals for a bad init.

- `default`: every module's own `reset_parameters()` (PyTorch's default init).
- `kaiming`: the default, then He/Kaiming normal (fan-in, ReLU gain) on Linear and Conv weights and
  zero biases: what ReLU-family nets are meant to start from.
- `xavier`: the default, then Xavier/Glorot normal on Linear and Conv weights and zero biases, with the
  gain of the net's saturating activation (5/3 for tanh, 1 for sigmoid): for tanh/sigmoid nets.
- `scaled`: the run's own init (setup() as written) with every weight matrix scaled down; a matrix it left
  constant (all zeros: word2vec's two tables zeroed where one should be drawn), which no scaling moves and
  whose gradient is zero where its partner's is too, drawn uniform within +-1/(its last dim) instead.
Recurrent, attention, embedding and norm layers keep their default init in `kaiming` and `xavier`:
both schemes are defined for feed-forward layers.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

InitKind = Literal["checkpoint", "setup", "default", "kaiming", "xavier", "scaled"]
FEED_FORWARD = (nn.Linear, nn.modules.conv._ConvNd)


@torch.no_grad()
def apply_init(model: nn.Module, kind: InitKind, scale: float = 0.1) -> None:
    """Re-initialise `model` in place ("setup" and "checkpoint" leave it as it is)."""
    if kind in ("checkpoint", "setup"):
        return
    if kind == "scaled":
        for p in model.parameters():
            if p.dim() >= 2 and bool((p == p.reshape(-1)[0]).all()):
                p.uniform_(-1 / p.shape[-1], 1 / p.shape[-1])
            elif p.dim() >= 2:
                p.mul_(scale)
        return
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    if kind == "default":
        return
    gain = nn.init.calculate_gain("tanh") if any(isinstance(m, nn.Tanh) for m in model.modules()) else 1.0
    for module in model.modules():
        if not isinstance(module, FEED_FORWARD):
            continue
        if kind == "kaiming":
            nn.init.kaiming_normal_(module.weight, mode="fan_in", nonlinearity="relu")
        else:
            nn.init.xavier_normal_(module.weight, gain=gain)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
