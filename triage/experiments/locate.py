"""Locate the first non-finite value: replay until a step goes NaN/Inf, then bisect that step.

At the failing step (its pre-step state kept: the weights are untouched because the step is
stopped before the optimizer moves them; RNG and buffers are saved before every step), one
instrumented forward/backward finds:

- forward: the first module, in completion order, whose output is non-finite, preferring one
  that *creates* the value rather than passing it on; and, through a TorchFunctionMode, the
  first torch op that module ran itself which creates one, with the user's source line. To
  create is to output a NaN where no input held one (0/0, softmax of an all -inf row) or an Inf
  from finite inputs (overflow); a number argument is an input, so `masked_fill(mask, -inf)`
  passes a mask on and creates nothing;
- backward: hooks on every autograd node find the first node whose gradient outputs are
  non-finite while the gradients flowing into it were finite (an Inf counts: anomaly mode only
  checks NaN, and sqrt(0)'s Inf becomes NaN one node later); the module that created the node in
  the forward is the culprit module. One anomaly-mode pass of the same step then gives that
  node's forward traceback, hence the user's source line.

Module backward hooks (`register_full_backward_hook`) are not used: they wrap module outputs in
a custom Function, and any in-place op on such an output (ReLU(inplace=True) after a BatchNorm,
as in every torchvision ResNet) makes the forward raise. Autograd node hooks have no such limit.
"""

from __future__ import annotations

import linecache
import logging
import math
import os
import re
import sysconfig
import traceback
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from pydantic import Field
from torch.overrides import TorchFunctionMode, resolve_name

import triage
from triage.contract import Precision
from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.training import (autocast, forward_backward, grad_scaler, loss_value, optimizer_step,
                                         trainable)
from triage.snapshot import rng_state, set_rng_state

log = logging.getLogger(__name__)

ROOT = "(model)"  # how the model itself is named when it is the culprit (named_modules() calls it "")
MAX_CREATORS = 64  # non-finite-creating ops kept from one forward: the first ones are what matters
_ANOMALY_ERROR = re.compile(r"Function '(\w+)' returned nan values")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_Kinds = tuple[bool, bool]  # (holds a NaN, holds an Inf)


class LocateParams(Params):
    steps: int = Field(default=40, ge=1, le=100_000, description="Replay at most this many steps.")
    lr_scale: float = Field(default=1.0, gt=0, description="Multiply the learning rate at every step.")
    precision: Optional[Precision] = Field(default=None, description="Autocast dtype; None: as the run.")
    anomaly: bool = Field(default=True, description="For a backward culprit, one anomaly-mode pass of "
                                                    "the failing step to find the forward source line.")


class LocateOutcome(Outcome):
    found: bool = Field(description="A step with a non-finite loss or gradient was reached.")
    step: Optional[int] = Field(default=None, description="That step (0-based, as replay counts).")
    steps_run: int = 0
    truncated: bool = Field(default=False, description="Stopped by the time budget before finding one.")
    stage: Optional[str] = Field(default=None, description='"forward" or "backward": where it first appears '
                                                           "(None: the step did not repeat its failure).")
    forward_module: Optional[str] = Field(default=None, description="First module creating a non-finite output.")
    forward_module_type: Optional[str] = None
    backward_module: Optional[str] = Field(
        default=None, description="Module whose forward built the first autograd node with a non-finite grad.")
    module: Optional[str] = Field(default=None, description="The culprit module for the stage.")
    op: Optional[str] = Field(default=None, description='The op: "Tensor.div", "SqrtBackward0", ...')
    anomaly_op: Optional[str] = Field(default=None, description="The node anomaly mode's NaN check named.")
    source: Optional[str] = Field(default=None, description='"path/file.py:123" of the user code.')
    source_line: Optional[str] = None
    source_context: list[str] = Field(default_factory=list, description="Lines around it, '>' marks it.")
    inputs_finite: Optional[bool] = Field(
        default=None, description="The culprit's inputs (forward) or incoming gradients (backward) were finite.")
    loss_finite: bool = Field(default=True, description="The loss of the failing step was finite.")
    nonfinite_parameters: list[str] = Field(
        default_factory=list, description="Parameters already non-finite before the failing step "
                                          "(an earlier optimizer update overflowed them).")


