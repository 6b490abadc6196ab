"""What the recorder holds between failures, each within a stated bound.

- the last good state: one CPU copy of whatever state dict it is given (model, optimizer, ...), tensors
  shared by several names copied once (tied weights stay tied, and cost their size once);
- the last batches: at most `keep` batches and `max_bytes` bytes, on CPU;
- the history: (step, loss, lr, grad_norm) of the last `length` steps.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator, Optional

import torch

from triage.batches import map_tensors, named_tensors


def cpu_copy(state: Any) -> Any:
    """A CPU copy of a nested state (dicts, lists, tuples of tensors and plain values).

    Tensors that are one tensor under several names stay one tensor in the copy.
    """
    copies: dict[tuple, torch.Tensor] = {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "meta":
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key not in copies:
            copies[key] = t.detach().to("cpu", copy=True)
        return copies[key]

    return map_tensors(state, copy)


def tensor_bytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for _, t in named_tensors(value))


def _measure(batch: Any) -> tuple[int, bool]:
    """(bytes of the tensors in a nested batch, whether all are on CPU): one walk, called every step."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size(), batch.device.type == "cpu"
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    size, on_cpu = 0, True
    for item in items:
        s, c = _measure(item)
        size, on_cpu = size + s, on_cpu and c
    return size, on_cpu


class BatchRing:
    """The last batches of the run, oldest first, within `keep` batches and `max_bytes` bytes.

    CPU tensors are kept by reference (a DataLoader makes new tensors every step); tensors on an
    accelerator are copied to CPU so the ring never holds accelerator memory.
    """

    def __init__(self, keep: int, max_bytes: int):
        self.keep, self.max_bytes = keep, max_bytes
        self._items: deque[tuple[int, Any, int]] = deque()
        self.bytes = 0

    def add(self, step: int, batch: Any) -> None:
        if self.keep == 0:
            return
        size, on_cpu = _measure(batch)
        if not on_cpu:
            batch = map_tensors(batch, lambda t: t.detach().to("cpu"))
        self._items.append((step, batch, size))
        self.bytes += size
        while self._items and (len(self._items) > self.keep or (self.bytes > self.max_bytes and len(self._items) > 1)):
            self.bytes -= self._items.popleft()[2]

    def items(self) -> list[tuple[int, Any]]:
        return [(step, batch) for step, batch, _ in self._items]

    def __len__(self) -> int:
        return len(self._items)


class History:
    """(step, loss, lr, grad_norm) per step, the last `length` steps."""

    def __init__(self, length: int):
        self._rows: deque[tuple[int, Optional[float], Optional[float], Optional[float]]] = deque(maxlen=length)

    def add(self, step: int, loss: Optional[float], lr: Optional[float], grad_norm: Optional[float]) -> None:
        self._rows.append((step, loss, lr, grad_norm))

    def __iter__(self) -> Iterator[tuple[int, Optional[float], Optional[float], Optional[float]]]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

