"""Near copies: validation examples much nearer a training example than training examples are to one another
(augmented copies of one image split apart, a row re-measured with noise). Each example is read whole, every
tensor of its row (fingerprint.example_rows), each column scaled over the training examples; the
distance of each validation example to its nearest training example is set against each training example's
distance to its nearest other one. Where the split was drawn at random from one pool, a validation example
falls under the training examples' NEAR_QUANTILE (outcomes/overlap.py) of those distances about as often as a
training one does (5%; a snapshot of fewer than MIN_TRAIN training examples is not read: its quantile is too
coarse). A near copy must also lie nearer the training example than half its distance to the nearest other
validation example: augmentation applied to training only (noise, say) pushes training examples apart from
one another, so a clean validation example sits nearer them than they sit to each other, but not nearer them
than to its own kind. Both together: 0-0.6% of digits split at random. Exact copies (distance 0) are the
duplicates' count, not this one's."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from triage.experiments.fingerprint import example_rows
from triage.outcomes.overlap import NEAR_QUANTILE

# The examples compared at most (the first of the snapshot's), and the dimensions a row keeps: rows wider
# than PROJECTED are projected on that many random directions (seeded: two runs agree), which keeps
# distances to within a few percent and costs a fraction of a second.
MAX_TRAIN = 2048
MAX_VAL = 1024
PROJECTED = 128
MAX_COLUMNS = 8192  # wider rows keep every k-th column before the projection (a 224x224 image, say)
MIN_VAL = 20  # fewer validation examples than this say nothing about a share
MIN_TRAIN = 128  # fewer training examples: their 5th percentile is a coarse, noisy threshold


class NearCopies(NamedTuple):
    near: int  # validation examples near a training example (exact copies not counted)
    compared: int  # validation examples compared (exact copies not counted)
    flags: list[torch.Tensor]  # per validation batch, a bool per example: near (none past the ones compared)
    distance_ratio: Optional[float]  # median distance to the nearest training example, validation over training


def near_copies(train_batches: list[Any], val_batches: list[Any], copied: list[torch.Tensor]) -> Optional[NearCopies]:
    """The validation examples near a training example (`copied`: per validation batch, the exact copies,
    left out). None where the examples' rows differ in width from batch to batch, or there are too few."""
    train, train_widths = _rows(train_batches, MAX_TRAIN)
    val, val_widths = _rows(val_batches, MAX_VAL)
    if train is None or val is None or train_widths != val_widths or len(train) < MIN_TRAIN:
        return None
    exact = torch.cat(copied)[:len(val)] if copied else torch.zeros(len(val), dtype=torch.bool)
    if int((~exact).sum()) < MIN_VAL:
        return None
    train, val = _comparable(train, val, train_widths)
    own = _nearest(train, train)
    to_train = _nearest(val, train)
    to_val = _nearest(val, val)  # inf where no other validation example differs from it
    finite = own[torch.isfinite(own)]
    if len(finite) < MIN_TRAIN:
        return None
    threshold = float(torch.quantile(finite, NEAR_QUANTILE))
    near = (to_train < threshold) & (to_train < to_val / 2) & ~exact
    counted = ~exact & torch.isfinite(to_train)
    flags, start = [], 0
    for batch_copied in copied:
        n = len(batch_copied)
        part = near[start:start + n]
        flags.append(torch.cat([part, torch.zeros(n - len(part), dtype=torch.bool)]))
        start += n
    ratio = float(to_train[counted].median() / finite.median()) if counted.any() and finite.median() > 0 else None
    return NearCopies(int(near.sum()), int(counted.sum()), flags, ratio)


def _rows(batches: list[Any], limit: int) -> tuple[Optional[torch.Tensor], Optional[list[tuple[str, int]]]]:
    """The first `limit` examples as rows of floats: every tensor of each example flattened, side by side in
    the batch's order (every k-th column where wider than MAX_COLUMNS), and each tensor's key and the columns
    it keeps. None where a batch's examples are not rows or its tensors differ in width from the first batch's."""
    parts, widths = [], None
    count = 0
    for batch in batches:
        rows, reason = example_rows(batch)
        if reason is not None or not rows:
            return None, None
        flat = [t.detach().reshape(t.shape[0], -1) for _, t in rows]
        shape = [(key, f.shape[1]) for (key, _), f in zip(rows, flat)]
        if widths is None:
            widths = shape
        elif shape != widths:
            return None, None
        every = -(-sum(w for _, w in shape) // MAX_COLUMNS)  # every k-th column: a large image is not copied whole
        row = torch.cat([f[:, ::every].cpu().float() for f in flat], 1)
        kept = [(key, -(-w // every)) for key, w in shape]
        parts.append(row)
        count += len(row)
        if count >= limit:
            break
    return (torch.cat(parts)[:limit].double(), kept) if parts else (None, None)


def _comparable(train: torch.Tensor, val: torch.Tensor, widths: list[tuple[str, int]]) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """Both sets centred over the training rows and scaled column by column, projected to PROJECTED dimensions
    where wider. Each column is divided by its spread over training or by the median spread of its tensor's
    columns, whichever is larger: a column in other units (dollars beside years) is brought to its tensor's
    scale, and a nearly constant one (an image's border pixel) is not magnified until noise in it is all a
    distance measures. Constant columns are dropped: they tell no example apart."""
    train = torch.where(torch.isfinite(train), train, torch.zeros(()))
    val = torch.where(torch.isfinite(val), val, torch.zeros(()))
    mean, std = train.mean(0), train.std(0)
    scale, start = std.clone(), 0
    for _, width in widths:
        part = std[start:start + width]
        if bool((part > 0).any()):
            scale[start:start + width] = part.clamp_min(float(part[part > 0].median()))
        start += width
    varies = std > 0
    train, val = (train[:, varies] - mean[varies]) / scale[varies], (val[:, varies] - mean[varies]) / scale[varies]
    width = train.shape[1]
    if width > PROJECTED:
        g = torch.Generator().manual_seed(0)
        directions = torch.randn(width, PROJECTED, generator=g, dtype=torch.float64) / PROJECTED ** 0.5
        train, val = train @ directions, val @ directions
    return train, val


def _nearest(rows: torch.Tensor, among: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """Each row's distance to the nearest row of `among` that is not the same example (distance 0, or within
    rounding of it: an exact copy is the duplicates' count); inf where every one is."""
    out = []
    scale = float(among.pow(2).sum(1).mean().sqrt()) or 1.0
    for i in range(0, len(rows), chunk):
        d = torch.cdist(rows[i:i + chunk], among)
        d[d <= 1e-6 * scale] = float("inf")
        out.append(d.min(1).values)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)
