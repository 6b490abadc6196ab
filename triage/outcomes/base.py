"""The base of every outcome model: what an experiment measured, as frozen, typed data."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Outcome(BaseModel):
    """What an experiment measured. Fields a condition may read are plain numbers, bools or strings.

    Each field says, beside its declaration, how a person reads it: its description is its meaning, and
    `json_schema_extra` holds its `words` (what report.html, summary.md and the terminal call it) and, where
    the words do not say it, its `unit` (report/labels.py lists the units)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")
