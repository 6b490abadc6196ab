"""The data snapshot stays as it was: the user's `loss_fn` and `train_step` get a copy of each batch.

On CPU `.to(device)` returns the very tensor it was given, so without this a `loss_fn` that changes its
batch in place (normalising, masking, casting to another dtype; common in real code) would change the
snapshot itself: the second replay would start from other data than the first, and a verdict could
rest on that difference. In the failing run a DataLoader usually hands out fresh tensors every epoch,
so the in-place change did no harm there. Here every call gets a fresh copy of the snapshot batch, and
the copy is compared with the original after the first calls: a `loss_fn` that changed it is reported
as a finding (`loss_fn_mutates_batch`), naming the batch and what changed.

The guard also names the snapshot batch a call raised on (Python 3.11+: a note on the exception, shown
with its traceback in the report).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from triage.batches import map_tensors, named_tensors
from triage.contract import Setup
from triage.load.snapshot import rng_state, set_rng_state

log = logging.getLogger(__name__)

# What autograd says when a function that takes a gradient itself runs under torch.no_grad().
NEEDS_GRAD = ("does not require grad", "does not have a grad_fn")
CHECKED_CALLS = 32  # calls of each callable whose batch copy is compared with the original afterwards
_PLAIN = (str, bytes, int, float, bool, type(None))


@dataclass(frozen=True)
class Mutation:
    """One call that changed its batch: which callable, which snapshot batch, what changed."""

    callable: str  # "loss_fn" or "train_step"
    batch: str  # "batch 3", "validation batch 0", or "a batch triage derived" (a slice of one)
    changes: tuple[str, ...]


@dataclass
class DataGuard:
    """Hands the user's callables copies of the snapshot batches and notices when they change them."""

    batches: list[Any]
    val_batches: list[Any]
    mutations: list[Mutation] = field(default_factory=list)
    _checked: dict[str, int] = field(default_factory=dict)

    def protect(self, setup: Setup) -> Setup:
        """The same Setup with `loss_fn` and `train_step` wrapped (the model and optimizer are shared)."""
        update: dict[str, Any] = {"loss_fn": _Guarded(setup.loss_fn, "loss_fn", self)}
        if setup.train_step is not None:
            update["train_step"] = _Guarded(setup.train_step, "train_step", self)
        return setup.model_copy(update=update)

    def where(self, batch: Any) -> str:
        for i, b in enumerate(self.batches):
            if b is batch:
                return f"snapshot batch {i} (of {len(self.batches)})"
        for i, b in enumerate(self.val_batches):
            if b is batch:
                return f"validation batch {i} (of {len(self.val_batches)})"
        return "a batch derived from the snapshot (a slice or a subset)"

    def should_check(self, name: str) -> bool:
        done = self._checked.get(name, 0)
        self._checked[name] = done + 1
        return done < CHECKED_CALLS and not any(m.callable == name for m in self.mutations)

    def record(self, name: str, batch: Any, changes: list[str]) -> None:
        mutation = Mutation(callable=name, batch=self.where(batch), changes=tuple(changes[:6]))
        self.mutations.append(mutation)
        log.warning("%s changed its batch in place (%s: %s); every call now gets a copy, so the experiments "
                    "still start from the same data", name, mutation.batch, "; ".join(mutation.changes))

    def findings(self) -> list[tuple[str, str]]:
        """(id, text) of the report's finding, when a callable changed its batch."""
        if not self.mutations:
            return []
        parts = [f"{m.callable} on {m.batch}: {'; '.join(m.changes)}" for m in self.mutations]
        names = " and ".join(sorted({m.callable for m in self.mutations}))
        return [("loss_fn_mutates_batch",
                 f"{names} changes the batch it is given in place ({' · '.join(parts)}). triage gave every call "
                 "a fresh copy of the snapshot, so each experiment started from the same data. In your run "
                 "it is harmless only while the DataLoader makes new tensors for every batch; with a list of "
                 "tensors, or a dataset that returns stored ones, every epoch changes the data again. Work "
                 "on a copy inside it (x = (x - mean) / std, not x.sub_(mean); y = y.float(), not batch[1] "
                 "= ...).")]


