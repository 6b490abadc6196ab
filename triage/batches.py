"""Walking a batch as the user's DataLoader made it: a tensor, or (named) tuples, lists and dicts of them."""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """The same structure with `fn` applied to every tensor; anything else is kept as it is."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(v, fn) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def named_tensors(batch: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a (nested) batch with a readable key: '[0]', "['input_ids']", ..."""
    if isinstance(batch, torch.Tensor):
        yield prefix or "batch", batch
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from named_tensors(v, f"{prefix}[{k!r}]")
    elif isinstance(batch, (list, tuple)):
        for i, v in enumerate(batch):
            yield from named_tensors(v, f"{prefix}[{i}]")


def to_device(batch: Any, device: str) -> Any:
    return map_tensors(batch, lambda t: t.to(device))


def first_examples(batch: Any, n: int) -> Any:
    """The first `n` examples of a batch: every tensor sliced along dim 0."""
    return map_tensors(batch, lambda t: t[:n] if t.dim() > 0 else t)
