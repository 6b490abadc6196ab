"""Interventions on the user's model and optimizer that a replay applies for its steps and then undoes.

Each is a context manager: the objects are as they were when it exits (the engine's snapshot restores
weights and optimizer state, but not a param group added or a hook left behind).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Optional

import torch
from torch import nn

SQUASH_TOLERANCE = 1e-3


@contextlib.contextmanager
def unfrozen(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> Iterator[None]:
    """Every parameter trains: requires_grad on, and those the optimizer lacks added as one more param
    group with the first group's hyper-parameters. The run's scheduler is extended to that group as it
    schedules the first (its per-group lists, a LambdaLR's lambdas included); one that still cannot step
    with the new group makes the candidate not applicable (`NotApplicable`, with the scheduler's error)."""
    flags = {p: p.requires_grad for p in model.parameters()}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [p for p in model.parameters() if id(p) not in held]
    for p in flags:
        p.requires_grad_(True)
    extended: list[tuple[Any, str]] = []
    if missing:
        groups = len(optimizer.param_groups)
        optimizer.add_param_group({**{k: v for k, v in optimizer.param_groups[0].items() if k != "params"},
                                   "params": missing})
        extended = _extend_schedule(scheduler, groups)
    try:
        if missing and scheduler is not None:
            _check_steps(scheduler, optimizer)
        yield
    finally:
        for owner, name in extended:
            getattr(owner, name).pop()
        if missing:
            optimizer.param_groups.pop()
            for p in missing:
                optimizer.state.pop(p, None)
        for p, flag in flags.items():
            p.requires_grad_(flag)
            p.grad = None


def _schedulers(scheduler: Any) -> list[Any]:
    """The scheduler and, for SequentialLR / ChainedScheduler, the ones it drives."""
    children = getattr(scheduler, "_schedulers", None) or []
    return [scheduler] + [s for child in children for s in _schedulers(child)]


def _extend_schedule(scheduler: Any, groups: int) -> list[tuple[Any, str]]:
    """Append to each per-group list of the scheduler (one entry per param group: base_lrs, lr_lambdas,
    min_lrs, ...) a copy of the first group's entry, for the group just added. Returns what it appended."""
    if scheduler is None:
        return []
    appended = []
    for s in _schedulers(scheduler):
        for name, value in vars(s).items():
            if (isinstance(value, list) and len(value) == groups and groups > 0
                    and name != "_schedulers" and "milestone" not in name):  # SequentialLR's are not per group
                value.append(value[0])
                appended.append((s, name))
    return appended


def _check_steps(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """One scheduler step with the new group, undone at once; raises NotApplicable if it cannot."""
    from triage.experiments.base import NotApplicable

    state = scheduler.state_dict()
    lrs = [group["lr"] for group in optimizer.param_groups]
    try:
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": this step is undone
            warnings.simplefilter("ignore")
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(float("inf"))
            else:
                scheduler.step()
    except Exception as exc:  # noqa: BLE001 - any failure means the schedule cannot take the new group
        raise NotApplicable(f"the run's {type(scheduler).__name__} cannot schedule the parameters added to the "
                            f"optimizer ({type(exc).__name__}: {exc})") from exc
    finally:
        scheduler.load_state_dict(state)
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr


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
