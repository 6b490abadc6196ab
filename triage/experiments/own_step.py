"""The run's own `train_step` as the replay's step, with the candidate's change reached inside it.

What reaches in, and how:
- the learning rate: every param group's LR is multiplied by the candidate's factor in an optimizer step
  pre-hook and put back in its post-hook, so an LR the loop sets by hand each iteration is scaled too
  (one named optimizer of a set only, where the candidate names one); a loop with no optimizer object is
  handed its LR (`Setup.manual_lr` x the factor) as train_step's second argument;
- clipping: the loop's own `clip_grad_norm_` calls (torch.nn.utils', and the name in train_step's module)
  clip at the candidate's threshold instead of the loop's (or not at all); a loop that does not clip is
  clipped in the step pre-hook;
- precision: autocast around the step (a loop that opens its own autocast keeps it: measured, and said);
- the batches: triage hands the step each batch.
Each is recorded as reached or not: `unreached` names the candidate changes the loop never let in.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from triage.contract import AUTOCAST_DTYPES
from triage.experiments.schedule import scheduler_position
from triage.experiments.training import autocast, clip_grads, grad_norm, loss_value

_PRECISION_OF = {dtype: name for name, dtype in AUTOCAST_DTYPES.items()}


@dataclass(frozen=True)
class Candidate:
    """What one replay changes inside the run's step (the run as it was: every field at its default)."""

    lr_scale: float = 1.0
    lr_of: Optional[str] = None  # one optimizer of an OptimizerSet, by name; None: all of them
    changes_clip: bool = False
    clip: Optional[float] = None  # the threshold where the candidate names one (None: no clip)
    clip_scale: float = 1.0  # on the loop's own threshold, where the candidate only scales it
    precision: Optional[str] = None  # autocast around the step; None: as the run


@dataclass
class StepFigures:
    loss: float
    norm: float  # the global gradient norm before any clipping (the loop's or the candidate's)
    lr: float  # the LR its (first) optimizer step used, the candidate's factor included
    stepped: bool  # an optimizer step ran (or, with no optimizer object, the weights moved)
    scheduler_stepped_by_loop: bool
    returned_has_grad: Optional[bool] = None  # the returned loss is part of a graph (None: not a tensor)


@dataclass
class Reach:
    """Whether each change of the candidate got into the loop, over the whole replay."""

    optimizer_steps: int = 0
    loop_clips: int = 0
    hook_clips: int = 0
    forwards: int = 0
    other_precision_forwards: int = 0
    scheduler_by_loop: int = 0
    unknown_optimizers: list[str] = field(default_factory=list)  # stepped by train_step, not handed to triage


