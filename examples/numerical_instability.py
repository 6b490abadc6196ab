"""numerical_instability: a small transformer encoder whose hand-written RMSNorm has no eps, and which zeroes
padded positions after every block: from the first batch with padding (batch 4), `encoder.blocks.1.norm`
computes 0/0 = NaN on those rows, at any lr and any clip. Fix: an eps inside the sqrt (as torch.nn.RMSNorm has)."""

from __future__ import annotations

import torch
from torch import nn

import triage
from _zoo import PAD, cross_entropy, topic_sequence_batches, write_run_checkpoint

ROOT_CAUSE = "numerical_instability"
FIRST_PADDED_BATCH = 4  # the loader serves full-length sequences first
LOCATION = {"module": "encoder.blocks.1.norm"}  # what triage should point at


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """A parallel pre-norm block (attention and MLP read the same normalised input)."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(dim, eps)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x, pad):  # x: (B, T, dim), pad: (B, T) True where padded
        h = self.norm(x)
        x = x + self.attn(h, h, h, key_padding_mask=pad, need_weights=False)[0] + self.mlp(h)
        return x * (~pad)[..., None]  # padded positions are zeroed after every block


class Encoder(nn.Module):
    def __init__(self, dim: int, heads: int, depth: int, eps: float):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads, eps) for _ in range(depth))

    def forward(self, x, pad):
        for block in self.blocks:
            x = block(x, pad)
        return x


class PaddedTopicModel(nn.Module):
    def __init__(self, eps: float, vocab: int = 32, classes: int = 4, dim: int = 32, seq_len: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.encoder = Encoder(dim, heads=4, depth=3, eps=eps)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        pad = tokens == PAD
        h = self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]], pad)  # (B, T, dim)
        keep = (~pad)[..., None].float()
        return self.head((h * keep).sum(1) / keep.sum(1))  # mean over real tokens


def _setup(eps: float) -> triage.Setup:
    model = PaddedTopicModel(eps)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                        loss_fn=cross_entropy, batches=topic_sequence_batches(padded_from=FIRST_PADDED_BATCH))


def setup() -> triage.Setup:
    return _setup(eps=0.0)


def fixed_setup() -> triage.Setup:
    return _setup(eps=1e-6)


def write_checkpoint(path):
    return write_run_checkpoint(setup, path, steps=FIRST_PADDED_BATCH)  # trained up to the first padded batch
