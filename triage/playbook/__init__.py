"""Playbooks: the flowchart as YAML, validated into a graph; conditions decide on outcomes."""

from triage.playbook.conditions import Condition, ConditionError, parse_condition
from triage.playbook.graph import Playbook, default_playbook_path, load_playbook

__all__ = ["Condition", "ConditionError", "Playbook", "default_playbook_path", "load_playbook",
           "parse_condition"]