def measure(ctx: Context, p: LocateParams) -> LocateOutcome:
    session = ctx.session
    setup = session.setup
    model, optimizer, scheduler = setup.model, setup.optimizer, setup.scheduler
    precision = p.precision or setup.precision
    scaler = grad_scaler(setup, precision, session.device)
    params = trainable(model)
    model.train()
    for step in range(p.steps):
        if ctx.out_of_time():
            return LocateOutcome(found=False, steps_run=step, truncated=True)
        batch = session.batches[step % len(session.batches)]
        before = _PreStep.take(model)
        if not _train_step(setup, batch, precision, setup.grad_clip, scaler, session.device, params, p.lr_scale):
            before.restore(model)
            return _bisect_step(setup, batch, precision, session.device, before, step, p.anomaly)
        if scheduler is not None:
            scheduler.step()
        ctx.progress(step + 1, p.steps)
    return LocateOutcome(found=False, steps_run=p.steps)


def _train_step(setup, batch, precision, clip, scaler, device, params, lr_scale) -> bool:
    """replay's reference step, stopped before the optimizer moves on a non-finite loss or gradient.

    Returns whether the step was finite. Under a GradScaler an inf gradient is routine (the
    scaler skips that step), so only the loss counts there.
    """
    loss, norm = forward_backward(setup, batch, precision, clip, scaler, device, params)
    if not math.isfinite(loss) or (scaler is None and not math.isfinite(norm)):
        return False
    optimizer_step(setup, scaler, lr_scale)
    return True


@dataclass
class _PreStep:
    """What a stopped step changes besides gradients: the RNG streams and the buffers (BN stats)."""

    rng: dict[str, Any]
    buffers: dict[str, torch.Tensor]

    @classmethod
    def take(cls, model: torch.nn.Module) -> "_PreStep":
        return cls(rng_state(), {k: b.detach().clone() for k, b in model.named_buffers()})

    def restore(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(self.buffers[name])
        set_rng_state(self.rng)


def _bisect_step(setup, batch, precision, device, before: _PreStep, step: int, anomaly: bool) -> LocateOutcome:
    bad_params = [name for name, q in setup.model.named_parameters() if not _all_finite(q)]
    probe = _probe(setup, batch, precision, device)
    before.restore(model=setup.model)
    forward = probe.forward_culprit()
    backward_node = probe.backward.first if probe.backward else None
    if forward is not None or not probe.loss_finite:
        stage = "forward"
    elif backward_node is not None:
        stage = "backward"
    else:  # a non-deterministic kernel, say: the instrumented pass of the same step stayed finite
        log.warning("step %d went non-finite but did not when repeated with hooks; nothing located", step)
        stage = None
    backward_module = probe.module_of(backward_node.node) if backward_node else None
    op = anomaly_op = frame = None
    if stage == "forward":
        creator = probe.recorder.creator_in(forward.name if forward else None)
        if creator:
            op, frame = creator.op, creator.frame
    elif backward_node is not None:
        op = backward_node.name
        if anomaly:
            traced, anomaly_op, frame = _anomaly_pass(setup, batch, precision, device)
            before.restore(model=setup.model)
            op = traced or op
    setup.optimizer.zero_grad(set_to_none=True)
    if stage == "forward":
        module = forward.name if forward else None
        inputs_finite = forward.inputs_finite if forward else None
    else:
        module, inputs_finite = backward_module, (True if stage else None)
    return LocateOutcome(
        found=True, step=step, steps_run=step + 1, stage=stage,
        forward_module=forward.name if forward else None,
        forward_module_type=forward.kind if forward else None,
        backward_module=backward_module, module=module, op=op, anomaly_op=anomaly_op,
        source=_display_path(frame[0], frame[1]) if frame else None,
        source_line=_line(frame[0], frame[1]) if frame else None,
        source_context=_context(frame[0], frame[1]) if frame else [],
        inputs_finite=inputs_finite, loss_finite=probe.loss_finite, nonfinite_parameters=bad_params,
    )


# ---- the instrumented pass ---------------------------------------------------------------------

@dataclass
class _Call:
    """One call of a module's forward."""

    name: str
    kind: str
    inputs: _Kinds
    output: _Kinds = (False, False)

    @property
    def inputs_finite(self) -> bool:
        return not any(self.inputs)


class _ForwardWatch:
    """Forward pre/post hooks on every module: finiteness of each call's inputs and output, and the
    stack of running modules (so that an op or an autograd node can be given to the innermost one)."""

    def __init__(self, model: torch.nn.Module):
        self.calls: list[_Call] = []  # in completion order
        self.stack: list[_Call] = []
        self.handles = []
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._enter(name or ROOT), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._leave, with_kwargs=True))

    def _enter(self, name: str):
        def hook(module, args, kwargs):
            self.stack.append(_Call(name, type(module).__name__, _nonfinite_kinds((args, kwargs))))
        return hook

    def _leave(self, module, args, kwargs, output):
        call = self.stack.pop()
        call.output = _nonfinite_kinds(output)
        self.calls.append(call)

    def current(self) -> Optional[str]:
        return self.stack[-1].name if self.stack else None

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass(frozen=True)
class _Creator:
    op: str
    module: Optional[str]
    frame: Optional[tuple[str, int]]


