"""What the run's loss function hands the losses of torch.nn.functional, seen by wrapping those functions
while the run's loss_fn runs (the nn modules that call them included). A loss that takes raw scores
(`binary_cross_entropy_with_logits`, `cross_entropy`). A model that squashes its scores outside forward() (a
link predictor's decode() ending in .sigmoid()) shows it here, not in its output. Code that imported the
function itself (`from torch.nn.functional import cross_entropy`) before the wrap is not seen. And a loss that
scores a prediction against a target (mse_loss, gaussian_nll_loss, ...) handed shapes that broadcast to a larger
one: (B, 1) against (B,) scores every prediction against every target of the batch."""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F

from triage.batches import named_tensors
from triage.experiments.interventions import SQUASH_TOLERANCE
from triage.experiments.training import autocast, untouched_buffers_and_rng

SCORE_LOSSES = ("binary_cross_entropy_with_logits", "cross_entropy")


@dataclass
class ScoresSeen:
    """The inputs the score losses were handed: how many calls, whether every one lay in [0, 1], and the
    least and greatest value over all of them."""

    calls: int = 0
    all_in_unit_interval: bool = True
    low: float = math.inf
    high: float = -math.inf

    def add(self, scores: torch.Tensor) -> None:
        self.calls += 1
        finite = bool(torch.isfinite(scores).all())
        if finite and scores.numel():
            low, high = float(scores.min()), float(scores.max())
            self.low, self.high = min(self.low, low), max(self.high, high)
        self.all_in_unit_interval &= finite and bool(scores.numel()) and \
            self.low >= -SQUASH_TOLERANCE and self.high <= 1 + SQUASH_TOLERANCE

    @property
    def squashed(self) -> bool:
        return self.calls > 0 and self.all_in_unit_interval


@contextlib.contextmanager
def score_losses(transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> Iterator[ScoresSeen]:
    """Within: every call of a score loss records its input, and hands the loss `transform(input)` instead
    where a transform is given (the squashing undone, say). Put back on exit."""
    seen = ScoresSeen()

    def wrapped(name, original):
        def call(input, *args, **kwargs):
            seen.add(input.detach())
            return original(transform(input) if transform is not None else input, *args, **kwargs)
        return call

    with _wrapped(SCORE_LOSSES, wrapped):
        yield seen


# Losses that score a prediction against a target of the same shape, and broadcast them where they differ:
# mse_loss warns, gaussian_nll_loss (since torch 1.10) and the rest say nothing.
PAIRED_LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "gaussian_nll_loss", "poisson_nll_loss",
                 "binary_cross_entropy")


@contextlib.contextmanager
def paired_losses() -> Iterator[list[str]]:
    """Within: every call of a paired loss whose input and target broadcast to more elements than either holds
    ((B, 1) against (B,) -> (B, B): every prediction scored against every target) is described in the list."""
    found: list[str] = []

    def wrapped(name, original):
        def call(input, target, *args, **kwargs):
            # Only a trailing 1 on one side ((B, 1) against (B,)): a pairwise loss written on purpose
            # (x[:, None] against centres[None]) broadcasts other dimensions.
            if isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor) and (
                    input.shape[:-1] == target.shape and input.shape[-1:] == (1,)
                    or target.shape[:-1] == input.shape and target.shape[-1:] == (1,)):
                shape = torch.broadcast_shapes(input.shape, target.shape)
                if math.prod(shape) > max(input.numel(), target.numel()):  # not where B is 1
                    found.append(f"{name}: input {tuple(input.shape)} against target {tuple(target.shape)}, "
                                 f"broadcast to {tuple(shape)}")
            return original(input, target, *args, **kwargs)
        return call

    with _wrapped(PAIRED_LOSSES, wrapped):
        yield found


BINARY_LOSSES = ("binary_cross_entropy", "binary_cross_entropy_with_logits")


@contextlib.contextmanager
def binary_targets() -> Iterator[list[str]]:
    """Within: every call of a binary cross-entropy handed a target outside [0, 1] (a mask saved as 0/255) is
    described in the list."""
    found: list[str] = []

    def wrapped(name, original):
        def call(input, target, *args, **kwargs):
            if isinstance(target, torch.Tensor) and target.numel() and bool(((target < 0) | (target > 1)).any()):
                found.append(f"{name}: target in [{float(target.min()):g}, {float(target.max()):g}]")
            return original(input, target, *args, **kwargs)
        return call

    with _wrapped(BINARY_LOSSES, wrapped):
        yield found


@contextlib.contextmanager
def _wrapped(names: tuple[str, ...], wrap: Callable) -> Iterator[None]:
    """torch.nn.functional's `names` replaced by wrap(name, original) while inside, put back on exit."""
    originals = {name: getattr(F, name) for name in names}
    for name, original in originals.items():
        setattr(F, name, functools.wraps(original)(wrap(name, original)))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(F, name, original)


# The losses a class's log-likelihood is written with: nll_loss on log-probabilities, cross_entropy on scores.
CLASS_LOSSES = ("nll_loss", "cross_entropy")


