"""Fingerprints that ranks can compare without sending the data: a digest per tensor, per batch and
per example. Equal digests mean byte-identical contents."""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Iterator, Optional

import torch

from triage.batches import map_tensors, named_tensors

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


def first_examples(batch: Any, n: int) -> Any:
    """The batch cut to its first `n` examples, as `example_rows` reads examples: a full-batch graph keeps its
    nodes and edges and selects n of its mask's nodes; a neighbour-sampled batch keeps n seeds; a batch of
    graphs keeps its first n graphs (their nodes, their edges, their labels); any other batch, the first n
    rows of every tensor."""
    from triage.experiments.probes import class_targets, input_tensor

    def rows(b: Any) -> Any:
        return map_tensors(b, lambda t: t[:n] if t.dim() > 0 else t)

    x = input_tensor(batch)
    if x is None or x.dim() == 0:
        return rows(batch)
    labels = class_targets(batch)
    if labels is not None and labels.dim() >= 1 and labels.shape[0] != x.shape[0]:
        return _first_graphs(batch, x.shape[0], labels.shape[0], n)
    named = [(key, t) for key, t in named_tensors(batch) if t.dim() >= 1]
    per_row = [(key, t) for key, t in named if t.shape[0] == x.shape[0]]
    context = len(per_row) < len(named)
    masks = [t for key, t in per_row if t.dtype == torch.bool and t.dim() == 1 and ("mask" in key.lower() or context)]
    if masks:
        chosen = torch.zeros_like(masks[0])
        chosen[masks[0].nonzero().flatten()[:n]] = True
        return map_tensors(batch, lambda t: chosen if t is masks[0] else t)
    size = batch.get("batch_size") if isinstance(batch, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and 0 < size < x.shape[0]:
        return {**batch, "batch_size": min(n, size)}
    return rows(batch)


def _first_graphs(batch: Any, nodes: int, graphs: int, n: int) -> Any:
    """The first n graphs of a batch of graphs (PyG's layout: each graph's nodes contiguous, a membership
    vector `batch` of graph ids per node, an edge_index into the nodes, one label per graph, and maybe an int
    `num_graphs`). Where the layout is not that plain, the first n rows of every tensor."""
    member = [t for _, t in named_tensors(batch) if t.dim() == 1 and t.shape[0] == nodes and not t.is_floating_point()
              and t.dtype != torch.bool and t.numel() and int(t.min()) == 0 and int(t.max()) == graphs - 1]
    edges = [t for _, t in named_tensors(batch) if t.dim() == 2 and t.shape[0] == 2 and not t.is_floating_point()
             and t.numel() and int(t.max()) < nodes]
    if len(member) != 1 or len(edges) != 1 or nodes == graphs or not bool((member[0][1:] >= member[0][:-1]).all()):
        return map_tensors(batch, lambda t: t[:n] if t.dim() > 0 else t)
    kept_nodes = int((member[0] < n).sum())
    keep = (edges[0] < kept_nodes).all(0)
    count = edges[0].shape[1]

    def cut(t: torch.Tensor) -> torch.Tensor:
        if t is edges[0]:
            return t[:, keep]
        if t.dim() == 0:
            return t
        if t.shape[0] == nodes:
            return t[:kept_nodes]
        if t.shape[0] == graphs:
            return t[:n]
        return t[keep] if t.shape[0] == count else t

    out = map_tensors(batch, cut)
    if isinstance(out, dict):
        out = {k: (min(n, v) if isinstance(v, int) and not isinstance(v, bool) and v == graphs else v)
               for k, v in out.items()}
    return out


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
