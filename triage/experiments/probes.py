"""Read-only probes shared by the instrument experiments: what the model outputs, which tensor of a
batch holds class labels, which holds the inputs, the mean loss over a few batches.

None of these steps an optimizer. A forward in train mode may update BatchNorm running statistics:
experiments that probe the checkpoint's model call `ctx.restart()` when they are done.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np
import torch

from triage.contract import Setup
from triage.batches import named_tensors, replace_tensor
from triage.load.data_guard import copy_batch
from triage.experiments.training import autocast, loss_value, untouched_buffers_and_rng

# Torch's own default for ignored targets (F.cross_entropy, nn.NLLLoss): padding, not a class.
IGNORE_INDEX = -100


class _Captured(Exception):
    """Raised by the output hook to stop the loss function once the model's output is in hand."""


def first_floating(value: Any, min_dim: int = 2) -> Optional[torch.Tensor]:
    """The first floating tensor with at least `min_dim` dims in a (nested) model output."""
    return next(floating_tensors(value, min_dim), None)


def floating_tensors(value: Any, min_dim: int = 2) -> Iterator[torch.Tensor]:
    """Every floating tensor with at least `min_dim` dims in a (nested) model output, in order."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dim() >= min_dim:
            yield value
        return
    if isinstance(value, dict):
        value = list(value.values())
    elif hasattr(value, "to_tuple"):  # Hugging Face ModelOutput
        value = value.to_tuple()
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from floating_tensors(item, min_dim)


@torch.no_grad()
def model_output(setup: Setup, batch: Any, device: torch.device) -> Optional[torch.Tensor]:
    """The model's output on `batch` (the logits, for a classifier), detached, in fp32: the first floating
    output of dim >= 2 (see `model_outputs`). None when the loss function never calls the model's forward."""
    outputs = model_outputs(setup, batch, device)
    return outputs[0] if outputs else None


@torch.no_grad()
def model_outputs(setup: Setup, batch: Any, device: torch.device) -> list[torch.Tensor]:
    """Every floating output of dim >= 2 of the model's first forward on `batch` (a Siamese model's two
    branches, an encoder's embeddings beside its logits), detached, in fp32.

    The forward is driven through the user's `loss_fn` (only it knows how to call the model); a hook on
    the top module takes the outputs and stops the call there, so a loss that would fail on these outputs
    (labels out of range, say) is never reached. Empty when the loss function never calls the model's forward.
    """
    captured: list[torch.Tensor] = []

    def hook(module, inputs, output):
        captured.extend(t.detach().float() for t in floating_tensors(output))
        if captured:
            raise _Captured

    handle = setup.model.register_forward_hook(hook)
    try:
        with autocast(setup.precision, device):
            setup.loss_fn(setup.model, batch)
    except _Captured:
        pass
    finally:
        handle.remove()
    return captured


LABEL_KEYS = ("labels", "label", "targets", "target", "y")  # dict batches: where labels usually live


def class_targets(batch: Any) -> Optional[torch.Tensor]:
    """The integer class labels of a batch: a dict's `labels` (or alike) entry, else its last integer
    tensor (bools are masks, not labels)."""
    if isinstance(batch, dict):
        for key in LABEL_KEYS:
            if isinstance(batch.get(key), torch.Tensor) and _is_integer(batch[key]):
                return batch[key]
    found = None
    for _, tensor in named_tensors(batch):
        if _is_integer(tensor):
            found = tensor
    return found


@dataclass(frozen=True)
class TensorReads:
    """Which tensors of a batch one call of the loss function reads (named as `named_tensors` names them).
    `by_loss`: the integer ones read by the loss itself, outside the model's forward (the targets it scores the
    output against). `anywhere`: the integer ones read at all, the model's forward included (token ids, a
    Hugging Face model's `labels`). `complete`: the call ran to its end; where it raised, what it would have read after
    is not known."""

    by_loss: list[str]
    anywhere: list[str]
    complete: bool
    floats_by_loss: list[str]  # the floating tensors the loss itself reads: soft targets, example weights, masks