class _Guarded:
    """`fn(*head, batch)` called with a copy of `batch`; the copy compared with the batch afterwards."""

    def __init__(self, fn: Callable[..., Any], name: str, guard: DataGuard) -> None:
        self.fn, self.name, self.guard = fn, name, guard
        self.__wrapped__ = fn  # inspect.unwrap and friends see the user's function
        # A loss that differentiates inside itself (a gradient penalty on its inputs, a PINN's derivatives)
        # cannot run where triage reads a loss without gradients (torch.no_grad): once it has needed them,
        # it gets them in every call (its value is the same; only the graph it builds is kept a little longer).
        self.needs_grad = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not args:
            return self.fn(*args, **kwargs)
        *head, batch = args
        working = copy_batch(batch)
        check = self.guard.should_check(self.name)
        try:
            result, working = self._called(head, batch, working, kwargs)
        except Exception as exc:
            if hasattr(exc, "add_note"):
                exc.add_note(f"triage: {self.name} raised on {self.guard.where(batch)}")
            raise
        if check:
            changes = differences(batch, working)
            if changes:
                self.guard.record(self.name, batch, changes)
        return result

    def _called(self, head: list, batch: Any, working: Any, kwargs: dict) -> tuple[Any, Any]:
        """The user's function on `working`; under no_grad, where autograd says it needs gradients, once more
        with them on (from the same RNG state and a fresh copy)."""
        if torch.is_grad_enabled() or self.needs_grad:
            with torch.enable_grad():
                return self.fn(*head, working, **kwargs), working
        state = rng_state()
        try:
            return self.fn(*head, working, **kwargs), working
        except RuntimeError as exc:
            if not any(sign in str(exc) for sign in NEEDS_GRAD):  # the user's own error, raised as it is
                raise
            set_rng_state(state)
            working = copy_batch(batch)
            with torch.enable_grad():
                result = self.fn(*head, working, **kwargs)
            self.needs_grad = True
            log.info("%s differentiates inside itself: it runs with gradients on where triage reads it", self.name)
            return result, working

    def __getattr__(self, name: str) -> Any:  # the user's callable may be an object with attributes
        fn = self.__dict__.get("fn")
        if fn is None:
            raise AttributeError(name)
        return getattr(fn, name)


def copy_batch(batch: Any) -> Any:
    """A copy of a batch that shares no tensor, list or dict with it. Objects triage does not know
    (a tokenizer's BatchEncoding, a dataclass) are deep-copied; one that cannot be is passed as it is."""
    def leaf(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().clone() if not value.requires_grad else value.clone()
        if isinstance(value, _PLAIN):
            return value
        try:
            return copy.deepcopy(value)
        except Exception:  # noqa: BLE001  (an uncopyable object: the user's own)
            return value
    return map_tensors(batch, leaf) if isinstance(batch, (torch.Tensor, dict, list, tuple)) else leaf(batch)


@torch.no_grad()
def differences(original: Any, copied: Any) -> list[str]:
    """What differs between a batch and the copy a callable was given: keys, dtypes, shapes, values."""
    before, after = dict(named_tensors(original)), dict(named_tensors(copied))
    changes = [f"{key} removed" for key in before if key not in after]
    changes += [f"{key} added" for key in after if key not in before]
    for key, a in before.items():
        b = after.get(key)
        if b is None:
            continue
        if a.dtype != b.dtype:
            changes.append(f"{key} dtype {_dtype(a)} → {_dtype(b)}")
        elif tuple(a.shape) != tuple(b.shape):
            changes.append(f"{key} shape {tuple(a.shape)} → {tuple(b.shape)}")
        elif a.device != b.device:
            changes.append(f"{key} moved {a.device} → {b.device}")
        elif not _same_values(a, b):
            changes.append(f"{key} values changed")
    if not changes and _structure(original) != _structure(copied):
        changes.append("its structure changed (a list or dict entry replaced)")
    return changes


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _structure(batch: Any) -> Optional[str]:
    """Containers and plain values, not tensors: a replaced string or count shows here."""
    if isinstance(batch, torch.Tensor):
        return "T"
    if isinstance(batch, dict):
        return "{" + ",".join(f"{k!r}:{_structure(v)}" for k, v in batch.items()) + "}"
    if isinstance(batch, (list, tuple)):
        return "[" + ",".join(_structure(v) for v in batch) + "]"
    return repr(batch) if isinstance(batch, _PLAIN) else type(batch).__name__
