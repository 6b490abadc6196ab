"""Tied and shared weights: keys a checkpoint may leave out because another key holds the same tensor.

A Hugging Face Trainer saves `model.safetensors` without `lm_head.weight` when it is tied to the input
embedding (GPT-2, T5, most Llama-style LMs); safetensors cannot store one tensor under two names. Such a
key is not missing: it is loaded through the key it is tied to. Two ways to know a key is tied:

- after setup() the model holds the two names as one tensor (`model.state_dict()` aliases them);
- the model declares the tie (transformers' `all_tied_weights_keys`, a {target: source} mapping that
  already follows the config, e.g. `tie_word_embeddings=False` removes it).

Every other absent key is still missing, and loading still fails on it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch

log = logging.getLogger(__name__)


def alias_groups(tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names that refer to one tensor (same storage, offset, shape, strides and dtype), groups of 2+."""
    groups: dict[tuple, list[str]] = defaultdict(list)
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.numel() > 0:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            groups[key].append(name)
    return [names for names in groups.values() if len(names) > 1]


def declared_ties(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(target, source) pairs the model declares tied. transformers >= 5 keeps them, expanded and
    checked against the config, in `all_tied_weights_keys`; other models declare none."""
    mapping = getattr(model, "all_tied_weights_keys", None)
    if not isinstance(mapping, dict):
        return []
    return [(str(t), str(s)) for t, s in mapping.items()]


def fill_tied_keys(model: torch.nn.Module, state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """`state` with each absent key that is tied to a present one filled from it.

    Returns the filled state and {filled key: key it came from}; keys tied to nothing present stay absent.
    """
    expected = model.state_dict()
    missing = set(expected) - set(state)
    if not missing:
        return state, {}
    partners: dict[str, set[str]] = defaultdict(set)
    for group in alias_groups(expected):
        for name in group:
            partners[name].update(n for n in group if n != name)
    for target, source in declared_ties(model):
        partners[target].add(source)
        partners[source].add(target)
    filled: dict[str, str] = {}
    state = dict(state)
    for key in sorted(missing):
        source = next((p for p in sorted(partners.get(key, ())) if p in state and p not in filled), None)
        if source is not None and tuple(state[source].shape) == tuple(expected[key].shape):
            state[key] = state[source]
            filled[key] = source
    if filled:
        log.info("tied weights loaded through the key they share: %s", filled)
    return state, filled
