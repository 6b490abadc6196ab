"""Interventions on the user's model and optimizer that a replay applies for its steps and then undoes.

Each is a context manager: the objects are as they were when it exits (the engine's snapshot restores
weights and optimizer state, but not a param group added or a hook left behind).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
from torch import nn

SQUASH_TOLERANCE = 1e-3


@contextlib.contextmanager
def unfrozen(model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Every parameter trains: requires_grad on, and those the optimizer lacks added as one more param
    group with the first group's hyper-parameters."""
    flags = {p: p.requires_grad for p in model.parameters()}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [p for p in model.parameters() if id(p) not in held]
    for p in flags:
        p.requires_grad_(True)
    if missing:
        optimizer.add_param_group({**{k: v for k, v in optimizer.param_groups[0].items() if k != "params"},
                                   "params": missing})
    try:
        yield
    finally:
        if missing:
            optimizer.param_groups.pop()
            for p in missing:
                optimizer.state.pop(p, None)
        for p, flag in flags.items():
            p.requires_grad_(flag)
            p.grad = None


def unsquash(output: Any) -> Any:
    """The scores a squashed output came from: log of probability rows, logit of values in [0, 1].
    Anything else (raw scores, a structured output) passes through."""
    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.numel() == 0:
        return output
    if output.min() < -SQUASH_TOLERANCE or output.max() > 1 + SQUASH_TOLERANCE:
        return output
    rows_sum_to_one = output.dim() >= 2 and output.shape[-1] >= 2 and bool(
        ((output.sum(-1) - 1).abs() <= 1e-2).all())
    if rows_sum_to_one:
        return torch.log(output.clamp_min(1e-12))
    return torch.logit(output.clamp(1e-6, 1 - 1e-6))


@contextlib.contextmanager
def unsquashed(model: nn.Module) -> Iterator[None]:
    """The model's output is unsquashed (see `unsquash`) before the loss sees it."""
    handle = model.register_forward_hook(lambda module, inputs, output: unsquash(output))
    try:
        yield
    finally:
        handle.remove()


SATURATING = (nn.Sigmoid, nn.Tanh)


def swap_saturating(model: nn.Module) -> int:
    """Replace every Sigmoid and Tanh module inside `model` by a ReLU (in place: for a freshly built
    model, not the user's). Returns how many were replaced. The model's own output layer is left
    alone when it is one (that is the loss's business)."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SATURATING) and child is not _last_module(model):
                setattr(parent, name, nn.ReLU())
                swapped += 1
    return swapped


def _last_module(model: nn.Module) -> Optional[nn.Module]:
    leaves = [m for m in model.modules() if not list(m.children())]
    return leaves[-1] if leaves else None


@contextlib.contextmanager
def held_at_peak(optimizer: torch.optim.Optimizer, trace: Optional[Any]) -> Iterator[float]:
    """Yields the factor that takes the LR from where the schedule is now to its peak (an lr_trace
    outcome). A schedule decayed to exactly 0 is first put back at each group's initial LR."""
    if trace is None or not getattr(trace, "lr_peak", 0) > 0:
        raise ValueError("hold_peak_of names a node that measured no schedule peak")
    saved = [group["lr"] for group in optimizer.param_groups]
    if not saved[0] > 0:
        for group in optimizer.param_groups:
            group["lr"] = group.get("initial_lr") or trace.lr_peak
    try:
        yield float(trace.lr_peak) / float(optimizer.param_groups[0]["lr"])
    finally:
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr
