"""Loop differential: the user's own `train_step` against the reference loop, from the same snapshot on
the same batches, with the user's step instrumented (optimizer steps counted, gradients watched,
train/eval mode of every forward recorded)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from typing import Any, Iterator, Optional

import numpy as np
import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.views import Curve, Line
from triage.experiments.training import (autocast, grad_norm, grad_scaler, loss_value, reference_step,
                                         start_end, trainable, untouched_buffers_and_rng)
from triage.experiments.user_source import display_path


class LoopDiffParams(Params):
    steps: int = Field(default=20, ge=2, le=10_000, description="Steps of each loop.")
    # A gradient that is summed instead of replaced is, after k steps, about sqrt(k) (uncorrelated) to
    # k (aligned) times a fresh one: 1.5 is clear of both 1 (zeroed each step) and sqrt(10) (step 10).
    growth_threshold: float = Field(default=1.5, gt=1, description="grad_growth above this: accumulating.")


class LoopDiffOutcome(Outcome):
    has_train_step: bool
    train_step_source: Optional[str] = Field(
        default=None, description="file:line where the run's train_step is defined (None: none, or inspect "
                                  "cannot tell, as for a builtin).")
    steps_run: int = 0
    params_never_changed: list[str] = Field(
        default_factory=list, description="Trainable parameters the user's steps left exactly as they were.")
    unchanged_fraction: float = Field(default=0.0, description="Their share of the trainable elements.")
    reference_never_changed: list[str] = Field(
        default_factory=list, description="Trainable parameters the reference loop left unchanged too.")
    extra_unchanged_fraction: float = Field(
        default=0.0, description="Share of trainable elements unchanged by the user's steps only.")
    grads_accumulate: bool = Field(default=False, description="grad_growth > growth_threshold.")
    grad_growth: Optional[float] = Field(
        default=None, description="Median over the second half of the steps of |the gradient optimizer.step "
                                  "was given| / |a fresh gradient on the same batch at the same weights| "
                                  "(the gradient after the step when the optimizer never stepped).")
    step_grads_zero: bool = Field(
        default=False, description="The optimizer stepped, but every time on all-zero (or no) gradients.")
    left_in_eval: bool = Field(default=False, description="Some forward of the user's step ran in eval mode.")
    eval_forward_fraction: float = Field(default=0.0, description="Share of the user's forwards in eval mode.")
    eval_after_step: bool = Field(default=False, description="The model was in eval mode after a user step.")
    optimizer_stepped: bool = Field(default=False, description="optimizer.step() ran during the user's steps.",
                                    json_schema_extra={"ranks": "all"})
    optimizer_steps: int = 0
    loss_detached: bool = Field(
        default=False, description="No trainable parameter received a gradient in any user step.")
    returned_loss_has_grad: Optional[bool] = Field(
        default=None, description="The loss train_step returned is part of an autograd graph (a float or "
                                  "a detached tensor is a normal thing to return; None: not a tensor).")
    user_losses: list[float] = Field(default_factory=list)
    reference_losses: list[float] = Field(default_factory=list)
    user_loss_ratio: Optional[float] = Field(default=None, description="Median last fifth / first fifth.")
    reference_loss_ratio: Optional[float] = Field(default=None, description="The same for the reference.")


def measure(ctx: Context, p: LoopDiffParams) -> LoopDiffOutcome:
    session = ctx.session
    setup = session.setup
    if setup.train_step is None:
        return LoopDiffOutcome(has_train_step=False)
    start = {name: q.detach().clone() for name, q in setup.model.named_parameters() if q.requires_grad}

    reference_losses = _reference_loop(ctx, p.steps)
    reference_unchanged = _unchanged(setup.model, start)
    session.restore()
    params = trainable(setup.model)
    watch = _UserStepWatch(setup.model, setup.optimizer, params)
    user_losses, growth, returned_has_grad = [], [], None
    with watch.installed():
        for step in range(p.steps):
            if ctx.out_of_time():
                break
            batch = session.batches[step % len(session.batches)]
            fresh = _fresh_grad_norm(setup, batch, params, session.device)
            with watch.counting():
                returned = setup.train_step(setup.model, setup.optimizer, batch)
            if isinstance(returned, torch.Tensor):
                returned_has_grad = bool(returned_has_grad) or returned.requires_grad
            user_losses.append(_as_float(returned))
            seen = watch.after_step()
            if step >= p.steps // 2 and fresh > 0:
                growth.append((seen if seen is not None else grad_norm(params)) / fresh)
            ctx.progress(step + 1, p.steps)
    user_unchanged = _unchanged(setup.model, start)
    session.restore()

    sizes = {name: t.numel() for name, t in start.items()}
    total = sum(sizes.values()) or 1
    extra = [n for n in user_unchanged if n not in reference_unchanged]
    grad_growth = float(np.median(growth)) if growth else None
    return LoopDiffOutcome(
        has_train_step=True, train_step_source=defined_at(setup.train_step), steps_run=len(user_losses),
        params_never_changed=user_unchanged,
        unchanged_fraction=sum(sizes[n] for n in user_unchanged) / total,
        reference_never_changed=reference_unchanged,
        extra_unchanged_fraction=sum(sizes[n] for n in extra) / total,
        grads_accumulate=grad_growth is not None and grad_growth > p.growth_threshold,
        grad_growth=grad_growth,
        left_in_eval=watch.eval_forwards > 0,
        eval_forward_fraction=watch.eval_forwards / watch.forwards if watch.forwards else 0.0,
        eval_after_step=watch.eval_after_step,
        step_grads_zero=watch.optimizer_steps > 0 and watch.max_step_grad == 0.0,
        optimizer_stepped=watch.optimizer_steps > 0, optimizer_steps=watch.optimizer_steps,
        loss_detached=bool(params) and not watch.grad_events,
        returned_loss_has_grad=returned_has_grad,
        user_losses=user_losses, reference_losses=reference_losses,
        user_loss_ratio=_loss_ratio(user_losses), reference_loss_ratio=_loss_ratio(reference_losses),
    )


def defined_at(function: Any) -> Optional[str]:
    """file:line of a function's `def` (of a partial's function, a method's, a callable object's __call__)."""
    function = inspect.unwrap(function)  # through triage's own data guard, and the user's decorators
    while isinstance(function, functools.partial):
        function = inspect.unwrap(function.func)
    if not (inspect.isfunction(function) or inspect.ismethod(function)):
        function = getattr(type(function), "__call__", None)
    try:
        _, line = inspect.getsourcelines(function)
        return display_path(inspect.getsourcefile(function), line)
    except (TypeError, OSError):  # a builtin, or code with no file (typed into a REPL)
        return None


def _reference_loop(ctx: Context, steps: int) -> list[float]:
    """The reference step (zero_grad, forward, backward, clip as the run, step) without the scheduler:
    the user's train_step is compared as it is called, one optimizer step per batch."""
    session = ctx.session
    setup, device = session.setup, session.device
    scaler = grad_scaler(setup, setup.precision, device)
    params = trainable(setup.model)
    setup.model.train()
    losses = []
    for step in range(steps):
        if ctx.out_of_time():
            break
        batch = session.batches[step % len(session.batches)]
        loss, _ = reference_step(setup, batch, setup.precision, setup.grad_clip, scaler, device, params)
        losses.append(loss)
    return losses


