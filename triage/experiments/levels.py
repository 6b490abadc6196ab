"""The loss levels a run is judged against: what a model that learned nothing would score.

- `chance`: ln K for a classifier over K classes (uniform guessing).
- `floor`: the least the loss can score: the run's `loss_fn` on a perfect prediction (the target itself
  for a regressor, a 30-logit margin on the true class for a classifier, both the 0/1 target and its
  logit for binary targets) at the checkpoint's weights, and never above 0 (cross-entropy, MSE, BCE,
  Huber, L1 score ~0 there; a term that does not depend on the output moves it). Measured only where
  the perfect prediction scores well under the constant one (the loss rewards being right). A value
  below it is a symptom (a term with the wrong sign, an unbounded fall), never a fix. Unknown (None)
  where no perfect prediction can be built (a Gaussian NLL, an ELBO: negative by nature).
- `constant`: the loss of the best constant prediction, measured through the run's own `loss_fn`:
  the class frequencies of the snapshot as logits for a classifier (its label entropy), the mean
  target for a regressor (the target variance under MSE). For 0/1 float targets (a binary or
  multi-label classifier) the mean is a probability, and a loss on logits (BCEWithLogitsLoss) wants
  its logit: both are scored and the lower kept (the binary entropy under BCE; under MSE or BCELoss
  the mean itself). The model's output is swapped for that constant by a forward hook, so label
  smoothing, class weights or an ignore index count as the run counts them.

`chance` and `constant` depend on the data alone, `floor` also on the checkpoint's weights (a term of the
loss that reads them): all are measured once per session, at the checkpoint (the engine measures them
before its first experiment, the replay before its first step).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Optional

import torch

from triage.batches import named_tensors
from triage.experiments.probes import (IGNORE_INDEX, class_targets, example_weights, first_floating, labels_unread,
                                       model_output)
from triage.experiments.training import loss_value
from triage.judge.levels import LossLevels
from triage.judge.readings import has_floor

PROBE_BATCHES = 4  # batches the constant prediction is scored on (the levels are averages)


def loss_levels(session: Any) -> LossLevels:
    """The session's levels, measured on first use (in a distributed run, on every rank's shard, and
    averaged: every rank must judge a fix against the same level)."""
    return session.memoised("loss_levels", lambda: _across_ranks(_measure(session)))


def _across_ranks(levels: LossLevels) -> LossLevels:
    from triage.load.ranks import current

    every = current().gather(levels)
    constants = [lv.constant for lv in every]
    if len(every) == 1 or all(c == constants[0] for c in constants):
        return levels
    return levels.model_copy(update={"constant": None if None in constants else sum(constants) / len(constants)})


class _Stop(Exception):
    """Raised by the capture hook once the model's output is in hand."""


def val_nothing_level(session: Any) -> Optional[float]:
    """The loss of learning nothing as the training snapshot defines it (its class frequencies, its mean
    target), scored on the validation batches, whose classes may be balanced where training's are not:
    predicting a 20% training rate scores 0.92 on a 50/50 validation set, 0.50 on training. None without
    validation batches."""
    if not session.val_batches:
        return None
    return session.memoised("val_nothing_level",
                            lambda: _measure(session, session.val_batches[:PROBE_BATCHES]).nothing_learned)


