"""Fingerprints that ranks can compare without sending the data: a digest per tensor, per batch and
per example. Equal digests mean byte-identical contents."""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Iterator, NamedTuple, Optional

import torch

from triage.batches import map_tensors, named_tensors
from triage.outcomes.overlap import MAX_SHIFT

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


class _Layout(NamedTuple):
    """How a batch holds its examples (example_rows' rules), read once for both its readers."""

    rows: list[tuple[str, torch.Tensor]]  # every tensor with one row per input row
    mask: Optional[tuple[str, torch.Tensor]]  # a 1-D bool tensor that selects the examples among the rows
    seeds: Optional[int]  # a neighbour-sampled batch's batch_size: its first rows are the examples
    not_rows: Optional[str]  # why the examples are not rows (then the other fields say nothing)
    graphs: Optional[int]  # labels of another first dimension than the inputs: one per graph


def _layout(batch: Any) -> _Layout:
    from triage.experiments.probes import class_targets, input_tensor

    x = input_tensor(batch)
    if x is None or x.dim() == 0:
        return _Layout([], None, None, "the batch has no input tensor with a row per example", None)
    n = x.shape[0]
    labels = class_targets(batch)
    if labels is not None and labels.dim() >= 1 and labels.shape[0] != n:
        return _Layout([], None, None, f"its labels ({labels.shape[0]}) are not one per input row ({n}): each "
                                       "example spans several rows (a batch of graphs, say)", labels.shape[0])
    named = [(key, t) for key, t in named_tensors(batch) if t.dim() >= 1]
    rows = [(key, t) for key, t in named if t.shape[0] == n]
    context = len(rows) < len(named)
    masks = [(key, t) for key, t in rows
             if t.dtype == torch.bool and t.dim() == 1 and ("mask" in key.lower() or context)]
    size = batch.get("batch_size") if isinstance(batch, dict) else None
    seeds = size if isinstance(size, int) and not isinstance(size, bool) and 0 < size < n else None
    return _Layout(rows, masks[0] if masks else None, seeds, None, None)


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
    layout = _layout(batch)
    if layout.not_rows is not None:
        return [], layout.not_rows
    if layout.mask is not None:
        key, mask = layout.mask
        chosen = mask.nonzero().flatten()
        return [(k, t[chosen]) for k, t in layout.rows if k != key], None
    if layout.seeds is not None:
        return [(key, t[:layout.seeds]) for key, t in layout.rows], None
    return layout.rows, None


def first_examples(batch: Any, n: int) -> Any:
    """The batch cut to its first `n` examples, as `example_rows` reads examples: a full-batch graph keeps its
    nodes and edges and selects n of its mask's nodes; a neighbour-sampled batch keeps n seeds; a batch of
    graphs keeps its first n graphs (their nodes, their edges, their labels); any other batch, the first n
    rows of every tensor."""
    layout = _layout(batch)
    if layout.graphs is not None:
        return _first_graphs(batch, n)
    if layout.mask is not None:
        mask = layout.mask[1]
        chosen = torch.zeros_like(mask)
        chosen[mask.nonzero().flatten()[:n]] = True
        return map_tensors(batch, lambda t: chosen if t is mask else t)
    if layout.seeds is not None:
        return {**batch, "batch_size": min(n, layout.seeds)}
    return _first_rows(batch, n)


def examples_where(batch: Any, keep: torch.Tensor) -> Optional[Any]:
    """The batch cut to the examples `keep` selects (a bool per example, in `example_rows`' order): the rows
    that hold them, or a full-batch graph with its mask narrowed to them. None where the examples cannot be
    selected apart (a batch of graphs, a neighbour-sampled batch's seeds) or where none is kept."""
    layout = _layout(batch)
    if layout.not_rows is not None or layout.seeds is not None or not bool(keep.any()):
        return None
    if layout.mask is not None:
        mask = layout.mask[1]
        narrowed = torch.zeros_like(mask)
        narrowed[mask.nonzero().flatten()[keep.to(mask.device)]] = True
        return map_tensors(batch, lambda t: narrowed if t is mask else t)
    kept = {id(t) for _, t in layout.rows}
    return map_tensors(batch, lambda t: t[keep.to(t.device)] if id(t) in kept else t)


def _first_rows(batch: Any, n: int) -> Any:
    return map_tensors(batch, lambda t: t[:n] if t.dim() > 0 else t)


