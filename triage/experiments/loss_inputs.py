"""What the run's loss function hands a loss that takes raw scores (`binary_cross_entropy_with_logits`,
`cross_entropy`, and the nn modules that call them), seen by wrapping those functions of
torch.nn.functional while the run's loss_fn runs. A model that squashes its scores outside forward() (a
link predictor's decode() ending in .sigmoid()) shows it here, not in its output. Code that imported the
function itself (`from torch.nn.functional import cross_entropy`) before the wrap is not seen."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F

from triage.experiments.interventions import SQUASH_TOLERANCE

SCORE_LOSSES = ("binary_cross_entropy_with_logits", "cross_entropy")


@dataclass
class ScoresSeen:
    """The inputs the score losses were handed: how many calls, and whether every one lay in [0, 1]."""

    calls: int = 0
    all_in_unit_interval: bool = True

    def add(self, scores: torch.Tensor) -> None:
        self.calls += 1
        finite = bool(torch.isfinite(scores).all())
        self.all_in_unit_interval &= finite and bool(
            (scores.min() >= -SQUASH_TOLERANCE) & (scores.max() <= 1 + SQUASH_TOLERANCE))

    @property
    def squashed(self) -> bool:
        return self.calls > 0 and self.all_in_unit_interval


@contextlib.contextmanager
def score_losses(transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> Iterator[ScoresSeen]:
    """Within: every call of a score loss records its input, and hands the loss `transform(input)` instead
    where a transform is given (the squashing undone, say). Put back on exit."""
    seen = ScoresSeen()
    originals = {name: getattr(F, name) for name in SCORE_LOSSES}

    def wrapped(original):
        @functools.wraps(original)
        def call(input, *args, **kwargs):
            seen.add(input.detach())
            return original(transform(input) if transform is not None else input, *args, **kwargs)
        return call

    for name, original in originals.items():
        setattr(F, name, wrapped(original))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(F, name, original)
