"""Shared pieces of the held-out set: puts the zoo's examples/ on sys.path (so `_zoo` imports), and adds
data and models the zoo does not use, so that a held-out fault is a differently built run, not a copy.

Every held-out module imports this first. Nothing here is downloaded: data is made in code or comes
from scikit-learn's bundled digits.
"""

from __future__ import annotations

import sys
from pathlib import Path

_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(_EXAMPLES) not in sys.path:
    sys.path.insert(0, str(_EXAMPLES))

import torch  # noqa: E402
from torch import nn  # noqa: E402

Batches = list[tuple[torch.Tensor, torch.Tensor]]


# --- data -------------------------------------------------------------------------------------------

def regression_batches(batch_size: int = 64, n_batches: int = 16, features: int = 16, seed: int = 0,
                       target_scale: float = 1.0, noise: float = 0.1) -> Batches:
    """Synthetic tabular regression: x ~ N(0, 1) (B, features); the target (B,) is a fixed smooth
    nonlinear function of x (a random two-layer tanh net), plus noise, times `target_scale`."""
    g = torch.Generator().manual_seed(seed)
    teacher_g = torch.Generator().manual_seed(1234)  # the same function whatever the data seed
    w1 = torch.randn(features, 32, generator=teacher_g) / features ** 0.5
    w2 = torch.randn(32, generator=teacher_g) / 32 ** 0.5
    out = []
    for _ in range(n_batches):
        x = torch.randn(batch_size, features, generator=g)
        y = torch.tanh(x @ w1) @ w2 * 3.0 + noise * torch.randn(batch_size, generator=g)
        out.append((x, y * target_scale))
    return out


# Columns of a tabular "loan" dataset in their raw units: income ($), loan amount ($), area (sq ft),
# age (years), ... The magnitudes are what matter here: up to ~1e5.
TABULAR_SCALES = torch.tensor([9e4, 3e4, 2e3, 40.0, 5.0, 1.0, 2e5, 700.0, 12.0, 1.0, 3e3, 60.0])


def tabular_class_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0, classes: int = 3,
                          raw_units: bool = True) -> Batches:
    """Synthetic tabular classification: 12 positive features in raw units (TABULAR_SCALES) or
    standardised; the class (0..classes-1) is a thresholded linear score of the standardised money columns."""
    g = torch.Generator().manual_seed(seed)
    # The label depends on the money columns (income, loan amount, savings) and the area, as credit risk would.
    direction = torch.zeros(len(TABULAR_SCALES))
    direction[[0, 1, 6, 2]] = torch.tensor([1.0, -1.0, 0.7, 0.5])
    out = []
    for _ in range(n_batches):
        z = torch.randn(batch_size, len(TABULAR_SCALES), generator=g)  # standardised features
        score = z @ direction / direction.norm()
        y = torch.bucketize(score, torch.tensor([-0.43, 0.43])) if classes == 3 else (score > 0).long()
        x = (1.5 + 0.5 * z).clamp(min=0.05) * TABULAR_SCALES if raw_units else z
        out.append((x, y))
    return out


def tone_batches(batch_size: int = 32, n_batches: int = 12, channels: int = 8, length: int = 48,
                 classes: int = 4, seed: int = 0, silence: float = 0.0) -> Batches:
    """Synthetic multichannel "audio features" (B, channels, length): class c is a sinusoid of frequency
    c + 1 on a random subset of channels, plus noise. With `silence`, that share of the clips is digital
    silence (exact zeros, a muted recorder), labelled `classes` (an extra class). Labels (B,) long."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length, dtype=torch.float32) / length
    out = []
    for _ in range(n_batches):
        y = torch.randint(0, classes, (batch_size,), generator=g)
        phase = 6.283 * torch.rand(batch_size, channels, 1, generator=g)
        on = (torch.rand(batch_size, channels, 1, generator=g) < 0.6).float()
        wave = torch.sin(6.283 * (y[:, None, None] + 1) * t + phase) * on
        x = wave + 0.3 * torch.randn(batch_size, channels, length, generator=g)
        muted = torch.rand(batch_size, generator=g) < silence
        out.append((x * ~muted[:, None, None], torch.where(muted, classes, y)))
    return out


def multilabel_digit_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0) -> Batches:
    """The digits with four binary attributes as multi-label float targets (B, 4):
    even, >= 5, prime, has a closed loop (0, 6, 8, 9)."""
    from _zoo import digits_batches

    table = torch.tensor([[d % 2 == 0, d >= 5, d in (2, 3, 5, 7), d in (0, 6, 8, 9)] for d in range(10)],
                         dtype=torch.float32)  # (10, 4)
    return [(x, table[y]) for x, y in digits_batches(batch_size, n_batches, seed)]


# --- models -----------------------------------------------------------------------------------------

def mlp(sizes: list[int], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Linear layers of the given widths with `activation` between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class PlainCNN(nn.Module):
    """A CNN without normalisation layers: (B, 1, 8, 8) -> conv-ReLU x3 -> 2x2 pool (B, 32, 4, 4) -> (B, 10)."""

    def __init__(self, channels: int = 16, softmax_output: bool = False):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * channels * 16, 64), nn.ReLU(),
                                        nn.Linear(64, 10))
        self.softmax_output = softmax_output

    def forward(self, x):
        logits = self.classifier(self.features(x))
        return logits.softmax(-1) if self.softmax_output else logits


class LSTMClassifier(nn.Module):
    """Embedding -> 2-layer LSTM -> linear head on the mean of the outputs: (B, T) ids -> (B, classes)."""

    def __init__(self, vocab: int = 4, classes: int = 4, dim: int = 32, no_grad_encoder: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, classes)
        self.no_grad_encoder = no_grad_encoder

    def encode(self, x):
        out, _ = self.lstm(self.embed(x))  # (B, T, dim)
        return out.mean(1)

    def forward(self, x):
        if self.no_grad_encoder:
            with torch.no_grad():  # the bug of no_gradient_flow_lstm: see that module
                h = self.encode(x)
        else:
            h = self.encode(x)
        return self.head(h)


class PostNormTransformer(nn.Module):
    """Embedding + learned positions -> post-norm transformer encoder (GELU) -> first-token pooling -> head.
    (B, T) ids -> (B, classes). Unlike the zoo's TopicTransformer: post-norm, GELU, first-token pooling."""

    def __init__(self, vocab: int = 32, classes: int = 4, dim: int = 48, depth: int = 2, heads: int = 4,
                 seq_len: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len + 1, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        b, t = tokens.shape
        h = torch.cat([self.cls.expand(b, 1, -1), self.embed(tokens)], 1)  # (B, T+1, dim)
        h = self.encoder(h + self.pos(torch.arange(t + 1)))
        return self.head(h[:, 0])


def mse_loss(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1), y)
