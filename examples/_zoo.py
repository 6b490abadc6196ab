"""Shared pieces of the fault zoo: small datasets made in code (or bundled with scikit-learn),
a stock PyTorch training loop, and checkpoint writing. Nothing here is downloaded."""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import triage


@functools.lru_cache(maxsize=1)
def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits as (x (1797, 64) float, y (1797,) int), read once per process
    from the file scikit-learn ships, without importing scikit-learn (a second or more of a demo's start)."""
    spec = importlib.util.find_spec("sklearn")
    bundled = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if bundled is None or not bundled.is_file():  # laid out otherwise: ask scikit-learn
        from sklearn.datasets import load_digits as from_sklearn

        return from_sklearn(return_X_y=True)
    data = np.loadtxt(bundled, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def digits_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0,
                   offset: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's bundled 8x8 digits (1797 images, no download), standardised, as (x, y) batches."""
    x, y = load_digits()
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    return [(x[i:i + batch_size], y[i:i + batch_size])
            for i in range(offset, offset + batch_size * n_batches, batch_size) if i + batch_size <= len(x)]


def train_plain(setup: triage.Setup, steps: int) -> list[float]:
    """The stock loop a user would write: zero_grad, forward under autocast, backward, clip, step.

    Uses the setup's own train_step when it has one. Stops at the first non-finite loss.
    """
    model, opt = setup.model, setup.optimizer
    model.train()
    losses = []
    for step in range(steps):
        batch = setup.batches[step % len(setup.batches)]
        if setup.train_step is not None:
            loss = setup.train_step(model, opt, batch)
            losses.append(float(loss))
        else:
            opt.zero_grad()
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = setup.loss_fn(model, batch)
            loss.backward()
            if setup.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), setup.grad_clip)
            opt.step()
            losses.append(float(loss.detach().float()))
        if setup.scheduler is not None:
            setup.scheduler.step()
        if not math.isfinite(losses[-1]):
            break
    return losses


def write_run_checkpoint(setup_fn: Callable[[], triage.Setup], path: Path, steps: int) -> Path:
    """Train the faulty run `steps` steps (seeded) and save the checkpoint it would have written."""
    torch.manual_seed(0)
    setup = setup_fn()
    history = train_plain(setup, steps) if steps else []
    return triage.save_checkpoint(path, setup.model, setup.optimizer, scheduler=setup.scheduler,
                                  scaler=setup.scaler, step=len(history), history=history)


def cross_entropy(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


# --- shared by the plateau / loop / data examples -------------------------------------------------

def digits_image_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0,
                         offset: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The digits as 1x8x8 images (B, 1, 8, 8), for the convolutional examples."""
    return [(x.view(-1, 1, 8, 8), y) for x, y in digits_batches(batch_size, n_batches, seed, offset)]


def majority_token_batches(batch_size: int = 64, n_batches: int = 16, seed: int = 0, vocab: int = 4,
                           length: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic sequences made in code: token ids (B, T) in [0, vocab); the label is the most frequent
    token (ties go to the smaller id). A recurrent model must count over the whole sequence."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (batch_size * n_batches, length), generator=g)
    counts = torch.nn.functional.one_hot(x, vocab).sum(1)  # (N, vocab)
    y = counts.argmax(1)
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]


class SequenceClassifier(torch.nn.Module):
    """Embedding -> GRU -> linear head on the last hidden state: (B, T) token ids -> (B, classes) logits."""

    def __init__(self, vocab: int = 4, classes: int = 4, dim: int = 32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x):
        out, _ = self.rnn(self.embed(x))  # (B, T, dim)
        return self.head(out[:, -1])


def resume(setup_fn: Callable[[], triage.Setup], path: Path) -> triage.Setup:
    """setup() with a zoo checkpoint loaded: the run as it stood when someone noticed it was stuck."""
    setup = setup_fn()
    state = torch.load(path, weights_only=True)
    setup.model.load_state_dict(state["model"])
    setup.optimizer.load_state_dict(state["optimizer"])
    if setup.scheduler is not None and state.get("scheduler") is not None:
        setup.scheduler.load_state_dict(state["scheduler"])
    return setup


@torch.no_grad()
def mean_loss(setup: triage.Setup, batches) -> float:
    """The loss over `batches` in eval mode (how a validation loss is measured)."""
    was_training = setup.model.training
    setup.model.eval()
    value = sum(float(setup.loss_fn(setup.model, b)) for b in batches) / len(batches)
    setup.model.train(was_training)
    return value


def train_with_val(setup: triage.Setup, steps: int, val_every: int) -> list[dict]:
    """train_plain's steps, logging {"step", "loss", "val_loss"} every `val_every` steps (a run's log)."""
    log = []
    for start in range(0, steps, val_every):
        losses = train_plain(setup, val_every)
        log.append({"step": start + val_every, "loss": losses[-1], "val_loss": mean_loss(setup, setup.val_batches)})
    return log


def write_logged_checkpoint(setup_fn: Callable[[], triage.Setup], path: Path, steps: int, val_every: int) -> Path:
    """Like write_run_checkpoint, but the history is the run's log: a list of {"step", "loss", "val_loss"}."""
    torch.manual_seed(0)
    setup = setup_fn()
    history = train_with_val(setup, steps, val_every)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": setup.model.state_dict(), "optimizer": setup.optimizer.state_dict(),
                "step": steps, "history": history}, path)
    return path


