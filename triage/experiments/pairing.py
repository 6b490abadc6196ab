"""Paired views: a model handed two inputs of one example (a CLIP image and its caption, two augmentations of
one image) whose loss reads no labels. The pairing row by row is then the run's only supervision: two loaders
shuffled apart, or a cache indexed by position, pair each row with another example's view, and a contrastive
loss sits at ln B with nothing wrong in the model or the optimizer.

Measured like labels unrelated to their inputs: for each example, its nearest neighbour in the first view's
space; where the views are paired, that neighbour's second view is nearer the example's own second view than
most others are; where not, it is as near as any.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch

from triage.batches import named_tensors
from triage.experiments.training import autocast, untouched_buffers_and_rng
from triage.load.data_guard import copy_batch

MIN_EXAMPLES = 32  # fewer examples than this leave the ranks too noisy to read


class _Stop(BaseException):
    """Raised by the forward pre-hook once the model's inputs are in hand (not an Exception: a loss's own
    `except Exception` must not swallow it)."""


def paired_views(session: Any) -> Optional[tuple[str, str]]:
    """The names of the first two floating tensors of the first batch that the loss hands the model's forward
    itself (as arguments of its top module), with as many rows as each other and at least 2 features each. None
    where there are not two."""
    setup, batch = session.setup, copy_batch(session.batches[0])
    floats = {t.untyped_storage().data_ptr(): name for name, t in named_tensors(batch)
              if t.is_floating_point() and t.dim() >= 2 and t[0].numel() >= 2}
    handed: list[str] = []

    def hook(module, args, kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in floats:
                handed.append(floats[value.untyped_storage().data_ptr()])
        raise _Stop

    handle = setup.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad(), untouched_buffers_and_rng(setup.model), autocast(setup.precision, session.device):
            inspect.unwrap(setup.loss_fn)(setup.model, batch)  # the data guard would hand it a copy
    except _Stop:
        pass
    except Exception:  # noqa: BLE001 - a loss that fails before its forward hands nothing
        return None
    finally:
        handle.remove()
    tensors = dict(named_tensors(batch))
    names = list(dict.fromkeys(handed))
    if len(names) < 2 or tensors[names[0]].shape[0] != tensors[names[1]].shape[0]:
        return None
    return names[0], names[1]


def pair_lift(batches: list[Any], views: tuple[str, str], max_examples: int) -> tuple[Optional[float], int]:
    """1 - 2 x the mean rank (0 nearest, 1 farthest) of each example's first-view nearest neighbour's second view
    among every other example's, by distance from the example's own second view: about 0 where the views are
    paired at random, up to 1 where each view finds its partner. And the examples compared."""
    firsts, seconds = [], []
    for batch in batches:
        tensors = dict(named_tensors(batch))
        a, b = tensors.get(views[0]), tensors.get(views[1])
        if a is None or b is None or a.shape[0] != b.shape[0]:
            return None, 0
        firsts.append(a.reshape(a.shape[0], -1).double().cpu())
        seconds.append(b.reshape(b.shape[0], -1).double().cpu())
        if sum(len(x) for x in firsts) >= max_examples:
            break
    x, y = torch.cat(firsts)[:max_examples], torch.cat(seconds)[:max_examples]
    keep = torch.isfinite(x).all(dim=1) & torch.isfinite(y).all(dim=1)
    x, y = x[keep], y[keep]
    n = len(x)
    if n < MIN_EXAMPLES:
        return None, n
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    y = (y - y.mean(0)) / y.std(0).clamp_min(1e-6)
    dx, dy = torch.cdist(x, x), torch.cdist(y, y)
    dx.fill_diagonal_(float("inf"))
    neighbour = dx.argmin(dim=1)
    dy.fill_diagonal_(float("inf"))  # an example's own second view is not among the others
    rows = torch.arange(n)
    nearer = (dy < dy[rows, neighbour][:, None]).sum(dim=1).double()  # others nearer than the neighbour's view
    return float(1 - 2 * (nearer / (n - 2)).mean()), n
