"""Shared pieces of the second held-out set: puts the zoo's examples/ on sys.path (so `_zoo` imports), and
adds data and models neither the zoo nor the first held-out set uses (a GRU language model, a 1-D CNN on
pulse sequences, a residual MLP, an autoencoder, a patch transformer on the digits; scikit-learn's bundled
wine / iris / breast-cancer tables). Every module of benchmarks/holdout2/ imports this first.
Nothing here is downloaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(_EXAMPLES) not in sys.path:
    sys.path.insert(0, str(_EXAMPLES))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

Batches = list[tuple[torch.Tensor, torch.Tensor]]


# --- data -------------------------------------------------------------------------------------------

def table_batches(name: str, batch_size: int = 32, seed: int = 0, standardise: bool = True,
                  start: int = 0, stop: int | None = None) -> Batches:
    """One of scikit-learn's bundled tables ("wine", "iris", "breast_cancer"), shuffled (seeded), rows
    start..stop of that order, as (x (B, F) float, y (B,) long) batches. Standardised with the statistics of
    the whole table when `standardise` (raw units otherwise). The last partial batch is dropped."""
    from sklearn import datasets

    x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    if standardise:
        x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order][start:stop], y[order][start:stop]
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x) - batch_size + 1, batch_size)]


def markov_text_batches(batch_size: int = 32, n_batches: int = 12, seq_len: int = 24, vocab: int = 16,
                        seed: int = 0) -> Batches:
    """A made-up "language": a sparse first-order Markov chain over `vocab` tokens (each token has 3 likely
    successors). Batches are next-token pairs (inputs (B, T) long, targets (B, T) long = inputs shifted by one)."""
    chain_g = torch.Generator().manual_seed(77)  # the same language whatever the data seed
    logits = torch.full((vocab, vocab), -4.0)
    for t in range(vocab):
        logits[t, torch.randperm(vocab, generator=chain_g)[:3]] = torch.tensor([2.0, 1.0, 0.5])
    probs = logits.softmax(-1)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        seq = torch.empty(batch_size, seq_len + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, vocab, (batch_size,), generator=g)
        for t in range(seq_len):
            seq[:, t + 1] = torch.multinomial(probs[seq[:, t]], 1, generator=g).squeeze(1)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def pulse_batches(batch_size: int = 32, n_batches: int = 12, length: int = 64, seed: int = 0,
                  amplitude: float = 1.0) -> Batches:
    """1-channel sensor traces (B, 1, length): a pulse of one of 4 shapes (square, triangle, sine burst,
    two spikes) at a random place, plus noise; the label is the shape. Batches (x float, y long)."""
    g = torch.Generator().manual_seed(seed)
    width = 12
    ramp = torch.linspace(0, 1, width)
    shapes = torch.stack([torch.ones(width), 1 - (2 * ramp - 1).abs(), torch.sin(6.283 * 2 * ramp),
                          (torch.arange(width) % 6 == 0).float() * 2])
    out = []
    for _ in range(n_batches):
        y = torch.randint(0, 4, (batch_size,), generator=g)
        x = 0.3 * torch.randn(batch_size, 1, length, generator=g)
        starts = torch.randint(0, length - width, (batch_size,), generator=g)
        for i in range(batch_size):
            x[i, 0, starts[i]:starts[i] + width] += shapes[y[i]]
        out.append((x * amplitude, y))
    return out


def digit_autoencoder_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0) -> Batches:
    """The digits (B, 64) in [0, 1], with the input as its own target (an autoencoder's batches)."""
    from _zoo import digits_batches

    out = []
    for x, _ in digits_batches(batch_size, n_batches, seed):
        x = (x - x.min()) / (x.max() - x.min())
        out.append((x, x))
    return out


# --- models -----------------------------------------------------------------------------------------

class GRULanguageModel(nn.Module):
    """Embedding -> GRU -> per-token head: (B, T) ids -> (B, T, vocab) next-token logits."""

    def __init__(self, vocab: int = 16, dim: int = 48, layers: int = 1):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)


def next_token_loss(model, batch):
    """Per-token cross-entropy of a language model, averaged over every position."""
    x, y = batch
    logits = model(x)  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class PulseCNN(nn.Module):
    """A 1-D CNN: conv-ReLU x3 with pooling, global average pool, linear head: (B, 1, L) -> (B, 4)."""

    def __init__(self, channels: int = 16, classes: int = 4, norm: bool = False):
        super().__init__()
        def block(a, b):
            return [nn.Conv1d(a, b, 5, padding=2)] + ([nn.BatchNorm1d(b)] if norm else []) + [nn.ReLU()]
        self.features = nn.Sequential(*block(1, channels), nn.MaxPool1d(2), *block(channels, channels),
                                      nn.MaxPool1d(2), *block(channels, 2 * channels))
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(-1))


class ResidualMLP(nn.Module):
    """Input projection, `depth` pre-norm residual blocks (LayerNorm -> Linear -> ReLU -> Linear), head."""

    def __init__(self, inputs: int, outputs: int, width: int = 64, depth: int = 4, norm: bool = True):
        super().__init__()
        self.inp = nn.Linear(inputs, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width) if norm else nn.Identity(), nn.Linear(width, 2 * width), nn.ReLU(),
                          nn.Linear(2 * width, width)) for _ in range(depth))
        self.head = nn.Linear(width, outputs)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class AutoEncoder(nn.Module):
    """64 -> 32 -> 8 -> 32 -> 64 with ReLU, sigmoid output (pixels in [0, 1])."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 64))

    def forward(self, x):
        return torch.sigmoid(self.decoder(self.encoder(x)))


def reconstruction_loss(model, batch):
    x, target = batch
    return F.mse_loss(model(x), target)


class PatchTransformer(nn.Module):
    """A small ViT: 8x8 digits cut into 16 patches of 2x2, linear patch embedding + learned positions + a
    class token, pre-norm transformer encoder, head on the class token. (B, 1, 8, 8) -> (B, 10)."""

    def __init__(self, dim: int = 32, depth: int = 2, heads: int = 4, patch: int = 2):
        super().__init__()
        self.patch = patch
        n = (8 // patch) ** 2
        self.embed = nn.Linear(patch * patch, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(n + 1, dim))
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, images):
        b, p = images.shape[0], self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p).reshape(b, -1, p * p)  # (B, 16, 4)
        h = torch.cat([self.cls.expand(b, 1, -1), self.embed(patches)], 1) + self.pos
        return self.head(self.norm(self.encoder(h))[:, 0])
