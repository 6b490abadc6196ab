"""A loss made of named terms: `loss_fn(model, batch)` returning {"task": ..., "balance": ...}.

The loss the run trains on is the sum of the terms. Where `Setup.auxiliary_terms` names some of them (a
regulariser, a load-balancing loss), triage trains on the sum and *reads* the objective, the other terms:
every loss triage records, compares or holds to a level is the objective's value, so a candidate that
changes an auxiliary term is judged by what both runs share, never by the term it changed. The auxiliary
terms still reach the gradient, at `aux_scale` times their weight (1 as the run had them).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional

import torch

from triage.contract import Setup
from triage.errors import SetupError


class TermsLoss:
    """loss_fn(model, batch) -> the objective's value, with the gradient of objective + aux_scale x auxiliaries."""

    def __init__(self, loss_fn: Callable[..., Any], auxiliary: tuple[str, ...]) -> None:
        self.loss_fn, self.auxiliary, self.aux_scale = loss_fn, auxiliary, 1.0
        self.__wrapped__ = loss_fn  # the user's function, for whatever reads its source

    def __getattr__(self, name: str) -> Any:  # the user's callable may be an object with attributes
        fn = self.__dict__.get("loss_fn")
        if fn is None:
            raise AttributeError(name)
        return getattr(fn, name)

    def __call__(self, model: Any, batch: Any) -> Any:
        found = self.loss_fn(model, batch)
        terms = self._read(found)
        if terms is None:
            return found  # a plain scalar (or whatever it is: the session's check says what was expected)
        objective = _total(v for k, v in terms.items() if k not in self.auxiliary)
        if not self.auxiliary or self.aux_scale == 0:
            return objective  # without the auxiliary terms at all: a non-finite one cannot reach the gradient
        extra = _total(terms[k] for k in self.auxiliary) * self.aux_scale
        # extra - extra.detach() is 0 in value and extra in gradient: the value read is the objective's.
        return objective + (extra - extra.detach())

    def _read(self, found: Any) -> Optional[dict[str, torch.Tensor]]:
        """What loss_fn returned, checked: scalar tensors by name, every auxiliary one among them (None: a plain
        loss, with no auxiliary terms declared)."""
        if not isinstance(found, Mapping):
            if self.auxiliary:
                raise SetupError(
                    f"Expected loss_fn(model, batch) to return a dict of named loss terms including "
                    f"{list(self.auxiliary)} (Setup.auxiliary_terms), found {_what(found)}. Return the terms, "
                    "e.g. {'task': F.cross_entropy(out, y), 'l2': lam * w.pow(2).sum()}, or leave auxiliary_terms "
                    "out.")
            return None
        missing = [name for name in self.auxiliary if name not in found]
        if not found or missing or len(found) == len(self.auxiliary):
            raise SetupError(
                f"Expected loss_fn's terms to hold every name in Setup.auxiliary_terms and at least one term of the "
                f"objective besides them, found terms {list(found)} for auxiliary_terms {list(self.auxiliary)}. Name "
                "only terms loss_fn returns, and leave the task's own term(s) out of auxiliary_terms.")
        for name, value in found.items():
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                shape = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) \
                    else type(value).__name__
                raise SetupError(f"Expected loss term '{name}' to be a scalar tensor, found {shape}. Return each "
                                 "term as a mean (or sum) over the batch.")
        return dict(found)


def _what(found: Any) -> str:
    return "a single tensor" if isinstance(found, torch.Tensor) else type(found).__name__


def _total(values: Any) -> torch.Tensor:
    values = list(values)
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def with_terms(setup: Setup) -> Setup:
    """The Setup with its loss_fn read through TermsLoss (a dict of terms summed; auxiliary terms not read)."""
    return setup.model_copy(update={"loss_fn": TermsLoss(setup.loss_fn, tuple(setup.auxiliary_terms))})


def terms_of(setup: Setup) -> Optional[TermsLoss]:
    """The TermsLoss under setup.loss_fn (through whatever wraps it), where the run declares auxiliary terms."""
    fn = _terms_loss(setup)
    return fn if fn is not None and fn.auxiliary else None


def _terms_loss(setup: Setup) -> Optional[TermsLoss]:
    fn = inspect.unwrap(setup.loss_fn, stop=lambda f: isinstance(f, TermsLoss))
    return fn if isinstance(fn, TermsLoss) else None


@contextlib.contextmanager
def scaled_terms(setup: Setup, factor: float) -> Iterator[None]:
    """The auxiliary terms' gradient at `factor` x their weight while inside (the value read is unchanged)."""
    terms = terms_of(setup)
    if terms is None or factor == 1.0:
        yield
        return
    before, terms.aux_scale = terms.aux_scale, factor
    try:
        yield
    finally:
        terms.aux_scale = before


def dict_terms(setup: Setup, model: Any, batch: Any) -> list[str]:
    """The names of the terms loss_fn returns on `batch` where it returns several, Setup.auxiliary_terms
    names none, and one optimizer trains them all ([] otherwise: with several optimizers, each term is one
    network's objective by design, a GAN's generator term the only one to train the generator)."""
    fn = _terms_loss(setup)
    if fn is None or fn.auxiliary or len(getattr(setup.optimizer, "optimizers", {})) > 1:
        return []
    found = fn.loss_fn(model, batch)
    return list(found) if isinstance(found, Mapping) and len(found) >= 2 else []


@contextlib.contextmanager
def read_as_auxiliary(setup: Setup, names: tuple[str, ...]) -> Iterator[None]:
    """While inside, `names` are read as auxiliary terms (the loss's value is the other terms'), though
    Setup.auxiliary_terms did not name them."""
    fn = _terms_loss(setup)
    before, fn.auxiliary = fn.auxiliary, names
    try:
        yield
    finally:
        fn.auxiliary = before
