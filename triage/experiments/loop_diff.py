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

from triage.experiments.base import Context, Experiment, Params
from triage.views import Curve, Line
from triage.experiments.own_step import Candidate, OwnStep, weights_fingerprint
from triage.experiments.training import (autocast, grad_norm, grad_scaler, reference_step,
                                         start_end, trainable, untouched_buffers_and_rng)
from triage.optimizer_set import ManualUpdate, OptimizerSet
from triage.experiments.user_source import display_path
from triage.outcomes.loop_diff import LoopDiffOutcome
from triage.judge.readings import GRADIENT_GROWTH, SCALED_MICRO_BATCHES


# A closure optimizer (LBFGS) evaluated again inside one step this often before its kept gradients are read.
MIN_REEVALUATIONS = 4


class LoopDiffParams(Params):
    steps: int = Field(default=20, ge=2, le=10_000, description="Steps of each loop.")
    growth_threshold: float = Field(default=GRADIENT_GROWTH, gt=1, description="grad_growth above this: accumulating.")


def measure(ctx: Context, p: LoopDiffParams) -> LoopDiffOutcome:
    session = ctx.session
    setup = session.setup
    if setup.train_step is None:
        return LoopDiffOutcome(has_train_step=False)
    start = {name: q.detach().clone() for name, q in setup.model.named_parameters() if q.requires_grad}

    reference_losses, reference_graded = _reference_loop(ctx, p.steps)
    reference_unchanged = _unchanged(setup.model, start)
    ctx.restart()
    params = trainable(setup.model)
    watch = _UserStepWatch(setup.model, setup.optimizer, params)
    stale = _StaleGradients(getattr(setup.optimizer, "optimizers", {}))
    own = OwnStep(setup, Candidate(), params, session.device)  # the run's step as it is, measured
    user_losses, ratios, returned_has_grad = [], [], None
    with watch.installed(), own.installed(), stale.installed():
        for step in range(p.steps):
            if ctx.out_of_time():
                break
            batch = session.batches[step % len(session.batches)]
            watch.pending = _fresh_grads(setup, batch, params, session.device)
            scale = _scale(setup.scaler)
            moved = weights_fingerprint(params)
            with watch.counting(), stale.counting():
                figures = own(batch)
            watch.manual_updates += not watch.stepped_this_call and weights_fingerprint(params) != moved
            watch.scaler_skips += scale is not None and _scale(setup.scaler) < scale
            if figures.returned_has_grad is not None:
                returned_has_grad = bool(returned_has_grad) or figures.returned_has_grad
            user_losses.append(figures.loss)
            ratios.append(watch.after_step(figures.norm))
            ctx.progress(step + 1, p.steps)
    watch.close_phase()
    user_unchanged = _unchanged(setup.model, start)
    ctx.restart()

    sizes = {name: t.numel() for name, t in start.items()}
    total = sum(sizes.values()) or 1
    extra = [n for n in user_unchanged if n not in reference_unchanged]
    grad_growth = _growth(ratios, p.steps)
    updated = watch.optimizer_steps + watch.scaler_skips + watch.manual_updates
    stale_name = stale.most_kept()
    foreign_name = stale.most_foreign()
    return LoopDiffOutcome(
        has_train_step=True, train_step_source=defined_at(setup.train_step), steps_run=len(user_losses),
        params_never_changed=user_unchanged,
        unchanged_fraction=sum(sizes[n] for n in user_unchanged) / total,
        reference_never_changed=reference_unchanged,
        extra_unchanged_fraction=sum(sizes[n] for n in extra) / total,
        grads_accumulate=grad_growth is not None and grad_growth > p.growth_threshold,
        grad_growth=grad_growth, stale_optimizer=stale_name,
        stale_gradient_share=stale.kept[stale_name] / stale.compared[stale_name] if stale_name else None,
        stale_steps=stale.kept.get(stale_name), stale_compared=stale.compared.get(stale_name),
        foreign_optimizer=foreign_name,
        foreign_gradient_share=stale.foreign[foreign_name] / stale.compared[foreign_name] if foreign_name else None,
        foreign_steps=stale.foreign.get(foreign_name), foreign_compared=stale.compared.get(foreign_name),
        foreign_others=_others_of(stale, foreign_name),
        closure_reevaluations=watch.reevaluations, closure_kept=watch.kept_on_reevaluation,
        closure_sums_gradients=watch.reevaluations >= MIN_REEVALUATIONS and watch.kept_on_reevaluation > watch.reevaluations / 2,
        separate_objectives=watch.several_objectives,
        left_in_eval=watch.eval_forwards > 0,
        eval_forward_fraction=watch.eval_forwards / watch.forwards if watch.forwards else 0.0,
        eval_after_step=watch.eval_after_step,
        step_grads_zero=watch.optimizer_steps > 0 and watch.max_step_grad == 0.0,
        optimizer_stepped=updated > 0, optimizer_steps=watch.optimizer_steps,
        scaler_skipped_steps=watch.scaler_skips, manual_updates=watch.manual_updates,
        zero_grad_calls=watch.zero_grads, unknown_optimizers=own.unknown_optimizers(),
        loss_detached=bool(params) and not watch.grad_events and reference_graded,
        returned_loss_has_grad=returned_has_grad,
        user_losses=user_losses, reference_losses=reference_losses,
        user_loss_ratio=_loss_ratio(user_losses), reference_loss_ratio=_loss_ratio(reference_losses),
    )


