"""numerical_instability: a GRU classifier with masked attention pooling that fills padded positions with -inf
before the softmax. From batch 6 on the loader also serves empty documents (all padding): softmax over a row of
-inf is 0/0 = NaN, at any learning rate and any clipping. Fix: fill with a large finite negative (-1e4), so an
empty row pools uniformly instead of to NaN."""

from __future__ import annotations

import _holdout2  # noqa: F401
import torch
from torch import nn

import triage
from _zoo import PAD, cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "numerical_instability"
FIRST_EMPTY_BATCH = 6


class AttentionPoolGRU(nn.Module):
    def __init__(self, mask_value: float, vocab: int = 32, dim: int = 32, classes: int = 4):
        super().__init__()
        self.mask_value = mask_value
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.score = nn.Linear(dim, 1)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h, _ = self.rnn(self.embed(tokens))                        # (B, T, dim)
        scores = self.score(h).squeeze(-1).masked_fill(tokens == PAD, self.mask_value)
        weights = scores.softmax(-1)                                # (B, T)
        return self.head((weights.unsqueeze(-1) * h).sum(1))


def _batches():
    batches = topic_sequence_batches(padded_from=3)
    for i in range(FIRST_EMPTY_BATCH, len(batches)):
        batches[i][0][:2] = PAD  # two empty documents per batch
    return batches


def _setup(mask_value: float) -> triage.Setup:
    model = AttentionPoolGRU(mask_value)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=cross_entropy, batches=_batches())


def setup() -> triage.Setup:
    return _setup(float("-inf"))


def fixed_setup() -> triage.Setup:
    return _setup(-1e4)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=FIRST_EMPTY_BATCH)