@torch.no_grad()
def loss_reads(setup: Setup, batch: Any, device: torch.device) -> TensorReads:
    """The integer tensors of `batch` the loss function reads, measured by recording the tensors every torch
    function gets while the loss runs; a view or `.long()` of a batch tensor counts as that tensor. Where a
    position in the batch says nothing (inputs, targets, input lengths, target lengths), this tells the
    targets (read by the loss) from the rest, and a tensor nothing reads (a dataset's label beside a
    self-supervised pair of views) from both."""
    batch = copy_batch(batch)  # the user's own loss_fn (unwrapped below) may change its batch in place
    loss_fn = inspect.unwrap(setup.loss_fn)  # the data guard's copy would read every tensor of the batch
    candidates = {name: t for name, t in named_tensors(batch) if _is_integer(t) and t.numel() > 0}
    storages = {name: t.untyped_storage().data_ptr() for name, t in candidates.items()}
    floats = {name: t.untyped_storage().data_ptr() for name, t in named_tensors(batch)
              if t.is_floating_point() and t.dim() >= 1}
    by_loss: set[int] = set()
    anywhere: set[int] = set()
    depth = [0]

    class Recorder(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            for value in (*args, *(kwargs or {}).values()):
                for tensor in value if isinstance(value, (list, tuple)) else (value,):
                    if isinstance(tensor, torch.Tensor):
                        anywhere.add(tensor.untyped_storage().data_ptr())
                        if depth[0] == 0:
                            by_loss.add(tensor.untyped_storage().data_ptr())
            return func(*args, **(kwargs or {}))

    def enter(module, inputs):
        depth[0] += 1

    def leave(module, inputs, output):
        depth[0] -= 1

    handles = [setup.model.register_forward_pre_hook(enter),
               setup.model.register_forward_hook(leave, always_call=True)]
    complete = True
    try:
        with Recorder(), autocast(setup.precision, device):
            loss_fn(setup.model, batch)
    except Exception:  # noqa: BLE001 - a loss that fails on these labels has read them before it failed
        complete = False
    finally:
        for handle in handles:
            handle.remove()
    return TensorReads(by_loss=[name for name, pointer in storages.items() if pointer in by_loss],
                       anywhere=[name for name, pointer in storages.items() if pointer in anywhere],
                       complete=complete, floats_by_loss=[name for name, pointer in floats.items() if pointer in by_loss])


def first_batch_reads(session: Any) -> TensorReads:
    """`loss_reads` of the session's first batch, buffers and RNG left as they were: which tensors the loss
    reads does not change with the weights, so it is measured once per session for every probe that asks."""
    def measure() -> TensorReads:
        with untouched_buffers_and_rng(session.setup.model):
            return loss_reads(session.setup, session.batches[0], session.device)
    return session.memoised("first_batch_reads", measure)


def labels_unread(session: Any) -> bool:
    """Whether the batch's integer tensor that would be its labels (`class_targets`) is read by nothing: the
    loss reads no integer tensor, and neither it nor the model reads this one (a dataset's class beside a
    self-supervised pair of views). Then the run has no labels, whatever its batches carry. Measured once per
    session on the first batch; False where the loss raised before it could be told."""
    def measure() -> bool:
        batch = session.batches[0]
        labels = class_targets(batch)
        if labels is None:
            return False
        reads = first_batch_reads(session)
        name = next((n for n, t in named_tensors(batch) if t is labels), None)
        return reads.complete and not reads.by_loss and name not in reads.anywhere
    return session.memoised("labels_unread", measure)


def example_weights(session: Any) -> Optional[str]:
    """A float per example, not the same for all, that the loss itself reads beside the labels and that weighs
    some labels' log-likelihood up and others' down (a policy gradient's centred returns or advantages): such a
    loss goes below zero by design, and a perfect prediction of the labels is no least value. Its name in the
    batch, or None; None too where every example's label is pushed up (importance or class-balancing weights:
    a weighted likelihood, whose floor is still a perfect prediction). Which float, on the first batch; which
    way it pushes, by its sign anywhere in the snapshot and the loss's push on each label over the first
    PUSH_BATCHES batches. Measured once per session."""
    def measure() -> Optional[str]:
        batch = session.batches[0]
        labels = class_targets(batch)
        if labels is None or labels.dim() != 1:
            return None
        reads = first_batch_reads(session)
        tensors = dict(named_tensors(batch))
        name = next((name for name in reads.floats_by_loss if tensors[name].dim() == 1
                     and tensors[name].shape[0] == labels.shape[0] and tensors[name].unique().numel() > 1), None)
        if name is None:
            return None
        if any(bool((t < 0).any()) for b in session.batches for n, t in named_tensors(b) if n == name):
            return name  # centred before the loss reads it (advantages): both ways somewhere in the snapshot
        pushes = [_label_pushes(session, b) for b in session.batches[:PUSH_BATCHES]]
        if any(p is None for p in pushes):
            return name  # not measured: as a float weighing labels can
        pushes = torch.cat(pushes)
        tiny = 1e-6 * float(pushes.abs().max()) if pushes.numel() else 0.0
        return name if bool((pushes > tiny).any() and (pushes < -tiny).any()) else None
    return session.memoised("example_weights", measure)


PUSH_BATCHES = 4  # batches the push on each label is read on (one episode can hold advantages of one sign)
# A float named as a reward (returns, rewards, advantages): one whose higher values are better by name. A float of
# another name (a cost, a weight) says nothing of which way a loss should push. Advantages are read first: where a
# loss reads returns too, they are often the critic's target, not what weighs the actions.
REWARD_NAME = re.compile(r"advantage|\badv|return|reward", re.IGNORECASE)
ADVANTAGE_NAME = re.compile(r"advantage|\badv", re.IGNORECASE)


@dataclass(frozen=True)
class RewardPush:
    """How a loss that reads a float named as a reward pushes the actions it weighs by it."""

    name: str  # the float's place in the batch
    correlation: float  # rank correlation between the float and the push it makes (see reward_push)


def reward_push(session: Any) -> Optional[RewardPush]:
    """Where the loss reads a float per example named as a reward (REWARD_NAME): the rank correlation, within
    each of the first PUSH_BATCHES batches and averaged over them, between that float's change when its values
    are shuffled across the batch and the change this makes in how far the loss raises each example's action
    score (minus its gradient on the model's output at the action). Only the part of the push the float makes
    is read: an entropy bonus, a critic's error or a KL term do not move with it. Near +1 where minimising the
    loss makes the better-rewarded actions likelier (REINFORCE's -log_prob * R, centred or not), near -1 where
    it makes them rarer (the objective handed to the optimizer unnegated). None where not measured: no such
    float, none that moves the output's gradient, or no one integer tensor that holds the actions."""
    def measure() -> Optional[RewardPush]:
        batch = session.batches[0]
        reads = first_batch_reads(session)
        tensors = dict(named_tensors(batch))
        names = [n for n in reads.floats_by_loss if REWARD_NAME.search(n) and tensors[n].dim() == 1
                 and tensors[n].unique().numel() > 1]
        for name in sorted(names, key=lambda n: not ADVANTAGE_NAME.search(n)):
            correlations = [c for b in session.batches[:PUSH_BATCHES] if (c := _reward_push_in(session, b, name))
                            is not None]
            if correlations:
                return RewardPush(name, sum(correlations) / len(correlations))
        return None
    return session.memoised("reward_push", measure)


def _reward_push_in(session: Any, batch: Any, name: str) -> Optional[float]:
    """reward_push's correlation on one batch (None where not measured there)."""
    reward = dict(named_tensors(batch)).get(name)
    if reward is None or reward.dim() != 1:
        return None
    shuffled = reward[torch.randperm(len(reward), generator=torch.Generator().manual_seed(0)).to(reward.device)]
    grad = output_gradient(session, batch, len(reward))
    grad_shuffled = output_gradient(session, replace_tensor(batch, name, shuffled), len(reward))
    if grad is None or grad_shuffled is None:
        return None
    moved = (grad - grad_shuffled).cpu()
    # The actions: the one integer tensor with a row per example whose every value indexes the output, and at
    # whose column the float moves the gradient most in nine rows of ten (an int done flag of 0/1 beside float
    # actions indexes the output too, at the wrong column).
    actions = [t.cpu() for _, t in named_tensors(batch) if _is_integer(t) and t.dim() == 1
               and t.shape[0] == len(reward) and bool(((t >= 0) & (t < moved.shape[1])).all())]
    if len(actions) != 1:
        return None
    rows = torch.arange(len(moved))
    at_action = moved[rows, actions[0]].abs()
    largest = moved.abs().max(1).values
    if float(largest.max()) <= 0:  # the float moves no gradient on this output
        return None
    counted = largest > 1e-6 * float(largest.max())  # the rows whose push the float moves
    if int(counted.sum()) < 3 or float((at_action[counted] >= 0.5 * largest[counted]).float().mean()) < 0.9:
        return None
    pushes = -moved[rows, actions[0]]
    return _rank_correlation((reward - shuffled).detach().float().cpu()[counted], pushes[counted])


def _rank_correlation(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    """Spearman's rank correlation of two 1-D tensors (tied values share their average rank); None where either
    is constant."""
    if a.numel() < 3 or bool((a == a[0]).all()) or bool((b == b[0]).all()):
        return None
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    ranks = torch.empty(len(x), dtype=torch.float64)
    ranks[x.argsort()] = torch.arange(len(x), dtype=torch.float64)
    _, inverse = torch.unique(x, return_inverse=True)
    sums = torch.zeros(int(inverse.max()) + 1, dtype=torch.float64).index_add_(0, inverse, ranks)
    return (sums / torch.bincount(inverse).double())[inverse]


def _label_pushes(session: Any, batch: Any) -> Optional[torch.Tensor]:
    """The loss's gradient on each label's score (the model's output, one row per label): negative where the loss
    raises the label's likelihood. None where the output has no row per label or carries no gradient."""
    labels = class_targets(batch)
    if labels is None or labels.dim() != 1:
        return None
    grad = output_gradient(session, batch, labels.shape[0])
    if grad is None:
        return None
    inside = (labels >= 0) & (labels < grad.shape[1])
    return grad[torch.arange(labels.shape[0], device=grad.device)[inside], labels[inside].to(grad.device)].cpu()


def output_gradient(session: Any, batch: Any, rows: Optional[int]) -> Optional[torch.Tensor]:
    """The loss's gradient on the model's output, where that is (rows, K) (of any shape for `rows` None) and
    carries one; else None."""
    setup = session.setup
    captured: list[torch.Tensor] = []

    def hook(module, inputs, output):
        tensor = first_floating(output, min_dim=2 if rows is not None else 1)
        if tensor is not None and not captured:
            captured.append(tensor)

    handle = setup.model.register_forward_hook(hook)
    try:
        with untouched_buffers_and_rng(setup.model), torch.enable_grad(), autocast(setup.precision, session.device):
            loss = setup.loss_fn(setup.model, batch)
    except Exception:  # noqa: BLE001 - the loss ran once already (loss_reads); here it only tells the sign
        return None
    finally:
        handle.remove()
    output = captured[0] if captured else None
    shaped = rows is None or (output is not None and output.dim() == 2 and output.shape[0] == rows)
    if (output is None or not output.requires_grad or not shaped
            or not isinstance(loss, torch.Tensor) or not loss.requires_grad):
        return None
    (grad,) = torch.autograd.grad(loss, output, allow_unused=True)
    return None if grad is None else grad.float().detach()


def _is_integer(tensor: torch.Tensor) -> bool:
    return not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool


def input_tensor(batch: Any, floating: bool = False) -> Optional[torch.Tensor]:
    """The example inputs of a batch: its first tensor of dim >= 1 that is not the labels.

    With `floating`, the first floating tensor (inputs in a space where distances mean something).
    """
    targets = class_targets(batch)
    for _, tensor in named_tensors(batch):
        if tensor.dim() == 0 or tensor is targets:
            continue
        if floating and not tensor.is_floating_point():
            continue
        return tensor
    if not floating and targets is not None and targets.dim() >= 1:
        return targets  # a batch of token ids alone: the ids are the inputs
    return None


@torch.no_grad()
def mean_loss(setup: Setup, batches: list[Any], device: torch.device) -> float:
    """The loss averaged over `batches`, no gradient, under the run's autocast."""
    with autocast(setup.precision, device):
        values = [loss_value(setup.loss_fn(setup.model, b)) for b in batches]
    return float(np.mean(values)) if values else float("nan")


def linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every Linear and Conv module (the layers whose init sets the activation scale)."""
    kinds = (torch.nn.Linear, torch.nn.modules.conv._ConvNd)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]