class _OpRecorder(TorchFunctionMode):
    """Sees every torch call of the forward: which autograd node each module built, and the ops
    that create a non-finite value (see `_creates`; a number argument counts as an input)."""

    def __init__(self, watch: _ForwardWatch):
        super().__init__()
        self.watch = watch
        self.node_module: dict[Any, Optional[str]] = {}
        self.creators: list[_Creator] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        module = self.watch.current()
        for tensor in _tensors(out):
            if tensor.grad_fn is not None:
                self.node_module.setdefault(tensor.grad_fn, module)
        produced = _nonfinite_kinds(out) if len(self.creators) < MAX_CREATORS else (False, False)
        if any(produced) and _creates(_nonfinite_kinds((args, kwargs)), produced):
            name = resolve_name(func) or getattr(func, "__name__", repr(func))
            self.creators.append(_Creator(name.removeprefix("torch."), module,
                                          _user_frame(traceback.extract_stack())))
        return out

    def creator_in(self, module: Optional[str]) -> Optional[_Creator]:
        """The first creating op run directly by `module` (None: outside every module, in loss_fn).

        Only there: a module creates a non-finite output either in its own code or, through its
        parameters, in no op at all (an Inf weight handed to F.linear); an op elsewhere is not its cause.
        """
        return next((c for c in self.creators if c.module == module), None)


@dataclass
class _BadNode:
    node: Any
    name: str
    traceback: list[str]


@dataclass
class _BackwardWatch:
    """Hooks on every autograd node of the loss's graph: the first node, in backward order, whose
    gradient outputs are non-finite while its incoming gradients were finite."""

    consumer: dict[Any, Any] = field(default_factory=dict)  # node -> the node its output feeds
    handles: list = field(default_factory=list)
    first: Optional[_BadNode] = None

    @classmethod
    def on(cls, loss: torch.Tensor) -> "_BackwardWatch":
        watch = cls()
        if loss.grad_fn is None:
            return watch
        seen, todo = {loss.grad_fn}, [loss.grad_fn]
        while todo:
            node = todo.pop()
            watch.handles.append(node.register_hook(watch._hook(node)))
            for child, _ in node.next_functions:
                if child is not None and child not in seen:
                    seen.add(child)
                    watch.consumer[child] = node
                    todo.append(child)
        return watch

    def _hook(self, node):
        def hook(grad_inputs, grad_outputs):
            if self.first is None and not _all_finite(grad_inputs) and _all_finite(grad_outputs):
                # Under anomaly mode the node carries its forward stack; read it while it exists.
                self.first = _BadNode(node, node.name(), list(node.metadata.get("traceback_", [])))
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class _Probe:
    watch: _ForwardWatch
    recorder: _OpRecorder
    loss_finite: bool
    backward: Optional[_BackwardWatch]

    def forward_culprit(self) -> Optional[_Call]:
        bad = [c for c in self.watch.calls if any(c.output)]
        created = [c for c in bad if _creates(c.inputs, c.output)]
        return (created or bad or [None])[0]

    def module_of(self, node: Any) -> Optional[str]:
        """The module that built `node`; for a node inside one torch call, the module of its consumer."""
        while node is not None:
            if node in self.recorder.node_module:
                return self.recorder.node_module[node]
            node = self.backward.consumer.get(node)
        return None


def _probe(setup, batch, precision, device) -> _Probe:
    """One forward (and, if its loss is finite, backward) of the failing step, instrumented."""
    watch = _ForwardWatch(setup.model)
    recorder = _OpRecorder(watch)
    backward = None
    try:
        setup.optimizer.zero_grad(set_to_none=True)
        with autocast(precision, device), recorder:
            loss = setup.loss_fn(setup.model, batch)
        loss_finite = math.isfinite(loss_value(loss))
        if loss_finite and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            backward = _BackwardWatch.on(loss)
            loss.backward()
    finally:
        watch.remove()
        if backward is not None:
            backward.remove()
    return _Probe(watch, recorder, loss_finite, backward)


