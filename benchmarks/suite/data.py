"""The families' data, made in code or taken from scikit-learn's bundled tables (no download), and the
data faults applied to it (non-finite values, blank examples, a batch in other units, shuffled labels,
label noise, validation copied from training).

A batch is a tuple of tensors: (inputs, targets, per-example loss weights) for the classifiers and the
language model (the weights are all 1: a data-mixing or class-balancing weight), (inputs, targets) for
the regressor and the binary classifier (its targets floats 0/1). Data faults name the item they
touch: INPUTS or WEIGHTS.
"""

from __future__ import annotations

import functools
import math

import torch

from suite.config import DataConfig

Batch = tuple[torch.Tensor, ...]

INPUTS, TARGETS, WEIGHTS = 0, 1, 2  # items of a batch

PAD = 0            # transformer_lm: the padding token; the Markov "language" uses ids 1..VOCAB-1
VOCAB = 16
SEQ_LEN = 16
TRACE_LEN = 20     # rnn: time steps of a sensor trace
TRACE_CLASSES = 4
TRACE_CHANNELS = 3
POOL = 1200        # examples made per family: training rows first, validation rows last
VAL_START = POOL - 6 * 32  # validation rows: after every row any training set here uses (at most 24 x 32)


# --- raw examples, one tensor per batch item ------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32)
    return (x - x.mean(0)) / (x.std(0) + 1e-6), torch.tensor(y, dtype=torch.long)


def _shuffled(tensors: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, ...]:
    order = torch.randperm(len(tensors[0]), generator=torch.Generator().manual_seed(seed))
    return tuple(t[order] for t in tensors)


