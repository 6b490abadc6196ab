"""Fingerprints that ranks can compare without sending the data: a digest per tensor, per batch and
per example. Equal digests mean byte-identical contents."""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Iterator, Optional

import torch

from triage.batches import named_tensors

# Floats equal to this precision count as the same example (a CSV round trip, say); -0.0 and 0.0 alike.
ROUNDING = 1e-6


def tensor_digest(tensor: torch.Tensor) -> bytes:
    """The digest of a tensor's bytes (a DTensor's local shard), with its dtype and shape."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    data = local.detach().to("cpu").contiguous()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{data.dtype}{tuple(data.shape)}".encode())
    if data.numel():
        h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def batch_digest(batch: Any) -> bytes:
    """One digest for a whole batch: every tensor in it, with its key."""
    h = hashlib.blake2b(digest_size=16)
    for key, tensor in named_tensors(batch):
        h.update(key.encode())
        h.update(tensor_digest(tensor))
    return h.digest()


def order_digest(batches: Iterable[Any], limit: int) -> list[bytes]:
    """The digests of the first `limit` batches an iterable gives, in order (an epoch's order)."""
    out = []
    for i, batch in enumerate(batches):
        if i == limit:
            break
        out.append(batch_digest(batch))
    return out


def example_rows(batch: Any) -> tuple[list[tuple[str, torch.Tensor]], Optional[str]]:
    """A batch's examples as the model reads them: every tensor that holds one row per example, cut to the
    batch's own examples; or, where its examples are not rows, no tensors and the reason.

    The examples' dimension is the inputs' first. A tensor with another first dimension is context every
    example shares (a graph's edge_index). The examples are every row, except that a 1-D bool tensor named
    a mask, or beside such context (a full-batch graph's `train_mask`), selects them, and a dict's int
    `batch_size` smaller than the rows says the first rows are the examples and the rest their neighbours
    (PyG's NeighborLoader). Labels with another first dimension than the inputs (one per graph of a batch
    of graphs) mean the rows are parts of examples, which no row can stand for.
    """
    from triage.experiments.probes import class_targets, input_tensor

    x = input_tensor(batch)
    if x is None or x.dim() == 0:
        return [], "the batch has no input tensor with a row per example"
    n = x.shape[0]
    labels = class_targets(batch)
    if labels is not None and labels.dim() >= 1 and labels.shape[0] != n:
        return [], (f"its labels ({labels.shape[0]}) are not one per input row ({n}): each example spans "
                    "several rows (a batch of graphs, say)")
    named = [(key, t) for key, t in named_tensors(batch) if t.dim() >= 1]
    rows = [(key, t) for key, t in named if t.shape[0] == n]
    context = len(rows) < len(named)
    masks = [(key, t) for key, t in rows
             if t.dtype == torch.bool and t.dim() == 1 and ("mask" in key.lower() or context)]
    if masks:
        chosen = masks[0][1].nonzero().flatten()
        return [(key, t[chosen]) for key, t in rows if key != masks[0][0]], None
    size = batch.get("batch_size") if isinstance(batch, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size < n:
        return [(key, t[:size]) for key, t in rows], None
    return rows, None


def examples_unreadable(batches: list[Any]) -> Optional[str]:
    """Why these batches' examples cannot be told apart row by row (the first batch that says so), or None."""
    for batch in batches:
        rows, reason = example_rows(batch)
        if reason is not None:
            return reason
    return None


def example_digests(batches: list[Any], limit: Optional[int] = None) -> Iterator[bytes]:
    """One digest per example: its row of every tensor that holds one (`example_rows`), with the tensors'
    keys, floats rounded to ROUNDING; at most `limit` (None: all). A batch whose examples are not rows
    gives none."""
    count = 0
    for batch in batches:
        rows, _ = example_rows(batch)
        if not rows:
            continue
        flat = []
        for key, tensor in rows:
            data = tensor.detach().reshape(tensor.shape[0], -1).cpu()
            if data.is_floating_point():
                data = torch.round(data.double() / ROUNDING) + 0.0  # + 0.0: -0.0 becomes 0.0, and hashes alike
            flat.append((key.encode(), data.numpy()))
        for i in range(flat[0][1].shape[0]):
            if limit is not None and count == limit:
                return
            count += 1
            h = hashlib.blake2b(digest_size=16)
            for key, data in flat:
                h.update(key)
                h.update(data[i].tobytes())
            yield h.digest()


# Shifted windows: a sequence input (a row of at least MIN_STEPS steps) compared with others moved by 1 to
# MAX_SHIFT steps, over the part they share, at least half of each. A part of fewer than MIN_DISTINCT distinct
# values (padding, a constant stretch) could match by chance and is not compared.
MIN_STEPS = 8
MAX_SHIFT = 16
MIN_DISTINCT = 4


def sequence_rows(batches: list[Any]) -> Iterator[torch.Tensor]:
    """The examples' input rows (`example_rows`'s input tensor, first dim the steps), rounded as digests
    round them; none where the inputs are not sequences of MIN_STEPS steps or more."""
    from triage.experiments.probes import input_tensor

    for batch in batches:
        rows, _ = example_rows(batch)
        x = input_tensor(batch)
        chosen = next((t for key, t in rows if x is not None and t.shape[1:] == x.shape[1:]
                       and t.dtype == x.dtype), None)
        if chosen is None or chosen.dim() < 2 or chosen.shape[1] < MIN_STEPS:
            continue
        data = chosen.detach().cpu()
        if data.is_floating_point():
            data = torch.round(data.double() / ROUNDING) + 0.0
        yield from data


def window_digests(row: torch.Tensor, side: str) -> Iterator[bytes]:
    """Digests of `row`'s part without its first s steps (side "tail") or its last s (side "head"), for
    each shift s, keyed by s; parts with fewer than MIN_DISTINCT distinct values are left out."""
    steps = row.shape[0]
    for shift in range(1, min(MAX_SHIFT, steps // 2) + 1):
        part = row[shift:] if side == "tail" else row[:steps - shift]
        if torch.unique(part).numel() < MIN_DISTINCT:
            continue
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{shift}:{tuple(part.shape)}".encode())
        h.update(part.contiguous().numpy().tobytes())
        yield h.digest()