@torch.no_grad()
def _measure(session: Any, scored: Optional[list[Any]] = None) -> LossLevels:
    """The levels: the snapshot's classes or targets define the constant prediction; it is scored on the
    first batches of `scored` (the training snapshot's where None)."""
    setup = session.setup
    batches = scored or session.batches[:PROBE_BATCHES]
    first = session.batches[0]  # the training snapshot's shapes define the prediction; `batches` score it
    output = top_output(setup, first)
    targets = None if labels_unread(session) else class_targets(first)
    if output is None:  # a structured output (a Hugging Face ModelOutput, a dict) whose loss the model computes
        logits = model_output(setup, first, session.device)
        k = logits.shape[-1] if logits is not None and targets is not None else 0
        if k < 2:
            return LossLevels(kind="unknown")
        # The constant is swapped in where the logits are made (the head), so the model's own loss reads it.
        head = logits_module(setup, first)
        prior = class_prior(session.batches, k) if head is not None else None
        constant = None if prior is None else constant_loss(setup, batches, prior.log(), module=head)
        return LossLevels(kind="classification", num_classes=k, chance=math.log(k), constant=constant)
    k = output.shape[-1] if output.dim() >= 2 else 0
    if targets is not None and k >= 2:
        prior = class_prior(session.batches, k)
        constant = None if prior is None else constant_loss(setup, batches, prior.log())
        return LossLevels(kind="classification", num_classes=k, chance=math.log(k), constant=constant,
                          floor=None if example_weights(session)  # a weighted likelihood: no least value known
                          else _floor(constant, perfect_loss(setup, batches, "classification")))
    mean = target_mean(session.batches, output)
    if mean is None:
        return _several_per_target(setup, session.batches, batches, output)
    if binary_targets(session.batches, output):
        constant = best_constant_loss(setup, batches, binary_constants(mean),
                                      chosen_on=session.batches[:PROBE_BATCHES] if scored else None)
        return LossLevels(kind="binary", constant=constant,
                          floor=_floor(constant, perfect_loss(setup, batches, "binary")))
    constant = constant_loss(setup, batches, mean)
    return LossLevels(kind="regression", constant=constant,
                      floor=_floor(constant, perfect_loss(setup, batches, "regression")))