# --- divergence half of the zoo: more data made in code, and loss functions ---

def digits_raw_image_batches(raw_max: float, batch_size: int = 64, n_batches: int = 16, seed: int = 0,
                             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The digits as 1x8x8 images of raw intensities in [0, raw_max] (not standardised), (B, 1, 8, 8)."""
    x, y = load_digits()
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0 * raw_max
    y = torch.tensor(y, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    return [(x[i:i + batch_size], y[i:i + batch_size])
            for i in range(0, batch_size * n_batches, batch_size) if i + batch_size <= len(x)]


PAD = 0  # token id of padding in the synthetic sequences


def topic_sequence_batches(batch_size: int = 32, n_batches: int = 12, seq_len: int = 16, vocab: int = 32,
                           n_classes: int = 4, seed: int = 0, padded_from: int | None = None,
                           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Token sequences whose label is their "topic": half the tokens are the topic's own, half noise.

    Tokens of class c are 1 + c + n_classes * k; PAD (0) only pads. With `padded_from`, batches from that
    index on hold variable-length sequences (lengths seq_len/2 .. seq_len), right-padded with PAD;
    earlier batches are full length (a loader that serves the longest sequences first).
    Batches are (tokens (B, T) long, labels (B,) long).
    """
    g = torch.Generator().manual_seed(seed)
    per_class = (vocab - 1) // n_classes
    out = []
    for b in range(n_batches):
        y = torch.randint(0, n_classes, (batch_size,), generator=g)
        own = 1 + y[:, None] + n_classes * torch.randint(0, per_class, (batch_size, seq_len), generator=g)
        noise = torch.randint(1, 1 + n_classes * per_class, (batch_size, seq_len), generator=g)
        tokens = torch.where(torch.rand(batch_size, seq_len, generator=g) < 0.5, own, noise)
        if padded_from is not None and b >= padded_from:
            lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size,), generator=g)
            tokens[torch.arange(seq_len)[None, :] >= lengths[:, None]] = PAD
        out.append((tokens, y))
    return out


def adding_problem_batches(batch_size: int = 32, n_batches: int = 12, seq_len: int = 40, seed: int = 0,
                           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Hochreiter & Schmidhuber's adding problem: (value, marker) pairs; the target is the sum of the
    two marked values. Batches are (x (B, T, 2) float, target (B,) float)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        values = torch.rand(batch_size, seq_len, generator=g)
        marks = torch.zeros(batch_size, seq_len)
        first = torch.randint(0, seq_len // 2, (batch_size,), generator=g)
        second = torch.randint(seq_len // 2, seq_len, (batch_size,), generator=g)
        rows = torch.arange(batch_size)
        marks[rows, first] = 1.0
        marks[rows, second] = 1.0
        out.append((torch.stack([values, marks], dim=-1), (values * marks).sum(1)))
    return out


def mse(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x).squeeze(-1), y)


class TopicTransformer(torch.nn.Module):
    """A small pre-norm transformer encoder (torch's own layers), mean-pooled: (B, T) tokens -> (B, classes)."""

    def __init__(self, vocab: int = 32, classes: int = 4, dim: int = 32, depth: int = 2, heads: int = 4,
                 seq_len: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(seq_len, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens) + self.pos[: tokens.shape[1]])  # (B, T, dim)
        return self.head(h.mean(1))


class DigitsCNN(torch.nn.Module):
    """Two conv blocks with BatchNorm, then a linear head: (B, 1, 8, 8) images -> (B, 10) logits."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, channels, 3, padding=1), torch.nn.BatchNorm2d(channels), torch.nn.ReLU(),
            torch.nn.Conv2d(channels, 2 * channels, 3, padding=1), torch.nn.BatchNorm2d(2 * channels),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Linear(2 * channels * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))  # features: (B, 2C, 4, 4)