def _anomaly_pass(setup, batch, precision, device) -> tuple[Optional[str], Optional[str], Optional[tuple[str, int]]]:
    """The failing step again under autograd anomaly mode: (first bad node, node anomaly mode
    named, user frame of the bad node's forward call)."""
    watch = None
    anomaly_op = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                setup.optimizer.zero_grad(set_to_none=True)
                with autocast(precision, device):
                    loss = setup.loss_fn(setup.model, batch)
                watch = _BackwardWatch.on(loss)
                try:
                    loss.backward()
                except RuntimeError as exc:
                    match = _ANOMALY_ERROR.search(str(exc))
                    if match is None:
                        raise
                    anomaly_op = match.group(1)
        finally:
            if watch is not None:
                watch.remove()
    first = watch.first if watch else None
    stack = first.traceback if first and first.traceback else _warned_traceback(caught)
    frames = [(path, int(line)) for path, line in _FRAME.findall("".join(stack))]
    user = [f for f in frames if _is_user_file(f[0])]
    return (first.name if first else anomaly_op), anomaly_op, (user[-1] if user else None)


def _warned_traceback(caught) -> list[str]:
    """The forward traceback anomaly mode prints (as a warning) beside its NaN error."""
    for w in caught:
        text = str(w.message)
        if "Traceback of forward call" in text:
            return [text]
    return []


# ---- small helpers -----------------------------------------------------------------------------

def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def _nonfinite_kinds(obj: Any) -> _Kinds:
    """Whether a (nested) value holds a NaN, and whether it holds an Inf (tensors and Python floats)."""
    if _all_finite(obj):
        return False, False
    nan = inf = False
    for value in _values(obj):
        if isinstance(value, float):
            nan, inf = nan or math.isnan(value), inf or math.isinf(value)
        elif not _all_finite(value):
            nan, inf = nan or bool(torch.isnan(value).any()), inf or bool(torch.isinf(value).any())
    return nan, inf


def _creates(inputs: _Kinds, output: _Kinds) -> bool:
    """A new kind of non-finite value: a NaN where no input had one (softmax of an all -inf row,
    0/0), or an Inf from all-finite inputs (overflow). A -inf mask passed on is not a creation."""
    (in_nan, in_inf), (out_nan, out_inf) = inputs, output
    return (out_nan and not in_nan) or (out_inf and not in_nan and not in_inf)


def _values(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _values(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _values(value)
    else:
        yield obj


def _all_finite(obj: Any) -> bool:
    """Every float tensor and Python float in a (nested) value is finite."""
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, torch.Tensor):
        if not (obj.is_floating_point() or obj.is_complex()) or obj.numel() == 0 or obj.is_meta:
            return True
        return bool(torch.isfinite(obj.detach()).all())
    if isinstance(obj, dict):
        return all(_all_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_all_finite(v) for v in obj)
    return True


@lru_cache(maxsize=None)
def _library_dirs() -> tuple[tuple[str, ...], str, str]:
    """(torch's and triage's folders, the standard library, site-packages), resolved."""
    def folder(path: str) -> str:
        return str(Path(path).resolve()) + os.sep
    paths = sysconfig.get_paths()
    return (tuple(folder(Path(m.__file__).parent) for m in (torch, triage)),
            folder(paths["stdlib"]), folder(paths["purelib"]))


@lru_cache(maxsize=4096)
def _is_user_file(path: str) -> bool:
    """Not torch, not triage, not the standard library; third-party model code counts as the user's."""
    if path.startswith("<frozen"):
        return False
    resolved = str(Path(path).resolve())
    ours, stdlib, site_packages = _library_dirs()
    if resolved.startswith(ours):
        return False
    return not resolved.startswith(stdlib) or resolved.startswith(site_packages)


def _user_frame(frames: traceback.StackSummary) -> Optional[tuple[str, int]]:
    for frame in reversed(frames):
        if _is_user_file(frame.filename):
            return frame.filename, frame.lineno
    return None


def _display_path(path: str, line: int) -> str:
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        shown = path
    return f"{path if shown.startswith('..') else shown}:{line}"


def _line(path: str, line: int) -> Optional[str]:
    return linecache.getline(path, line).strip() or None


def _context(path: str, line: int, around: int = 2) -> list[str]:
    lines = []
    for n in range(max(1, line - around), line + around + 1):
        text = linecache.getline(path, n)
        if text:
            lines.append(f"{'>' if n == line else ' '} {n:5d} | {text.rstrip()}")
    return lines


LOCATE_NONFINITE = Experiment(
    name="locate_nonfinite",
    summary="Replays to the first non-finite step and names the module, op and source line that "
            "first produce the NaN/Inf, in the forward or the backward.",
    params=LocateParams,
    outcome=LocateOutcome,
    measure=measure,
)
