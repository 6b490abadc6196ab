"""The instrumented pass of locate_nonfinite: one forward/backward of the failing step with hooks on
every module and autograd node and a function mode recording ops that create NaN/Inf; and the
anomaly-mode pass that gives a backward node's forward traceback."""

from __future__ import annotations

import logging
import math
import re
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
from torch.overrides import TorchFunctionMode, resolve_name

from triage.experiments.training import (autocast, loss_value)

from triage.experiments.user_source import is_user_file, user_frame

log = logging.getLogger(__name__)

ROOT = "(model)"  # how the model itself is named when it is the culprit (named_modules() calls it "")
MAX_CREATORS = 64  # non-finite-creating ops kept from one forward: the first ones are what matters
_ANOMALY_ERROR = re.compile(r"Function '(\w+)' returned nan values")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_Kinds = tuple[bool, bool]  # (holds a NaN, holds an Inf)

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
                                          user_frame(traceback.extract_stack())))
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
            if self.first is None and not all_finite(grad_inputs) and all_finite(grad_outputs):
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


def probe_step(setup, batch, precision, device, backward_if=lambda loss_finite: loss_finite) -> _Probe:
    """One forward (and, if its loss is finite, backward) of the failing step, instrumented.

    `backward_if` decides the backward from whether the loss is finite: a sharded (FSDP2) model must
    run it on every rank once any rank does, as its backward is collective."""
    watch = _ForwardWatch(setup.model)
    recorder = _OpRecorder(watch)
    backward = None
    try:
        setup.optimizer.zero_grad(set_to_none=True)
        with autocast(precision, device), recorder:
            loss = setup.loss_fn(setup.model, batch)
        loss_finite = math.isfinite(loss_value(loss))
        if backward_if(loss_finite) and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            backward = _BackwardWatch.on(loss)
            loss.backward()
    finally:
        watch.remove()
        if backward is not None:
            backward.remove()
    return _Probe(watch, recorder, loss_finite, backward)


def anomaly_pass(setup, batch, precision, device) -> tuple[Optional[str], Optional[str], Optional[tuple[str, int]]]:
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
    user = [f for f in frames if is_user_file(f[0])]
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
    if all_finite(obj):
        return False, False
    nan = inf = False
    for value in _values(obj):
        if isinstance(value, float):
            nan, inf = nan or math.isnan(value), inf or math.isinf(value)
        elif not all_finite(value):
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


def all_finite(obj: Any) -> bool:
    """Every float tensor and Python float in a (nested) value is finite."""
    if isinstance(obj, float):
        return math.isfinite(obj)
    if isinstance(obj, torch.Tensor):
        if not (obj.is_floating_point() or obj.is_complex()) or obj.numel() == 0 or obj.is_meta:
            return True
        return bool(torch.isfinite(obj.detach()).all())
    if isinstance(obj, dict):
        return all(all_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(all_finite(v) for v in obj)
    return True
