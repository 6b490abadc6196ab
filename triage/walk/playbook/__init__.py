"""Playbooks: the flowchart as YAML, validated into a graph; conditions decide on outcomes.

`conditions` imports nothing heavy (the report parses conditions without torch); the graph, which
checks a playbook against the experiments' registry, is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from triage.walk.playbook.conditions import Condition, ConditionError, parse_condition

if TYPE_CHECKING:
    from triage.walk.playbook.graph import (
        Playbook,
        default_playbook_path,
        load_playbook,
    )

_GRAPH = ("Playbook", "default_playbook_path", "load_playbook")

__all__ = ["Condition", "ConditionError", "Playbook", "default_playbook_path", "load_playbook",
           "parse_condition"]


def __getattr__(name: str) -> Any:
    if name not in _GRAPH:
        raise AttributeError(f"module 'triage.walk.playbook' has no attribute '{name}'")
    value = getattr(importlib.import_module("triage.walk.playbook.graph"), name)
    globals()[name] = value
    return value