def _growth(ratios: list[Optional[float]], steps: int) -> Optional[float]:
    """How much more than a fresh gradient each optimizer step used, relative to the loop's first step.

    Each ratio is |the gradient an optimizer step used| / |the sum of fresh gradients of the calls since the
    gradients were last reset (zero_grad, or the step before)|: 1 for a plain step, 1/k for k micro-batches
    each divided by k. A first step clearly below 1 is the loop's own scaling of its micro-batches (no stale
    gradient can have reached it: the replay starts with none), and the later ratios are read against it;
    a first step near 1 is a plain step (its dropout noise is not a normalisation). Steps whose ratio has
    grown keep gradients they should have dropped. The median over the second half of the calls."""
    measured = [(i, r) for i, r in enumerate(ratios) if r is not None]
    if not measured:
        return None
    first = measured[0][1]
    late = [r for i, r in measured if i >= steps // 2] or [measured[-1][1]]
    growth = float(np.median(late))
    return growth / first if 0 < first < SCALED_MICRO_BATCHES else growth



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


def _reference_loop(ctx: Context, steps: int) -> tuple[list[float], bool]:
    """The reference step (zero_grad, forward, backward, clip as the run, step) without the scheduler:
    the user's train_step is compared as it is called, one optimizer step per batch. Its losses, and whether
    any of its backwards reached a trainable weight."""
    session = ctx.session
    setup, device = session.setup, session.device
    scaler = grad_scaler(setup, setup.precision, device)
    params = trainable(setup.model)
    setup.model.train()
    losses, graded = [], False
    for step in range(steps):
        if ctx.out_of_time():
            break
        batch = session.batches[step % len(session.batches)]
        loss, _ = reference_step(setup, batch, setup.precision, setup.grad_clip, scaler, device, params)
        losses.append(loss)
        graded = graded or any(q.grad is not None for q in params)
    return losses, graded or not losses  # no step run (out of time): not known to reach none


class _UserStepWatch:
    """Counts what happens inside the user's steps: optimizer steps (a step pre-hook: through a GradScaler, and
    on each optimizer of a set) and the gradient they were given against the fresh gradients of the calls
    since the last reset (zero_grad or step), zero_grad calls, parameter gradients computed, and the
    train/eval mode of each forward. Hooks are removed and zero_grad put back on exit."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 params: list[torch.nn.Parameter]) -> None:
        self.model, self.optimizer, self.params = model, optimizer, params
        self.optimizer_steps = self.grad_events = self.forwards = self.eval_forwards = 0
        self.zero_grads = self.scaler_skips = self.manual_updates = 0
        self.eval_after_step = False
        self.max_step_grad = 0.0
        self.pending: Optional[list[torch.Tensor]] = None  # this call's fresh gradient, until a step uses it
        self._window: Optional[list[torch.Tensor]] = None  # fresh gradients summed since the last reset
        self._ratio: Optional[float] = None  # this call's first step: |step gradient| / |window's fresh|
        self.stepped_this_call = False
        self._active = False
        # Several optimizers: which of them step on each backward (the steps between it and the next backward,
        # across calls). A backward that only some of them step on (a GAN's critic, then its generator, in one
        # call or in turns) is one objective of several; one they all step on (Muon beside AdamW) is one loss.
        self._names = {id(o): name for name, o in getattr(optimizer, "optimizers", {}).items()}
        self._stepped_on_backward: set[str] = set()
        self.partial_phases = self.whole_phases = 0
        # A closure optimizer (LBFGS) evaluates the loss several times inside one step, each evaluation's
        # backward meant to start from reset gradients: at each evaluation after the first, whether the
        # previous evaluation's gradient was still in `.grad` when its backward began.
        self._in_step, self._evaluations, self._checked = False, 0, False
        self.reevaluations = self.kept_on_reevaluation = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        handles = [self.model.register_forward_pre_hook(self._on_forward)]
        handles += [q.register_hook(functools.partial(self._on_grad, q))
                    for q in self.model.parameters() if q.requires_grad]
        if not isinstance(self.optimizer, ManualUpdate):
            handles.append(self.optimizer.register_step_pre_hook(self._on_step))
            handles.append(self.optimizer.register_step_post_hook(self._after_optimizer_step))
        optimizers = list(getattr(self.optimizer, "optimizers", {"": self.optimizer}).values())
        owners = [self.model, self.optimizer] + [o for o in optimizers if o is not self.optimizer]
        patched = [(owner, "zero_grad" in vars(owner), owner.zero_grad) for owner in owners]
        for owner, _, original in patched:
            owner.zero_grad = self._counted_zero_grad(original)
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            for owner, had_own, original in patched:
                if had_own:
                    owner.zero_grad = original
                else:
                    del owner.zero_grad

    def _counted_zero_grad(self, original):
        def zero_grad(*args, **kwargs):
            if self._active:
                self.zero_grads += 1
                self._reset()
            return original(*args, **kwargs)
        return zero_grad

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self._active, self.stepped_this_call, self._ratio = True, False, None
        try:
            yield
        finally:
            self._active = False

    def after_step(self, norm: float) -> Optional[float]:
        """Close one user step: its ratio (None: no optimizer step; for a loop with no optimizer object,
        the gradient it left against this call's fresh one)."""
        self.eval_after_step = self.eval_after_step or not self.model.training
        if self.pending is not None:  # no step used it: it waits in the window for the next one
            self._window = _added(self._window, self.pending)
            self.pending = None
        if self.stepped_this_call or not isinstance(self.optimizer, ManualUpdate):
            return self._ratio
        fresh = _norm(self._window)
        self._window = None
        return norm / fresh if fresh > 0 and math.isfinite(norm) else None

    def _on_step(self, optimizer, args, kwargs) -> Optional[tuple]:
        if not self._active:
            return None
        self._count_step(optimizer)
        self._in_step, self._evaluations = True, 0
        # A closure (LBFGS's) is counted as it is called: each call one evaluation (args[0] is the optimizer).
        if len(args) > 1 and callable(args[1]):
            return (args[0], self._counted_closure(args[1]), *args[2:]), kwargs
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._counted_closure(kwargs["closure"])}
        return None

    def _counted_closure(self, closure):
        def evaluation(*a, **k):
            self._evaluations += 1
            self._checked = False
            return closure(*a, **k)
        return evaluation

    def _count_step(self, optimizer) -> None:
        self.optimizer_steps += 1
        if id(optimizer) in self._names:
            self._stepped_on_backward.add(self._names[id(optimizer)])
        if self.stepped_this_call:  # the second optimizer of a set in the same call: its window is gone
            return
        self.stepped_this_call = True
        seen = grad_norm(_params_of(optimizer))
        self.max_step_grad = max(self.max_step_grad, seen)
        if isinstance(self.optimizer, OptimizerSet):
            # Each optimizer of a set minimises its own loss (a GAN's G and D): loss_fn's gradient is no
            # fresh counterpart of what it was given, so no ratio is measured.
            return
        fresh = _norm(_added(self._window, self.pending) if self.pending is not None else self._window)
        self._ratio = seen / fresh if fresh > 0 else None

    def _after_optimizer_step(self, *args) -> None:
        self._in_step = False
        self._reset()

    def _reset(self) -> None:
        if self._active:
            self._window = None
            if self.stepped_this_call:
                self.pending = None

    def _on_forward(self, module, inputs) -> None:
        if self._active:
            self.forwards += 1
            self.eval_forwards += not module.training

    def _on_grad(self, q: torch.Tensor, grad: torch.Tensor) -> None:
        if self._active:
            self.grad_events += 1
            if self._in_step and self._evaluations >= 2 and not self._checked:  # a closure's evaluation again
                self._checked = True
                self.reevaluations += 1
                self.kept_on_reevaluation += q.grad is not None and bool(q.grad.detach().abs().max() > 0)
            if self._stepped_on_backward:  # a backward after steps: the previous one's steps are all in
                self.close_phase()

    def close_phase(self) -> None:
        """Count the last backward by the optimizers that stepped on it (none: not yet a phase)."""
        if self._stepped_on_backward:
            whole = len(self._stepped_on_backward) == len(self._names)
            self.whole_phases += whole
            self.partial_phases += not whole
            self._stepped_on_backward = set()

    @property
    def several_objectives(self) -> bool:
        """Most backwards with several optimizers were stepped on by only some of them."""
        return len(self._names) > 1 and self.partial_phases > (self.partial_phases + self.whole_phases) / 2


class _StaleGradients:
    """Each optimizer of a set (a GAN's G and D, each stepped on its own loss, so no fresh gradient of loss_fn
    is a counterpart of what it was given): what its steps were given besides its own loss's gradient.

    Every gradient a backward computes for a parameter is kept (a tensor hook) since its optimizer last
    stepped, by backward phase: the backwards between two optimizer steps, read by the optimizers that step
    after them (a critic's backward, then the critic's step). A step given exactly its previous step's
    gradient plus everything since was given a gradient nothing reset in between (a zero_grad left out:
    `kept`). A step given exactly the gradients of its last phases, of which one was stepped on by other
    optimizers only, was given another objective's gradient (the critic's backward through a fake it did not
    detach, with the generator's zero_grad before it, not after: `foreign`). A reset, by any means (the
    optimizer's, a submodule's, `.grad = None`), leaves less. Exact, so no noise to allow for: a GradScaler's
    unscaling makes the sums differ, and the step is then counted as neither."""

    MIN_COMPARED = 4  # steps of one optimizer compared before a share is read
    EXACT = 1e-3  # the step's gradient within 0.1% of the previous one plus the new ones: float sums agree
    CARRIED = 1e-2  # ... and the previous one at least 1% of it (a vanishing one is kept or dropped alike)
    # Another objective's gradient that pushes against the optimizer's own (a critic's against its generator's:
    # cosine about -1); tasks sharing a trunk, each stepping its head, send gradients at about 0 to each other.
    AGAINST = -0.5

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]) -> None:
        self.params = {name: [q for q in _params_of(o) if q.requires_grad] for name, o in optimizers.items()} \
            if len(optimizers) > 1 else {}
        self.optimizers = optimizers
        # id(parameter) -> its gradients computed since its optimizer last stepped, one sum per phase
        self.added: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self.phase, self.steppers = 0, {0: set()}  # phase -> the optimizers that stepped after it
        self.last: dict[str, list[torch.Tensor]] = {}  # each optimizer's gradient at its last step
        self.kept = {name: 0 for name in self.params}
        self.foreign = {name: 0 for name in self.params}
        self.foreign_from: dict[str, set[str]] = {}  # the optimizers whose phases' gradients each one took
        self.compared = {name: 0 for name in self.params}
        self._active = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        handles = [q.register_hook(functools.partial(self._on_grad, q)) for qs in self.params.values() for q in qs]
        handles += [self.optimizers[name].register_step_pre_hook(functools.partial(self._on_step, name))
                    for name in self.params]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def most_kept(self) -> Optional[str]:
        """The optimizer with the largest share of kept steps (None: none compared MIN_COMPARED steps)."""
        return self._most(self.kept)

    def most_foreign(self) -> Optional[str]:
        """The optimizer with the largest share of steps given another objective's gradient."""
        return self._most(self.foreign)

    def _most(self, counts: dict[str, int]) -> Optional[str]:
        shares = {name: counts[name] / n for name, n in self.compared.items() if n >= self.MIN_COMPARED}
        return max(shares, key=lambda n: (shares[n], n)) if shares else None

    def _on_grad(self, q: torch.Tensor, grad: torch.Tensor) -> None:
        if not self._active:
            return
        if self.steppers[self.phase]:  # a backward after optimizer steps: a new phase
            self.phase += 1
            self.steppers[self.phase] = set()
        phases = self.added.setdefault(id(q), [])
        g = grad.detach().float()
        if phases and phases[-1][0] == self.phase:
            phases[-1] = (self.phase, phases[-1][1] + g)
        else:
            phases.append((self.phase, g.clone()))

    def _on_step(self, name: str, optimizer, args, kwargs) -> None:
        if not self._active:
            return
        qs = self.params[name]
        now = [q.grad.detach().float().clone() if q.grad is not None else torch.zeros_like(q, dtype=torch.float32)
               for q in qs]
        added = [self.added.pop(id(q), []) for q in qs]
        size = _norm(now)
        if name in self.last:
            expected = [last + sum(g for _, g in phases) for last, phases in zip(self.last[name], added)]
            carried = _norm(self.last[name])
            gap = _norm([n - e for n, e in zip(now, expected)])
            self.compared[name] += 1
            self.kept[name] += size > 0 and carried >= self.CARRIED * size and gap <= self.EXACT * size
            self.foreign[name] += size > 0 and self._given_foreign(name, now, added, size)
        self.steppers[self.phase].add(name)
        self.last[name] = now

    def _given_foreign(self, name: str, now: list[torch.Tensor], added: list[list[tuple[int, torch.Tensor]]],
                       size: float) -> bool:
        """`now` is exactly the gradients of this optimizer's last few phases, some of them stepped on by other
        optimizers only, whose gradient is at least 1% of `now` and points against the rest (cosine under -0.5)."""
        phases = sorted({phase for kept in added for phase, _ in kept})
        for first in phases:  # the phases from `first` on: the gradient left since a reset before `first`
            suffix = [sum((g for phase, g in kept if phase >= first), torch.zeros_like(n)) for kept, n in zip(added, now)]
            if _norm([n - t for n, t in zip(now, suffix)]) > self.EXACT * size:
                continue
            # Phases closed before this one (the current phase's steppers are still stepping: body, then head)
            others = [phase for phase in phases if first <= phase < self.phase and self.steppers.get(phase)
                      and name not in self.steppers[phase]]
            foreign = [sum((g for phase, g in kept if phase in others), torch.zeros_like(n))
                       for kept, n in zip(added, now)]
            own = [n - f for n, f in zip(now, foreign)]
            against = _cosine(foreign, own)
            if _norm(foreign) < self.CARRIED * size or (against is not None and against > self.AGAINST):
                return False
            self.foreign_from.setdefault(name, set()).update(o for phase in others for o in self.steppers[phase])
            return True
        return False


