"""Small torch helpers shared by the experiments: autocast, norms, LR scaling, batch slicing."""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Any, Iterator, Optional

import numpy as np
import torch

from triage.contract import autocast  # noqa: F401 - the experiments take it from here
from triage.load.snapshot import untouched_buffers_and_rng  # noqa: F401 - the experiments take it from here

_TORCH_CLIP = torch.nn.utils.clip_grad_norm_  # torch's own, even while a replay replaces the loop's calls of it


def grad_scaler(setup: Any, precision: str, device: torch.device) -> Any:
    """A GradScaler for fp16 on CUDA, as an AMP run would have (the run's own when it had one)."""
    if precision != "fp16" or device.type != "cuda":
        return None
    return setup.scaler if setup.scaler is not None else torch.amp.GradScaler("cuda")


def probe_scaler(scaler: Any, device: torch.device) -> Any:
    """A GradScaler for one backward that steps nothing (a probe of a batch's gradient): at the run's scale,
    with none of the run's per-step state (a second unscale_() before an update() raises)."""
    if scaler is None:
        return None
    return torch.amp.GradScaler(device.type, init_scale=scaler.get_scale())


def forward_backward(setup: Any, batch: Any, precision: str, clip: Optional[float], scaler: Any,
                     device: torch.device, params: list[torch.nn.Parameter]) -> tuple[float, float]:
    """The reference loop's step up to the update: zero_grad, forward under autocast, backward
    (scaled and unscaled under a GradScaler), clip. Returns the loss and the pre-clip grad norm."""
    setup.optimizer.zero_grad(set_to_none=True)
    with autocast(precision, device):
        loss = setup.loss_fn(setup.model, batch)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(setup.optimizer)
    else:
        loss.backward()
    return loss_value(loss), clip_grads(params, clip)


def optimizer_step(setup: Any, scaler: Any, lr_scale: float = 1.0) -> None:
    with scaled_lr(setup.optimizer, lr_scale):
        if scaler is not None:
            scaler.step(setup.optimizer)
            scaler.update()
        else:
            setup.optimizer.step()


def reference_step(setup: Any, batch: Any, precision: str, clip: Optional[float], scaler: Any,
                   device: torch.device, params: list[torch.nn.Parameter],
                   lr_scale: float = 1.0) -> tuple[float, float]:
    """One whole step of the reference loop; a non-finite gradient norm skips the update.
    An optimizer whose step needs a closure (LBFGS) is handed one that does the same forward-backward."""
    if needs_closure(setup.optimizer):
        return _closure_step(setup, batch, precision, clip, device, params, lr_scale)
    loss, norm = forward_backward(setup, batch, precision, clip, scaler, device, params)
    if scaler is not None or math.isfinite(norm):  # a scaler skips inf steps itself
        optimizer_step(setup, scaler, lr_scale)
    return loss, norm


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """step() takes a closure it cannot do without (LBFGS re-evaluates the loss several times a step)."""
    try:
        closure = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return closure is not None and closure.default is inspect.Parameter.empty


def _closure_step(setup: Any, batch: Any, precision: str, clip: Optional[float], device: torch.device,
                  params: list[torch.nn.Parameter], lr_scale: float) -> tuple[float, float]:
    """The step of a closure optimizer: its loss and pre-clip norm are those of the closure's first call
    (the weights the step starts from), as for every other optimizer. No GradScaler: LBFGS has none."""
    first: list[tuple[float, float]] = []

    def closure() -> torch.Tensor:
        setup.optimizer.zero_grad(set_to_none=True)
        with torch.enable_grad(), autocast(precision, device):
            loss = setup.loss_fn(setup.model, batch)
        loss.backward()
        norm = clip_grads(params, clip)
        if not first:
            first.append((loss_value(loss), norm))
        return loss

    with scaled_lr(setup.optimizer, lr_scale):
        setup.optimizer.step(closure)
    return first[0] if first else (math.nan, math.nan)


def clip_grads(params: list[torch.nn.Parameter], max_norm: Optional[float]) -> float:
    """clip_grad_norm_ (None: measure only) that also takes sparse gradients (an Embedding(sparse=True)
    under SparseAdam), which torch's own refuses. Returns the pre-clip global norm."""
    if not params:
        return 0.0
    if not any(p.grad is not None and p.grad.is_sparse for p in params):
        return float(_TORCH_CLIP(params, max_norm if max_norm is not None else float("inf")))
    norm = grad_norm(params)
    if max_norm is not None and math.isfinite(norm) and norm > max_norm:
        factor = max_norm / (norm + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(factor)  # in place, sparse or dense
    return norm




def scored_loss(setup: Any, batch: Any) -> Any:
    """loss_fn(model, batch) as a validation pass scores it: in eval mode (no dropout, BatchNorm's running
    statistics). A model that returns its losses only in train mode (torchvision's detection models return
    boxes in eval mode, and a loss_fn that reads their loss dict raises) is scored in train mode instead, its
    buffers and RNG left as they were. Call it under no_grad."""
    was_training = setup.model.training
    setup.model.eval()
    try:
        return setup.loss_fn(setup.model, batch)
    except Exception as in_eval:
        setup.model.train()
        try:
            with untouched_buffers_and_rng(setup.model):
                return setup.loss_fn(setup.model, batch)
        except Exception:
            raise in_eval from None
    finally:
        setup.model.train(was_training)


def loss_value(loss: Any) -> float:
    return float(loss.detach().float().item()) if isinstance(loss, torch.Tensor) else float(loss)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    """Global L2 norm of the gradients present (0.0 when none)."""
    norms = [_dense_values(p.grad).float().norm() for p in params if p.grad is not None]
    return float(torch.stack(norms).norm().item()) if norms else 0.0


def _dense_values(grad: torch.Tensor) -> torch.Tensor:
    return grad.detach().coalesce().values() if grad.is_sparse else grad.detach()


def param_vector_norm(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(torch.stack([p.detach().float().norm() for p in model.parameters()]).norm().item())


@contextlib.contextmanager
def scaled_lr(optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
    """Multiply every group's learning rate by `factor` for the steps taken inside, then put it back.

    Applied around each optimizer step rather than to the schedule itself: every scheduler (LambdaLR,
    OneCycleLR, SequentialLR with its children, ...) then computes the LR as it would, and the step
    uses that LR times `factor`.
    """
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr


def scale_weight_decay(optimizer: torch.optim.Optimizer, factor: float) -> None:
    for group in optimizer.param_groups:
        if isinstance(group.get("weight_decay"), (int, float)):
            group["weight_decay"] = group["weight_decay"] * factor


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def start_end(losses: list[float]) -> tuple[Optional[float], Optional[float]]:
    """Median loss of the first and of the last fifth of the finite losses: robust to one odd batch."""
    finite = [x for x in losses if math.isfinite(x)]
    if not finite:
        return None, None
    k = max(1, len(finite) // 5)
    return float(np.median(finite[:k])), float(np.median(finite[-k:]))


def is_finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)
