"""The failing run's own loss curve: from the checkpoint's `history` or a `--history` file."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict

from triage.errors import CheckpointError

_LOSS_KEYS = ("loss", "train_loss", "train/loss")


class HistoryPoint(BaseModel):
    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    step: int
    loss: float


def history_from_value(value: Any) -> list[HistoryPoint]:
    """A checkpoint's `history`: a list of losses, a list of dicts, or a dict of lists."""
    if value is None:
        return []
    if isinstance(value, dict):
        losses = next((value[k] for k in _LOSS_KEYS if k in value), [])
        steps = value.get("step") or range(len(losses))
        return [HistoryPoint(step=int(s), loss=float(v)) for s, v in zip(steps, losses)]
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, dict) for v in value):
            return history_from_log_entries(value)
        return [HistoryPoint(step=i, loss=float(v)) for i, v in enumerate(value) if _is_number(v)]
    return []


def history_from_log_entries(entries: Iterable[dict[str, Any]]) -> list[HistoryPoint]:
    points = []
    for i, entry in enumerate(entries):
        key = next((k for k in _LOSS_KEYS if k in entry), None)
        if key is not None and _is_number(entry[key]):
            points.append(HistoryPoint(step=int(entry.get("step", i)), loss=float(entry[key])))
    return points


def read_history_file(path: Path) -> list[HistoryPoint]:
    """`--history FILE`: CSV with a loss column, JSON lines, or a Trainer `trainer_state.json`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"Expected a history file at '{path}', found none. Pass a CSV, a JSONL file or "
            "trainer_state.json with a 'loss' per step."
        )
    text = path.read_text()
    if path.suffix == ".csv":
        points = history_from_log_entries(_numeric_rows(csv.DictReader(text.splitlines())))
    elif path.suffix == ".jsonl":
        points = history_from_log_entries(json.loads(line) for line in text.splitlines() if line.strip())
    else:
        data = json.loads(text)
        points = history_from_log_entries(data.get("log_history", [])) if isinstance(data, dict) else []
    if not points:
        raise CheckpointError(
            f"Expected '{path}' to carry a loss per step (a column or key named "
            f"{' / '.join(_LOSS_KEYS)}), found none. Rename the column or drop --history."
        )
    return points


def _numeric_rows(rows: Iterable[dict[str, str]]) -> Iterable[dict[str, Any]]:
    for row in rows:
        yield {k: _to_number(v) for k, v in row.items()}


def _to_number(text: str) -> Any:
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def _is_number(value: Any) -> bool:
    """A loss that parses as a float; NaN counts: it is when the run broke."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool)