def other_terms_gradient(setup, batch, device: torch.device) -> Optional[float]:
    """The gradient the run's loss sends its weights through everything but its class losses, over the one those
    send, on `batch`: 0 where the loss is its nll_loss / cross_entropy alone (their sum and scaling included); near
    1 or more where another term weighs as much (a point process's integral of its intensities, which bounds the
    log-intensities its nll_loss is handed). None where no class loss is called, the loss on `batch` is not below
    zero (the one rule that reads it asks about a loss below zero: two passes saved), or it could not be
    measured."""
    params = [q for q in setup.model.parameters() if q.requires_grad]
    calls: list[str] = []

    def wrapped(name, original):
        def call(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs).detach()  # its value kept, its gradient taken out
        return call

    def loss_of(detached: bool) -> Any:
        with contextlib.ExitStack() as stack:
            if detached:
                stack.enter_context(_wrapped(CLASS_LOSSES, wrapped))
            stack.enter_context(untouched_buffers_and_rng(setup.model))
            stack.enter_context(autocast(setup.precision, device))
            return setup.loss_fn(setup.model, batch)

    def gradient(loss: Any) -> list[Optional[torch.Tensor]]:
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            return [None] * len(params)
        return list(torch.autograd.grad(loss.float(), params, allow_unused=True))

    try:
        with torch.no_grad():  # its sign first, without a graph: a large model's activations are not kept for it
            value = loss_of(detached=False)
        if not isinstance(value, torch.Tensor) or not float(value.float().sum()) < 0:
            return None  # the one rule that reads this asks about a loss below zero
        whole = gradient(loss_of(detached=False))
        rest = gradient(loss_of(detached=True))
    except Exception:  # noqa: BLE001 - a figure, not a replay: a loss that fails here leaves it unknown
        return None
    if not calls:
        return None

    def squared(t: Optional[torch.Tensor]) -> float:
        return 0.0 if t is None else float(t.float().pow(2).sum())

    rest_sq = theirs_sq = 0.0  # per parameter: no flat copy of a large model's gradient
    for r, w in zip(rest, whole):
        rest_sq += squared(r)
        theirs_sq += squared(w if r is None else (-r if w is None else w - r))
    if not (math.isfinite(rest_sq) and math.isfinite(theirs_sq)) or theirs_sq == 0:
        return None
    return math.sqrt(rest_sq / theirs_sq)


def loss_broadcast(setup, batch, device: torch.device) -> Optional[str]:
    """The first paired loss the run's loss_fn hands a broadcast pair on `batch`, else the first operation of the
    loss's own code that does (None: none does, or it raised)."""
    with paired_losses() as found, _OutputAgainstTarget(setup.model, batch) as ops, torch.no_grad(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mse_loss's own size warning: said here instead
        try:
            with autocast(setup.precision, device):
                setup.loss_fn(setup.model, batch)
        except Exception:  # noqa: BLE001 - a loss that raises is measured by the experiments that train it
            return None
    found += ops.found
    return found[0] if found else None


def _singleton_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`a` is `b`'s shape with one size-1 dimension put in ((B, 1, T) against (B, T)), or the other way round:
    aligned from the right, that 1 meets the batch dimension and every element meets every example's."""
    def inserted(longer, shorter) -> bool:
        return longer.dim() == shorter.dim() + 1 and any(
            longer.shape[d] == 1 and longer.shape[:d] + longer.shape[d + 1:] == shorter.shape
            for d in range(longer.dim()))
    return inserted(a, b) or inserted(b, a)


class _OutputAgainstTarget(torch.overrides.TorchFunctionMode):
    """Within: an operation of the loss's own code (outside the model's forward) that takes a tensor computed
    from the model's output and one computed from the batch alone, whose shapes differ by a size-1 dimension and
    broadcast to more elements than either ((B, 1, T) against (B, T) -> (B, B, T): a hand-written SI-SNR scoring
    every estimate against every target). Two tensors both from the output (a pairwise distance between
    embeddings) are a pairwise loss written on purpose, and are not read."""

    def __init__(self, model: torch.nn.Module, batch) -> None:
        super().__init__()
        self.model, self.found = model, []
        self.kept: list[torch.Tensor] = [t for _, t in named_tensors(batch)]  # held: their ids stay theirs
        self.from_batch = {id(t) for t in self.kept}
        self.from_output: set[int] = set()
        self.depth = 0

    def __enter__(self):
        self.handles = [self.model.register_forward_pre_hook(self._enter),
                        self.model.register_forward_hook(self._leave, always_call=True)]
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return super().__exit__(*exc)

    def _enter(self, module, inputs) -> None:
        self.depth += 1

    def _leave(self, module, inputs, output) -> None:
        self.depth -= 1
        if self.depth == 0:
            self._mark(output, self.from_output)

    def _mark(self, value, into: set[int]) -> None:
        for _, tensor in named_tensors(value):
            self.kept.append(tensor)
            into.add(id(tensor))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self.depth:
            return result
        inputs = [t for _, t in named_tensors((args, kwargs or {}))]
        outputs = [t for t in inputs if id(t) in self.from_output]
        targets = [t for t in inputs if id(t) in self.from_batch and id(t) not in self.from_output]
        if outputs:
            self._mark(result, self.from_output)
        elif targets:
            self._mark(result, self.from_batch)
        if len(inputs) == 2 and len(outputs) == 1 and len(targets) == 1 and not self.found:
            a, b = outputs[0], targets[0]
            if _singleton_apart(a, b) and isinstance(result, torch.Tensor) and \
                    result.numel() > max(a.numel(), b.numel()):
                self.found.append(f"{getattr(func, '__name__', func)}: the output's {tuple(a.shape)} against the "
                                  f"target's {tuple(b.shape)}, broadcast to {tuple(result.shape)}")
        return result