class OwnStep:
    """Calls the run's train_step for one batch at a time, with `candidate` applied inside it."""

    def __init__(self, setup: Any, candidate: Candidate, params: list[torch.nn.Parameter], device: torch.device):
        self.setup, self.candidate, self.params, self.device = setup, candidate, params, device
        self.reach = Reach()
        self._norm: Optional[float] = None
        self._lr: Optional[float] = None
        self._clipped = False
        self._saved_lrs: dict[int, tuple[torch.optim.Optimizer, list[float]]] = {}

    # --- the step ------------------------------------------------------------------------------------
    def __call__(self, batch: Any) -> StepFigures:
        setup, c = self.setup, self.candidate
        self._norm, self._lr, self._clipped = None, None, False
        steps_before = self.reach.optimizer_steps
        position = scheduler_position(setup.scheduler)
        before = weights_fingerprint(self.params) if setup.manual_update else None
        second = self._manual_lr() if setup.manual_update else setup.optimizer
        outer = autocast(c.precision, self.device) if c.precision else contextlib.nullcontext()
        try:
            with self._clip_replaced(), outer:
                returned = setup.train_step(setup.model, second, batch)
        finally:
            self._put_back_lrs()
        stepped = self.reach.optimizer_steps > steps_before
        if setup.manual_update:
            stepped = weights_fingerprint(self.params) != before
            self._lr = second if second is not None else math.nan
        norm = self._norm if self._norm is not None else grad_norm(self.params)
        lr = self._lr if self._lr is not None else _first_lr(setup.optimizer, c)
        by_loop = scheduler_position(setup.scheduler) != position
        self.reach.scheduler_by_loop += by_loop
        return StepFigures(loss=_as_loss(returned), norm=norm, lr=lr, stepped=stepped,
                           scheduler_stepped_by_loop=by_loop,
                           returned_has_grad=returned.requires_grad if isinstance(returned, torch.Tensor) else None)

    @contextlib.contextmanager
    def installed(self) -> Iterator["OwnStep"]:
        """Hooks on for the replay: the optimizer's step pre/post hooks and the model's forward hook."""
        handles = [self.setup.model.register_forward_pre_hook(self._on_forward),
                   register_optimizer_step_pre_hook(self._any_step)]
        if not self.setup.manual_update:
            handles.append(self.setup.optimizer.register_step_pre_hook(self._before_step))
            handles.append(self.setup.optimizer.register_step_post_hook(self._after_step))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def unreached(self, steps: int) -> list[str]:
        """The candidate's changes the loop did not let in, each with why (empty: all reached)."""
        c, r, why = self.candidate, self.reach, []
        manual = self.setup.manual_update
        if c.lr_scale != 1.0:
            if manual and not self.setup.optimizer.declared:
                why.append("the LR: train_step updates the weights itself and setup() declares no manual_lr")
            elif not manual and r.optimizer_steps == 0 and steps:
                why.append("the LR: train_step never called the optimizer's step() (a loop that updates the "
                           "weights itself: leave optimizer out of Setup and pass manual_lr)")
        if c.changes_clip and r.loop_clips + r.hook_clips == 0 and steps:
            if manual:
                why.append("the clipping: train_step updates the weights itself and calls no clip_grad_norm_ "
                           "that triage can replace")
            elif r.optimizer_steps:
                why.append("the clipping threshold: the run does not clip (train_step calls no clip_grad_norm_, "
                           "setup() declares no grad_clip), so there is no threshold to scale")
            else:
                why.append("the clipping: train_step neither called optimizer.step() nor clip_grad_norm_")
        if c.precision and r.other_precision_forwards:
            why.append(f"the precision: {r.other_precision_forwards} of {r.forwards} forwards of train_step ran "
                       f"under its own autocast, not {c.precision}")
        return why

    def unknown_optimizers(self) -> Optional[str]:
        """A sentence naming the optimizers train_step stepped that setup() did not hand triage (None: none)."""
        if not self.reach.unknown_optimizers:
            return None
        return (f"train_step stepped an optimizer setup() did not hand triage "
                f"({', '.join(self.reach.unknown_optimizers)}): its state is not restored between replays, so "
                "they would not start alike, and no "
                "candidate reaches it. Pass every optimizer the step uses: Setup(optimizers={name: optimizer})")

    # --- hooks ---------------------------------------------------------------------------------------
    def _any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        known = getattr(self.setup.optimizer, "optimizers", {"": self.setup.optimizer}).values()
        if all(optimizer is not o for o in known):
            n = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
            name = f"{type(optimizer).__name__} over {n} weights"
            if name not in self.reach.unknown_optimizers:
                self.reach.unknown_optimizers.append(name)

    def _manual_lr(self) -> Optional[float]:
        declared = self.setup.optimizer
        return declared.param_groups[0]["lr"] * self.candidate.lr_scale if declared.declared else None

    def _targets(self, optimizer: torch.optim.Optimizer) -> bool:
        named = self.candidate.lr_of
        return named is None or self.setup.optimizer.optimizers.get(named) is optimizer

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.reach.optimizer_steps += 1
        if self._norm is None:
            self._norm = grad_norm(self.params)
        c = self.candidate
        if c.changes_clip and not self._clipped:
            if c.clip is not None:
                clip_grads(_params_of(optimizer), c.clip)
            # "no clip" reaches a loop that does not clip; scaling a threshold it does not have does not
            self.reach.hook_clips += c.clip is not None or c.clip_scale == 1.0
        if c.lr_scale != 1.0 and self._targets(optimizer):
            self._saved_lrs[id(optimizer)] = (optimizer, [g["lr"] for g in optimizer.param_groups])
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * c.lr_scale
        if self._lr is None and optimizer.param_groups and self._targets(optimizer):  # lr_of's own, if named
            self._lr = float(optimizer.param_groups[0]["lr"])

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        _, saved = self._saved_lrs.pop(id(optimizer), (None, []))
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr

    def _put_back_lrs(self) -> None:  # a step that raised between its hooks
        for optimizer, saved in self._saved_lrs.values():
            for group, lr in zip(optimizer.param_groups, saved):
                group["lr"] = lr
        self._saved_lrs.clear()

    def _on_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        if self.candidate.precision is None:
            return
        self.reach.forwards += 1
        device = self.device.type
        running = _PRECISION_OF.get(torch.get_autocast_dtype(device), "other") \
            if torch.is_autocast_enabled(device) else "fp32"
        self.reach.other_precision_forwards += running != self.candidate.precision

    # --- the loop's own clip_grad_norm_ ---------------------------------------------------------------
    @contextlib.contextmanager
    def _clip_replaced(self) -> Iterator[None]:
        """torch.nn.utils.clip_grad_norm_ (and the name train_step's module imported it under) measured,
        and under a clip candidate clipping at its threshold instead of the loop's."""
        original = torch.nn.utils.clip_grad_norm_
        watch = self

        def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0, *args: Any, **kwargs: Any):
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            c = watch.candidate
            threshold: Optional[float] = float(max_norm)
            if c.changes_clip:
                threshold = c.clip if c.clip is not None or c.clip_scale == 1.0 else threshold * c.clip_scale
                watch.reach.loop_clips += 1
                watch._clipped = True
            if norm_type == 2.0 and not args and not kwargs:  # sparse gradients too (SparseAdam)
                norm = torch.tensor(clip_grads(params, threshold))
            else:
                norm = original(params, threshold if threshold is not None else math.inf, norm_type, *args, **kwargs)
            if watch._norm is None:
                watch._norm = float(norm)
            return norm

        module_globals = getattr(inspect.unwrap(self.setup.train_step), "__globals__", {})
        places = [(torch.nn.utils, "clip_grad_norm_"), (torch.nn.utils.clip_grad, "clip_grad_norm_")]
        places += [(module_globals, name) for name, value in list(module_globals.items()) if value is original]
        saved = [(where, name, where[name] if isinstance(where, dict) else getattr(where, name))
                 for where, name in places]
        for where, name, _ in saved:
            _set(where, name, clip_grad_norm_)
        try:
            yield
        finally:
            for where, name, value in saved:
                _set(where, name, value)


def _set(where: Any, name: str, value: Any) -> None:
    if isinstance(where, dict):
        where[name] = value
    else:
        setattr(where, name, value)


def _params_of(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _first_lr(optimizer: torch.optim.Optimizer, c: Candidate) -> float:
    groups = optimizer.param_groups
    return float(groups[0]["lr"]) * c.lr_scale if groups else math.nan


@torch.no_grad()
def weights_fingerprint(params: list[torch.nn.Parameter]) -> list[float]:
    """Cheap per-parameter figures that change when a weight does (to see a manual update happen)."""
    # the sum and the L1 norm, accumulated in float64 without a float64 copy of the weights
    return [float(p.detach().sum(dtype=torch.float64))
            + float(torch.linalg.vector_norm(p.detach(), 1, dtype=torch.float64)) for p in params]


def _as_loss(value: Any) -> float:
    if isinstance(value, (torch.Tensor, int, float)) and not isinstance(value, bool):
        return loss_value(value)
    return math.nan
