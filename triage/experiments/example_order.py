"""example_order: does the run's loss depend on the order of the examples in a batch?

A loss over a batch of examples is a function of the set of them: reversing their order (every tensor that
holds a row per example, reversed together) changes it by float summation noise only. One that changes more
computes across examples by their place in the batch: a Cox partial likelihood written for batches sorted by
duration and handed shuffled ones (its cumulative sum takes random risk sets). The model's output tells where:
where each example's output row follows it, the loss does it; where it does not, the forward works across
examples (a model-side mixup, a sort for packing), which the judge does not read as a fault.

Not read where the order may be the run's own design: a batch sorted by one of its per-example tensors
(durations sorted for the sorted Cox loss, lengths for packing), or a loss_fn that hands the model other
inputs than the batch's, reversed (mixup and cutmix pair each example with another by position, on purpose).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from pydantic import Field

from triage.batches import map_tensors, named_tensors
from triage.experiments.base import Context, Experiment, Params
from triage.experiments.fingerprint import example_rows, examples_unreadable
from triage.experiments.probes import floating_tensors
from triage.experiments.training import autocast, loss_value, scored_loss, untouched_buffers_and_rng
from triage.outcomes.example_order import ExampleOrderOutcome


class ExampleOrderParams(Params):
    batches: int = Field(default=2, ge=1, description="Compare the first N snapshot batches.")


def measure(ctx: Context, p: ExampleOrderParams) -> ExampleOrderOutcome:
    session = ctx.session
    compared: list[tuple[float, float, bool]] = []
    reason = None
    for batch in session.batches[:p.batches]:
        reason = _unreadable(batch)
        if reason is None:
            try:
                reason, figures = _compared(session.setup, batch, session.device)
            except Exception as exc:  # noqa: BLE001 - a loss or forward that refuses another order (packing)
                reason, figures = f"the loss raised {type(exc).__name__} on it, in its order or reversed", None
            ctx.restart()
            if figures is not None:
                compared.append(figures)
        if reason is not None:
            break
    if reason is not None or not compared:
        return ExampleOrderOutcome(not_compared=reason or "no batch")
    return ExampleOrderOutcome(compared=len(compared), loss_gap=max(c[0] for c in compared),
                               draw_gap=max(c[1] for c in compared), outputs_follow=all(c[2] for c in compared))


def _unreadable(batch: Any) -> Optional[str]:
    reason = examples_unreadable([batch])
    if reason is not None:
        return reason
    rows, _ = example_rows(batch)
    whole = {id(t) for _, t in named_tensors(batch)}
    if any(id(t) not in whole for _, t in rows):
        return "the batch's examples are not whole rows of its tensors (a mask or seeds select them)"
    if not rows or rows[0][1].shape[0] < 4:
        return "fewer than 4 examples in a batch"
    for key, t in rows:
        if t.dtype != torch.bool and t.numel() == t.shape[0] and t.shape[0] > 1:
            diffs = t.reshape(-1).double().diff()
            if bool((diffs >= 0).all() or (diffs <= 0).all()) and bool((diffs != 0).any()):
                return f"the batch is sorted by {key}: its order may be the run's own"
    return None


@torch.no_grad()
def _compared(setup: Any, batch: Any, device: torch.device) -> tuple[Optional[str], Optional[tuple[float, float, bool]]]:
    """(why not compared, None) or (None, (|loss reversed - loss| / |loss|, |loss under another seed - loss| /
    |loss|, whether the model's output rows followed their examples))."""
    rows, _ = example_rows(batch)
    n = rows[0][1].shape[0]
    order = torch.arange(n - 1, -1, -1)
    per_example = {id(t) for _, t in rows}
    reversed_batch = map_tensors(batch, lambda t: t[order.to(t.device)] if id(t) in per_example else t)
    loss, inputs, outputs = _scored(setup, batch, device, seed=0)
    redrawn, _, _ = _scored(setup, batch, device, seed=1)
    loss_r, inputs_r, outputs_r = _scored(setup, reversed_batch, device, seed=0)
    if not inputs:
        return "the loss_fn never called the model's forward", None
    if not _rows_reversed(inputs, inputs_r, n):
        return "the loss_fn handed the model other inputs than the batch's own, reversed", None
    if not all(math.isfinite(x) for x in (loss, redrawn, loss_r)) or abs(loss) < MIN_LOSS:
        return "the loss is not finite, or about 0, on the batch", None
    return None, (abs(loss_r - loss) / abs(loss), abs(redrawn - loss) / abs(loss), _rows_reversed(outputs, outputs_r, n))


MIN_LOSS = 1e-6  # a loss about 0 has no relative change to read


def _scored(setup: Any, batch: Any, device: torch.device,
            seed: int) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
    """The loss as validation scores it (eval mode) under `seed` (the RNG put back after), with the tensors the
    model's first forward took and gave."""
    seen: dict[str, list[torch.Tensor]] = {}

    def hook(module, args, kwargs, output):
        if "inputs" not in seen:
            seen["inputs"] = [t.detach().float() for _, t in named_tensors((args, kwargs))]
            seen["outputs"] = [t.detach().float() for t in floating_tensors(output, min_dim=1)]

    handle = setup.model.register_forward_hook(hook, with_kwargs=True)
    try:
        with untouched_buffers_and_rng(setup.model), autocast(setup.precision, device):
            torch.manual_seed(seed)
            loss = loss_value(scored_loss(setup, batch))
    finally:
        handle.remove()
    return loss, seen.get("inputs", []), seen.get("outputs", [])


def _rows_reversed(before: list[torch.Tensor], after: list[torch.Tensor], n: int) -> bool:
    """Every tensor of `after` with a row per example is the same tensor of `before`, its rows reversed."""
    if len(before) != len(after) or not before:
        return False
    for a, b in zip(before, after):
        if a.shape != b.shape:
            return False
        if a.dim() >= 1 and a.shape[0] == n:
            a = a.flip(0)
        scale = 1 + (float(a.abs().max()) if a.numel() else 0.0)
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-5 * scale):
            return False
    return True


EXAMPLE_ORDER = Experiment(
    name="example_order",
    summary="Scores a batch as given and with its examples in reverse order: a loss over a set of examples does "
            "not change with their order, and each example's output follows it.",
    params=ExampleOrderParams,
    outcome=ExampleOrderOutcome,
    measure=measure,
)