def _fresh_grad_norm(setup, batch: Any, params: list[torch.nn.Parameter], device: torch.device) -> float:
    """|grad| of the loss on `batch` at the current weights, leaving every `.grad` as it was."""
    if not params:
        return 0.0
    with untouched_buffers_and_rng(setup.model):
        with autocast(setup.precision, device):
            loss = setup.loss_fn(setup.model, batch)
        if not loss.requires_grad:
            return 0.0
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    norms = [g.detach().float().norm() for g in grads if g is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


class _UserStepWatch:
    """Counts what happens inside the user's steps: optimizer.step calls and the gradient norm they are
    given, parameter gradients computed, and the train/eval mode of each forward. Hooks are removed and
    optimizer.step is put back on exit."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 params: list[torch.nn.Parameter]) -> None:
        self.model, self.optimizer, self.params = model, optimizer, params
        self.optimizer_steps = self.grad_events = self.forwards = self.eval_forwards = 0
        self.eval_after_step = False
        self.max_step_grad = 0.0
        self._step_norm: Optional[float] = None  # the gradient norm at this user step's first optimizer.step
        self._active = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        # An LR scheduler may already have wrapped optimizer.step on the instance: keep whatever is there.
        had_own = "step" in vars(self.optimizer)
        original = self.optimizer.step

        def counted_step(*args, **kwargs):
            if self._active:
                self.optimizer_steps += 1
                if self._step_norm is None:
                    self._step_norm = grad_norm(self.params)
                    self.max_step_grad = max(self.max_step_grad, self._step_norm)
            return original(*args, **kwargs)

        self.optimizer.step = counted_step
        handles = [self.model.register_forward_pre_hook(self._on_forward)]
        handles += [q.register_hook(self._on_grad) for q in self.model.parameters() if q.requires_grad]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            if had_own:
                self.optimizer.step = original
            else:
                del self.optimizer.step

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def after_step(self) -> Optional[float]:
        """Close one user step; the gradient norm its optimizer.step saw (None: it did not step)."""
        self.eval_after_step = self.eval_after_step or not self.model.training
        seen, self._step_norm = self._step_norm, None
        return seen

    def _on_forward(self, module, inputs) -> None:
        if self._active:
            self.forwards += 1
            self.eval_forwards += not module.training

    def _on_grad(self, grad: torch.Tensor) -> None:
        if self._active:
            self.grad_events += 1


def _unchanged(model: torch.nn.Module, start: dict[str, torch.Tensor]) -> list[str]:
    with torch.no_grad():
        return [name for name, q in model.named_parameters() if name in start and torch.equal(q, start[name])]


def _as_float(value: Any) -> float:
    if isinstance(value, (torch.Tensor, int, float)) and not isinstance(value, bool):
        return loss_value(value)
    return math.nan  # train_step returned no loss (None, a dict, ...)


def _loss_ratio(losses: list[float]) -> Optional[float]:
    if sum(math.isfinite(x) for x in losses) < 2:
        return None
    first, last = start_end(losses)
    return last / first if first > 0 else None


LOOP_DIFF = Experiment(
    name="loop_diff",
    summary="Runs the user's train_step and the reference loop from the same snapshot on the same batches "
            "and compares what each does to the weights, gradients, mode and optimizer.",
    params=LoopDiffParams,
    outcome=LoopDiffOutcome,
    views=(Curve(title="Loss per step: the run's own step vs the reference loop", field="user_losses",
                 label="the run's train_step", ylabel="loss",
                 lines=(Line(field="reference_losses", label="reference loop", style="reference"),)),),
    measure=measure,
)
