"""Walking a batch as the user's DataLoader made it: a tensor, or (named) tuples, lists and dicts of them."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

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


def replace_tensor(batch: Any, name: str, tensor: torch.Tensor, prefix: str = "") -> Any:
    """A copy of the batch's structure with the tensor `named_tensors` calls `name` replaced by `tensor`."""
    if isinstance(batch, torch.Tensor):
        return tensor if (prefix or "batch") == name else batch
    if isinstance(batch, dict):
        return {k: replace_tensor(v, name, tensor, f"{prefix}[{k!r}]") for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [replace_tensor(v, name, tensor, f"{prefix}[{i}]") for i, v in enumerate(batch)]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def to_device(batch: Any, device: str) -> Any:
    return map_tensors(batch, lambda t: t.to(device))


# Keys under which a loader commonly hands out each example's index in its dataset (a Dataset whose
# __getitem__ returns it, or a collate_fn that adds it). A snapshot without one cannot name the samples.
SAMPLE_ID_KEYS = ("index", "indices", "idx", "sample_index", "sample_indices", "sample_id", "sample_ids")


def sample_ids(batch: Any) -> Optional[list[int]]:
    """The dataset indices of a batch's examples, where the batch is a dict that carries them (as a 1-D
    integer tensor or a list of ints under one of SAMPLE_ID_KEYS); None where it does not."""
    if not isinstance(batch, dict):
        return None
    for key in SAMPLE_ID_KEYS:
        value = batch.get(key)
        if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point() \
                and not value.is_complex():
            return [int(v) for v in value.tolist()]
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                              for v in value):
            return list(value)
    return None