def _several_per_target(setup: Any, snapshot: list[Any], batches: list[Any], output: torch.Tensor) -> LossLevels:
    """An output with one more dimension than its target (three quantiles per forecast step, say): each
    column predicts the same target. Predicting the target in every column is a perfect prediction only
    where the loss says so, by scoring it 0 (a pinball or an absolute loss does; a Gaussian NLL, whose
    second column is a variance, does not), and the mean target in every column is the constant one.
    Else the levels are unknown."""
    if output.dim() < 2 or regression_target(snapshot[0], output.numel() // output.shape[-1]) is None:
        return LossLevels(kind="unknown")
    targets = [regression_target(b, None) for b in snapshot]
    if any(t is None for t in targets):
        return LossLevels(kind="unknown")
    mean = torch.cat([t.reshape(-1).double().cpu() for t in targets]).mean().float()
    constant = constant_loss(setup, batches, mean.reshape(1))
    perfect = loss_with_output(setup, batches, _the_target_in_every_column)
    scale = abs(constant) if constant else 1.0
    if constant is None or perfect is None or abs(perfect) > 1e-6 * scale:
        return LossLevels(kind="unknown")
    return LossLevels(kind="regression", constant=constant, floor=_floor(constant, perfect))


def _the_target_in_every_column(output: torch.Tensor, batch: Any) -> Optional[torch.Tensor]:
    target = regression_target(batch, output.numel() // output.shape[-1])
    if target is None:
        return None
    return target.reshape(output.shape[:-1]).unsqueeze(-1).expand_as(output).to(output.dtype).clone()


PERFECT_MARGIN = 30.0  # logits: the true class 30 above the rest, a probability within 1e-13 of 1


def perfect_loss(setup: Any, batches: list[Any], kind: str,
                 margins: tuple[float, ...] = (PERFECT_MARGIN,)) -> Optional[float]:
    """The run's mean loss over `batches` on a perfect prediction for levels of `kind` (a margin on the true
    class; the 0/1 target or its logit, the lower; the target itself), None where none can be built; the
    least over `margins` where a margin is built (label smoothing scores a margin of 30 above one of 10).
    Not capped: where the target is a distribution (a listwise loss's grades, soft labels), it is the least
    the loss scores on those batches, their entropy, not 0."""
    if kind == "classification":
        makers = [lambda output, batch, m=m: margin_on_the_label(output, batch, m) for m in margins]
    elif kind == "binary":
        makers = [_the_target] + [lambda output, batch, m=m: target_logit(output, batch, m) for m in margins]
    else:
        makers = [_the_target] if kind == "regression" else []
    values = [v for v in (loss_with_output(setup, batches, make) for make in makers) if v is not None]
    return min(values, default=None)


def _floor(constant: Optional[float], perfect: Optional[float]) -> Optional[float]:
    """The perfect prediction's loss, capped at 0, where it is under half the constant prediction's."""
    if not has_floor(constant, perfect):
        return None
    return min(0.0, perfect)


def margin_on_the_label(output: torch.Tensor, batch: Any, margin: float = PERFECT_MARGIN) -> Optional[torch.Tensor]:
    y = class_targets(batch)
    if y is None or tuple(y.shape) != tuple(output.shape[:-1]):
        return None
    y = y.long().clamp(0, output.shape[-1] - 1)  # an ignored (-100) position is ignored by the loss too
    return torch.nn.functional.one_hot(y, output.shape[-1]).to(output.dtype) * margin


def _the_target(output: torch.Tensor, batch: Any) -> Optional[torch.Tensor]:
    target = regression_target(batch, output.numel())
    return target.reshape(output.shape).to(output.dtype) if target is not None else None


def target_logit(output: torch.Tensor, batch: Any, margin: float = PERFECT_MARGIN) -> Optional[torch.Tensor]:
    target = _the_target(output, batch)
    return (target * 2 - 1) * margin if target is not None else None


def loss_with_output(setup: Any, batches: list[Any], swap,
                     module: Optional[torch.nn.Module] = None) -> Optional[float]:
    """The run's mean loss over `batches` when the model's output (or `module`'s: the head of a model that
    computes its loss itself) is replaced by `swap(output, batch)` (None where it cannot be built, or the
    loss refuses it: shape or range). A batch the loss cannot score at all (ctc_loss on a clip shorter
    than its transcript is inf whatever the output) tells nothing of the output: the mean is over the
    others."""
    values = []
    for batch in batches:
        def replace(module, inputs, output, batch=batch):
            swapped = swap(output, batch) if isinstance(output, torch.Tensor) else None
            if swapped is None:
                raise _Stop
            return swapped.to(output.device)

        try:
            with output_hooked(setup.model, replace, module):
                values.append(loss_value(setup.loss_fn(setup.model, batch)))
        except Exception:  # no such output, or the loss refuses it
            return None
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


@contextlib.contextmanager
def output_hooked(model: torch.nn.Module, hook, module: Optional[torch.nn.Module] = None) -> Iterator[None]:
    """`hook` on the output of `model` (or of its `module`), in eval mode (no dropout, no BatchNorm statistics
    moved); every module's own train/eval flag is put back after (a part the run keeps in eval stays so)."""
    modes = [(m, m.training) for m in model.modules()]
    handle = (module or model).register_forward_hook(hook)
    model.eval()
    try:
        yield
    finally:
        handle.remove()
        for m, training in modes:
            m.training = training


def top_output(setup: Any, batch: Any) -> Optional[torch.Tensor]:
    """The model's own output on `batch` when it is one floating tensor (else None), without running
    the loss on it."""
    seen: list[Any] = []

    def hook(module, inputs, output):
        seen.append(output)
        raise _Stop

    try:
        with output_hooked(setup.model, hook):
            setup.loss_fn(setup.model, batch)
    except _Stop:
        pass
    except Exception:
        return None
    if not seen or not isinstance(seen[0], torch.Tensor) or not seen[0].is_floating_point():
        return None
    return seen[0]


def class_prior(batches: list[Any], k: int) -> Optional[torch.Tensor]:
    """Class frequencies over the snapshot (add-one smoothed so no class has probability 0)."""
    counts = torch.ones(k, dtype=torch.float64)
    for batch in batches:
        y = class_targets(batch)
        if y is None:
            continue
        y = y.reshape(-1)
        y = y[(y != IGNORE_INDEX) & (y >= 0) & (y < k)]
        counts += torch.bincount(y.cpu().long(), minlength=k)[:k].double()
    return (counts / counts.sum()).float()


def target_mean(batches: list[Any], output: torch.Tensor) -> Optional[torch.Tensor]:
    """The mean regression target, per output column: the batch's last floating tensor whose element
    count matches the output's (e.g. (B,) or (B, 1) targets for a (B, 1) output)."""
    rows = []
    for batch in batches:
        target = regression_target(batch, output.numel() if not rows else None)
        if target is None:
            return None
        rows.append(target.reshape(target.shape[0], -1).double().cpu())
    if not rows or len({r.shape[1] for r in rows}) != 1:
        return None
    mean = torch.cat(rows).mean(0)  # (columns,)
    return mean.float() if mean.numel() in (1, output.shape[-1]) else None


def binary_targets(batches: list[Any], output: torch.Tensor) -> bool:
    """Every regression target in the snapshot is 0 or 1 (a binary or multi-label classifier's)."""
    for i, batch in enumerate(batches):
        target = regression_target(batch, output.numel() if i == 0 else None)
        if target is None or not bool(((target == 0) | (target == 1)).all()):
            return False
    return True


def binary_constants(mean: torch.Tensor) -> list[torch.Tensor]:
    """The constant predictions of 0/1 targets with frequency `mean`: the probability itself (a loss on
    probabilities or MSE) and its logit (a loss on logits)."""
    return [mean, torch.logit(mean.clamp(1e-4, 1 - 1e-4))]


def best_constant_loss(setup: Any, batches: list[Any], constants: list[torch.Tensor],
                       chosen_on: Optional[list[Any]] = None) -> Optional[float]:
    """The loss on `batches` of the constant prediction that scores lowest on `chosen_on` (on `batches` where
    None): which one the loss reads as the frequency (a probability, or its logit) is the training snapshot's
    question, not the validation set's. Constants the loss refuses do not count."""
    scored = [(x, c) for x, c in ((constant_loss(setup, chosen_on or batches, c), c) for c in constants)
              if x is not None]
    if not scored:
        return None
    best_value, best = min(scored, key=lambda xc: xc[0])
    return best_value if chosen_on is None else constant_loss(setup, batches, best)


def regression_target(batch: Any, numel: Optional[int]) -> Optional[torch.Tensor]:
    """The batch's last floating tensor, where the inputs are beside it: floating ones, or integer ids
    before it (a recommender's user and item ids, then its 0/1 or rating target)."""
    tensors = [t for _, t in named_tensors(batch) if t.dim() >= 1]
    floats = [t for t in tensors if t.is_floating_point()]
    if not floats:
        return None
    target = floats[-1]
    ids_before = tensors[-1] is target and any(not t.is_floating_point() for t in tensors[:-1])
    if len(floats) < 2 and not ids_before:  # the inputs and a target at least
        return None
    return target if numel is None or target.numel() == numel else None


def constant_loss(setup: Any, batches: list[Any], constant: torch.Tensor,
                  module: Optional[torch.nn.Module] = None) -> Optional[float]:
    """The run's loss when the model (or `module`) outputs `constant` (broadcast over its last dim) for
    every example."""
    return loss_with_output(setup, batches, lambda output, batch: constant.to(
        device=output.device, dtype=output.dtype).expand_as(output).clone(), module)


def logits_module(setup: Any, batch: Any) -> Optional[torch.nn.Module]:
    """The submodule whose output is the logits a structured model output carries (its head): the one
    that returned that very tensor, else the last one called whose output has its shape. None if none."""
    calls: list[tuple[torch.nn.Module, torch.Tensor]] = []

    def hook(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            calls.append((module, output))

    results: list[Any] = []
    handles = [m.register_forward_hook(hook) for m in setup.model.modules() if m is not setup.model]
    handles.append(setup.model.register_forward_hook(lambda module, inputs, output: results.append(output)))
    was_training = setup.model.training
    setup.model.eval()
    try:
        setup.loss_fn(setup.model, batch)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
        setup.model.train(was_training)
    logits = first_floating(results[0]) if results else None
    if logits is None:
        return None
    same = [m for m, out in calls if out is logits]
    shaped = [m for m, out in calls if out.shape == logits.shape]
    return (same or shaped or [None])[-1]

