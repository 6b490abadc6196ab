"""Alternative initialisations of a freshly built model: the counterfactuals for a bad init.

- `default`: every module's own `reset_parameters()` (PyTorch's default init).
- `kaiming`: the default, then He/Kaiming normal (fan-in, ReLU gain) on Linear and Conv weights and
  zero biases: what ReLU-family nets are meant to start from.
- `xavier`: the default, then Xavier/Glorot normal on Linear and Conv weights and zero biases, with the
  gain of the net's saturating activation (5/3 for tanh, 1 for sigmoid): for tanh/sigmoid nets.
- `scaled`: the run's own init (setup() as written) with every weight matrix scaled down; a matrix it left
  constant whose gradient at that init cannot tell its rows apart (word2vec's two tables both zeroed: no
  gradient at all), which neither scaling nor training moves out of symmetry, drawn uniform within
  +-1/(its last dim) instead. A zero matrix whose rows do get different gradients (LoRA's B, a residual
  branch's output projection zeroed on purpose) is the run's design, and is kept.
Recurrent, attention, embedding and norm layers keep their default init in `kaiming` and `xavier`:
both schemes are defined for feed-forward layers.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

InitKind = Literal["checkpoint", "setup", "default", "kaiming", "xavier", "scaled"]
FEED_FORWARD = (nn.Linear, nn.modules.conv._ConvNd)


@torch.no_grad()
def apply_init(model: nn.Module, kind: InitKind, scale: float = 0.1, stuck: frozenset[int] = frozenset()) -> None:
    """Re-initialise `model` in place ("setup" and "checkpoint" leave it as it is). `stuck`: for `scaled`, the
    ids of the constant matrices to draw afresh (`stuck_constants`)."""
    if kind in ("checkpoint", "setup"):
        return
    if kind == "scaled":
        for p in model.parameters():
            if id(p) in stuck:
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


def stuck_constants(setup: Any, batch: Any, device: torch.device) -> frozenset[int]:
    """The ids of the trainable weight matrices of a fresh `setup` that are constant and whose gradient on
    `batch` is the same in every row (zero included): symmetric, and kept so by training."""
    from triage.experiments.training import autocast, untouched_buffers_and_rng

    constant = [p for p in setup.model.parameters()
                if p.requires_grad and p.dim() >= 2 and bool((p == p.reshape(-1)[0]).all())]
    if not constant:
        return frozenset()
    with untouched_buffers_and_rng(setup.model), autocast(setup.precision, device):
        loss = setup.loss_fn(setup.model, batch)
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return frozenset(id(p) for p in constant)  # no gradient reaches any of them
    grads = torch.autograd.grad(loss, constant, allow_unused=True)
    return frozenset(id(p) for p, g in zip(constant, grads) if g is None or _rows_alike(g))


def _rows_alike(grad: torch.Tensor) -> bool:
    """Every row of the gradient the same (zero included); a one-row matrix only where its gradient is zero (a
    zeroed Linear(d, 1) head gets a gradient and is kept)."""
    grad = (grad.to_dense() if grad.is_sparse else grad).float()
    if grad.shape[0] < 2:
        return bool((grad == 0).all())
    return bool((grad - grad[:1]).abs().max() <= 1e-6 * grad.abs().max())