def _others_of(stale: _StaleGradients, name: Optional[str]) -> Optional[str]:
    """The optimizers whose backwards' gradients `name` stepped on ('D', 'E'); None where it took none."""
    others = sorted(stale.foreign_from.get(name, ())) if name is not None else []
    return ", ".join(f"'{o}'" for o in others) or None


def _cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> Optional[float]:
    """The cosine between two gradients given per parameter (None where either is zero)."""
    na, nb = _norm(a), _norm(b)
    if na == 0 or nb == 0:
        return None
    return float(sum(float((x * y).sum()) for x, y in zip(a, b))) / (na * nb)


def _params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [q for group in optimizer.param_groups for q in group["params"]]


def _fresh_grads(setup, batch: Any, params: list[torch.nn.Parameter], device: torch.device) -> list[torch.Tensor]:
    """The gradient of the loss on `batch` at the current weights, leaving every `.grad` as it was."""
    if not params:
        return []
    with untouched_buffers_and_rng(setup.model):
        with autocast(setup.precision, device):
            loss = setup.loss_fn(setup.model, batch)
        if not loss.requires_grad:
            return []
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [g.detach().float() if g is not None else torch.zeros_like(q, dtype=torch.float32)
            for g, q in zip(grads, params)]


def _added(window: Optional[list[torch.Tensor]], grads: list[torch.Tensor]) -> list[torch.Tensor]:
    if window is None or len(window) != len(grads):
        return [g.clone() for g in grads]
    return [w.add_(g) for w, g in zip(window, grads)]


def _norm(grads: Optional[list[torch.Tensor]]) -> float:
    if not grads:
        return 0.0
    return float(torch.stack([g.norm() for g in grads]).norm())


def _scale(scaler: Any) -> Optional[float]:
    """The GradScaler's scale (None: no scaler, or one not in use): a fall means a skipped step."""
    if scaler is None or not getattr(scaler, "is_enabled", lambda: False)():
        return None
    try:
        return float(scaler.get_scale())
    except Exception:  # noqa: BLE001  (not yet initialised: no step so far)
        return None


def _unchanged(model: torch.nn.Module, start: dict[str, torch.Tensor]) -> list[str]:
    with torch.no_grad():
        return [name for name, q in model.named_parameters() if name in start and torch.equal(q, start[name])]


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
