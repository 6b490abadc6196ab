"""Naming a module the way a person finds it in their code: `3` alone says little; `3` (ReLU), after
`2` (Linear), says where in an nn.Sequential to look."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class Place(NamedTuple):
    type: Optional[str]  # the module's class: ReLU, LayerNorm, ...
    previous: Optional[str]  # where it is an nn.Sequential's bare index: the layer before it
    previous_type: Optional[str]


def module_place(model: torch.nn.Module, name: Optional[str]) -> Place:
    """The class of `model`'s module `name` ("blocks.1.norm"; a repeated call's "#2" ignored) and, where it
    is a bare index of an nn.Sequential, the layer before it. Unknown names give an empty Place."""
    name = name.split("#", 1)[0] if name else name
    modules = dict(model.named_modules())
    module = modules.get(name) if name else None
    if module is None:
        return Place(None, None, None)
    parent_name, _, own = name.rpartition(".")
    parent = modules.get(parent_name)
    if not own.isdigit() or not isinstance(parent, torch.nn.Sequential):
        return Place(type(module).__name__, None, None)
    siblings = [child for child, _ in parent.named_children()]
    at = siblings.index(own)
    if at == 0:
        return Place(type(module).__name__, None, None)
    before = siblings[at - 1]
    return Place(type(module).__name__, f"{parent_name}.{before}" if parent_name else before,
                 type(parent[at - 1]).__name__)