def digits_vectors(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 8x8 digits as standardised 64-vectors (N, 64), labels (N,) and weights (N,), in a seeded order."""
    x, y = _shuffled(_digits(), seed)
    return x, y, torch.ones(len(y))


def digits_images(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, y, w = digits_vectors(seed)
    return x.view(-1, 1, 8, 8), y, w


@functools.lru_cache(maxsize=8)
def sensor_traces(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three-channel sensor traces (N, TRACE_LEN, 3): a pulse of one of 4 shapes (square, ramp, sine
    burst, spikes) at a random time, seen by each channel with its own gain, plus noise. The label (N,)
    is the shape; weights (N,) are 1."""
    g = torch.Generator().manual_seed(1000 + seed)
    width = 6
    ramp = torch.linspace(0, 1, width)
    shapes = torch.stack([torch.ones(width), ramp * 1.5, torch.sin(2 * math.pi * ramp) * 1.5,
                          (torch.arange(width) % 3 == 0).float() * 2.0])
    y = torch.randint(0, TRACE_CLASSES, (POOL,), generator=g)
    x = 0.15 * torch.randn(POOL, TRACE_LEN, TRACE_CHANNELS, generator=g)
    starts = torch.randint(0, TRACE_LEN - width, (POOL,), generator=g)
    pulse = torch.zeros(POOL, TRACE_LEN)
    pulse.scatter_add_(1, starts[:, None] + torch.arange(width), shapes[y])
    return x + pulse[..., None] * torch.tensor([1.0, -0.7, 0.4]), y, torch.ones(POOL)


@functools.lru_cache(maxsize=8)
def markov_text(seed: int, successor_logits: tuple[float, ...] = (2.0, 1.2, 0.5)) -> tuple[torch.Tensor, ...]:
    """A made-up language: a sparse first-order Markov chain over ids 1..VOCAB-1 (each id has three
    likely successors; the chain is the same for every seed). Returns (tokens (N, SEQ_LEN),
    next tokens (N, SEQ_LEN), per-sequence loss weights (N,), all 1: a data-mixing weight)."""
    chain = torch.Generator().manual_seed(77)
    logits = torch.full((VOCAB, VOCAB), -6.0)
    logits[:, PAD] = -math.inf
    for t in range(VOCAB):
        successors = 1 + torch.randperm(VOCAB - 1, generator=chain)[:3]
        logits[t, successors] = torch.tensor(successor_logits)
    probs = logits.softmax(-1)
    g = torch.Generator().manual_seed(2000 + seed)
    seq = torch.empty(POOL, SEQ_LEN + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(1, VOCAB, (POOL,), generator=g)
    for t in range(SEQ_LEN):
        seq[:, t + 1] = torch.multinomial(probs[seq[:, t]], 1, generator=g).squeeze(1)
    return seq[:, :-1], seq[:, 1:], torch.ones(POOL)


@functools.lru_cache(maxsize=8)
def friedman_table(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Friedman's #1 regression problem (scikit-learn's generator, made in code): 10 features (5 used),
    a smooth nonlinear target plus noise; features and target standardised."""
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=POOL, n_features=10, noise=0.5, random_state=seed)
    x = torch.tensor(x, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.float32)
    return (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()


@functools.lru_cache(maxsize=8)
def screening_table(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A binary screening table (scikit-learn's make_classification, made in code): 20 features (6
    informative, 4 redundant), about 30% positives, 2% of labels flipped; features standardised. The
    targets are floats 0/1, as BCEWithLogitsLoss takes them."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=POOL, n_features=20, n_informative=6, n_redundant=4, weights=[0.7],
                               flip_y=0.02, random_state=seed)
    x = torch.tensor(x, dtype=torch.float32)
    return (x - x.mean(0)) / x.std(0), torch.tensor(y, dtype=torch.float32)


# --- the snapshot a run sees ------------------------------------------------------------------------

def batches_of(tensors: tuple[torch.Tensor, ...], start: int, count: int, size: int) -> list[Batch]:
    return [tuple(t[start + i * size: start + (i + 1) * size].clone() for t in tensors) for i in range(count)]


def snapshot(tensors: tuple[torch.Tensor, ...], cfg: DataConfig, seed: int,
             classes: int) -> tuple[list[Batch], list[Batch]]:
    """Training and validation batches from one family's examples, with `cfg`'s data faults applied.

    Training rows come first and validation rows from VAL_START on, the same rows whatever the training
    set's size, so validation is held out unless `val_overlap` copies training rows into it.
    """
    size = cfg.batch_size
    n_train = cfg.train_examples or cfg.n_batches * size
    assert n_train <= VAL_START, "training rows would run into the validation rows"
    train = batches_of(tensors, 0, n_train // size, size)
    val = batches_of(tensors, VAL_START, cfg.val_batches, 32)
    train = [_raw(_scaled(b, INPUTS, cfg.input_scale), cfg.raw_offset) for b in train]
    val = [_raw(_scaled(b, INPUTS, cfg.input_scale), cfg.raw_offset) for b in val]
    if cfg.shuffled_labels:
        train = _shuffle_targets(train, cfg.shuffled_labels, seed)
    if cfg.label_noise:
        train = _noisy_targets(train, cfg.label_noise, classes, seed)
    if cfg.val_overlap:
        val = _leaky(val, train, cfg.val_overlap)
    for i in cfg.blank_batches:
        train[i] = _blanked(train[i], cfg.blank_rows)
    for i in cfg.nonfinite_batches:
        train[i] = _nonfinite(train[i], cfg.nonfinite_part, cfg.nonfinite_rows, cfg.nonfinite_value, cfg.impute)
    if cfg.bad_batch is not None:
        train[cfg.bad_batch] = _scaled(train[cfg.bad_batch], cfg.bad_batch_part, cfg.bad_batch_scale)
    return train, val


def _replace(batch: Batch, index: int, value: torch.Tensor) -> Batch:
    return tuple(value if i == index else t for i, t in enumerate(batch))


def _scaled(batch: Batch, part: int, scale: float) -> Batch:
    return batch if scale == 1.0 else _replace(batch, part, batch[part] * scale)


def _raw(batch: Batch, offset: float) -> Batch:
    return batch if offset == 0.0 else _replace(batch, INPUTS, batch[INPUTS] + offset)


def _shuffle_targets(batches: list[Batch], fraction: float, seed: int) -> list[Batch]:
    """The bug: targets went through their own permutation (a fraction of them), the inputs did not."""
    y = torch.cat([b[1] for b in batches])
    g = torch.Generator().manual_seed(500 + seed)
    moved = torch.randperm(len(y), generator=g)[: int(round(fraction * len(y)))]
    y = y.clone()
    y[moved] = y[moved[torch.randperm(len(moved), generator=g)]]
    size = len(batches[0][1])
    return [_replace(b, 1, y[i * size:(i + 1) * size]) for i, b in enumerate(batches)]


def _noisy_targets(batches: list[Batch], fraction: float, classes: int, seed: int) -> list[Batch]:
    """Annotation noise: a fraction of class labels replaced at random (0/1 float targets flipped);
    regression targets get noise."""
    g = torch.Generator().manual_seed(600 + seed)
    out = []
    for b in batches:
        y = b[1]
        if y.is_floating_point() and classes == 2:
            y = torch.where(torch.rand(y.shape, generator=g) < fraction, 1.0 - y, y)
        elif y.is_floating_point():
            y = y + fraction * 2.0 * torch.randn(y.shape, generator=g)
        else:
            flip = torch.rand(y.shape, generator=g) < fraction
            low = 1 if classes == VOCAB else 0  # never the padding token
            y = torch.where(flip, torch.randint(low, classes, y.shape, generator=g), y)
        out.append(_replace(b, 1, y))
    return out


def _leaky(val: list[Batch], train: list[Batch], fraction: float) -> list[Batch]:
    """The bug: the first rows of each validation batch are copies of training rows (taken in order)."""
    pool = [torch.cat(items) for items in zip(*train)]
    out, used = [], 0
    for b in val:
        k = int(round(fraction * len(b[0])))
        rows = torch.arange(used, used + k) % len(pool[0])
        used += k
        out.append(tuple(torch.cat([s[rows], t[k:]]) for s, t in zip(pool, b)))
    return out


def _blanked(batch: Batch, rows: int) -> Batch:
    """Blank examples: a constant row (a blank image, a flat trace from a dead sensor, a record of
    defaults); for token batches, sequences that are padding from position SEQ_LEN // 2 on."""
    x = batch[0].clone()
    if x.is_floating_point():
        x[:rows] = 0.0  # every feature at the same value (the mean, for standardised features)
        return _replace(batch, 0, x)
    x[:rows, SEQ_LEN // 2:] = PAD
    y = batch[1].clone()
    y[:rows, SEQ_LEN // 2 - 1:] = PAD
    return _replace(_replace(batch, 0, x), 1, y)


def _nonfinite(batch: Batch, part: int, rows: int, value: str, impute: bool) -> Batch:
    """Missing values written as NaN (or an overflowed Inf) into `rows` examples' float data."""
    x = batch[part].clone()
    bad = float("nan") if value == "nan" else float("inf")
    flat = x.view(len(x), -1)
    flat[:rows, : max(1, flat.shape[1] // 4)] = 0.0 if impute else bad
    return _replace(batch, part, x)