def graph_membership(batch: Any, nodes: int, graphs: int) -> Optional[torch.Tensor]:
    """A batch of graphs' membership vector (PyG's `batch`): the one integer tensor with a graph id, 0 to
    graphs - 1, per node; None where there is not exactly one."""
    member = [t for _, t in named_tensors(batch) if t.dim() == 1 and t.shape[0] == nodes
              and not t.is_floating_point() and t.dtype != torch.bool and t.numel()
              and int(t.min()) == 0 and int(t.max()) == graphs - 1]
    return member[0] if len(member) == 1 else None


def _first_graphs(batch: Any, n: int) -> Any:
    """The first n graphs of a batch of graphs (PyG's layout: each graph's nodes contiguous, a membership
    vector, an edge_index into the nodes, one label per graph, and maybe an int `num_graphs`). Where the
    layout is not that plain, the first n rows of every tensor."""
    from triage.experiments.probes import class_targets, input_tensor

    nodes, graphs = input_tensor(batch).shape[0], class_targets(batch).shape[0]
    member = graph_membership(batch, nodes, graphs)
    edges = [t for _, t in named_tensors(batch) if t.dim() == 2 and t.shape[0] == 2 and not t.is_floating_point()
             and t.numel() and int(t.max()) < nodes]
    if member is None or len(edges) != 1 or nodes == graphs or not bool((member[1:] >= member[:-1]).all()):
        return _first_rows(batch, n)
    kept_nodes = int((member < n).sum())
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


def _rounded(tensor: torch.Tensor) -> torch.Tensor:
    """On the CPU, floats rounded to ROUNDING (+ 0.0: -0.0 becomes 0.0, and hashes alike); others as they are."""
    data = tensor.detach().cpu()
    return torch.round(data.double() / ROUNDING) + 0.0 if data.is_floating_point() else data


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
            flat.append((key.encode(), _rounded(tensor.reshape(tensor.shape[0], -1)).numpy()))
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
# MAX_SHIFT steps (declared in triage/outcomes/overlap.py, beside the figure it bounds), over the part they share,
# at least half of each. A part of fewer than MIN_DISTINCT distinct values (padding, a constant stretch) could
# match by chance and is not compared.
MIN_STEPS = 8
MIN_DISTINCT = 4


def sequence_rows(batches: list[Any]) -> Iterator[list[torch.Tensor]]:
    """Per example, its input row (`example_rows`'s input tensor) read with its steps along its first dim, and,
    for a 2-D row whose last dim holds MIN_STEPS or more, along its last too (a conv's (channels, frames):
    log-mel crops), each rounded as digests round them; none where the inputs are not sequences of MIN_STEPS
    steps or more."""
    from triage.experiments.probes import input_tensor

    for batch in batches:
        rows, _ = example_rows(batch)
        x = input_tensor(batch)
        chosen = next((t for key, t in rows if x is not None and t.shape[1:] == x.shape[1:]
                       and t.dtype == x.dtype), None)
        if chosen is None or chosen.dim() < 2 or chosen.shape[1] < MIN_STEPS:
            continue
        for row in _rounded(chosen):
            yield [row, row.T.contiguous()] if row.dim() == 2 and row.shape[1] >= MIN_STEPS else [row]


def window_digests(row: torch.Tensor, side: str) -> Iterator[bytes]:
    """Digests of `row`'s part without its first s steps (side "tail") or its last s (side "head"), for
    each shift s, keyed by s; parts with fewer than MIN_DISTINCT distinct steps are left out. Each step is
    read as one key (its value, or a digest of its values), so a shift hashes its part's keys, not every value
    again."""
    keys = _step_keys(row)
    steps = len(keys)
    shifts = range(1, min(MAX_SHIFT, steps // 2) + 1)
    distinct = _distinct_counts(keys[::-1] if side == "tail" else keys)  # of each suffix / prefix, by length
    for shift in shifts:
        if distinct[steps - shift] < MIN_DISTINCT:
            continue
        part = keys[shift:] if side == "tail" else keys[:steps - shift]
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{shift}:{tuple(row.shape)}".encode())
        h.update(b"".join(part))
        yield h.digest()


def _step_keys(row: torch.Tensor) -> list[bytes]:
    """One key per step of `row` (its first dim): the step's bytes where it holds one value, else a digest."""
    data = row.contiguous().numpy()
    if data.ndim == 1:
        return [data[i:i + 1].tobytes() for i in range(len(data))]
    return [hashlib.blake2b(step.tobytes(), digest_size=16).digest() for step in data]


def _distinct_counts(keys: list[bytes]) -> list[int]:
    """counts[n]: how many distinct keys the first n keys hold."""
    seen: set[bytes] = set()
    counts = [0]
    for key in keys:
        seen.add(key)
        counts.append(len(seen))
    return counts
