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


def example_digests(batches: list[Any], limit: Optional[int] = None) -> Iterator[bytes]:
    """One digest per example (a row of the batch's input tensor, floats rounded to ROUNDING), at most
    `limit` (None: all)."""
    from triage.experiments.probes import input_tensor

    count = 0
    for batch in batches:
        x = input_tensor(batch)
        if x is None or x.dim() == 0:
            continue
        rows = x.detach().reshape(x.shape[0], -1).cpu()
        if rows.is_floating_point():
            rows = torch.round(rows.double() / ROUNDING) + 0.0  # + 0.0: -0.0 becomes 0.0, and hashes alike
        for row in rows.numpy():
            if limit is not None and count == limit:
                return
            count += 1
            yield hashlib.blake2b(row.tobytes(), digest_size=16).digest()
