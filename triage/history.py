"""The failing run's own loss curve: from the checkpoint's `history` or a `--history` file."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Optional

from pydantic import BaseModel, ConfigDict

from triage.errors import CheckpointError

# The names runs log their losses under: plain loops, the HF Trainer (trainer_state.json, TensorBoard),
# Lightning (self.log("train_loss", on_step=True, on_epoch=True) writes train_loss_step / _epoch).
_LOSS_KEYS = ("loss", "train_loss", "train/loss", "train_loss_step", "train/loss_step", "training_loss",
              "Loss/train", "loss/train", "train_loss_epoch")
_VAL_KEYS = ("val_loss", "eval_loss", "val/loss", "eval/loss", "validation_loss", "valid_loss", "val_loss_epoch",
             "Loss/val", "loss/val", "val/loss_epoch")


class HistoryPoint(BaseModel):
    """One logged step of the failing run: its training loss, its validation loss, or both."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    step: int
    loss: Optional[float] = None
    val_loss: Optional[float] = None


def history_from_value(value: Any) -> list[HistoryPoint]:
    """A checkpoint's `history`: a list of losses, a list of dicts, or a dict of lists."""
    if value is None:
        return []
    if isinstance(value, dict):  # columns: {"loss": [...], "val_loss": [...], "step": [...]}
        columns = {k: list(v) for k, v in value.items() if isinstance(v, (list, tuple))}
        length = max((len(v) for v in columns.values()), default=0)
        rows = [{k: v[i] for k, v in columns.items() if i < len(v)} for i in range(length)]
        return history_from_log_entries(rows)
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, dict) for v in value):
            return history_from_log_entries(value)
        return [HistoryPoint(step=i, loss=float(v)) for i, v in enumerate(value) if _is_number(v)]
    return []


def history_from_log_entries(entries: Iterable[dict[str, Any]], loss_keys: tuple[str, ...] = _LOSS_KEYS,
                             val_keys: tuple[str, ...] = _VAL_KEYS) -> list[HistoryPoint]:
    points = []
    for i, entry in enumerate(entries):
        loss = _first_number(entry, loss_keys)
        val_loss = _first_number(entry, val_keys)
        step = entry.get("step", i)
        if (loss is not None or val_loss is not None) and _is_number(step):
            points.append(HistoryPoint(step=int(float(step)), loss=loss, val_loss=val_loss))
    return points


def _first_number(entry: dict[str, Any], keys: tuple[str, ...]) -> Optional[float]:
    key = next((k for k in keys if k in entry and _is_number(entry[k])), None)
    return float(entry[key]) if key is not None else None


def read_history_file(path: Path, loss_key: Optional[str] = None, val_key: Optional[str] = None) -> list[HistoryPoint]:
    """`--history`: which format it is is detected from the path:

    - a TensorBoard event file, or a folder holding one run's event files (the `tensorboard` extra);
    - a CSV with a loss column (Lightning's CSVLogger `metrics.csv`, or a folder holding one);
    - JSON lines; a Trainer `trainer_state.json` (or the `checkpoint-N/` folder holding it).

    Losses are recognised by their usual names (_LOSS_KEYS, _VAL_KEYS); `loss_key` / `val_key` name others.
    """
    path = Path(path)
    loss_keys = (loss_key,) if loss_key else _LOSS_KEYS
    val_keys = (val_key,) if val_key else _VAL_KEYS
    from triage.integrations.tensorboard import is_tensorboard, read_tensorboard

    if is_tensorboard(path):
        return read_tensorboard(path, loss_keys, val_keys)
    if path.is_dir():
        found = next((path / n for n in ("metrics.csv", "trainer_state.json", "history.csv") if (path / n).is_file()), None)
        path = found or next(iter(sorted(path.rglob("metrics.csv"))), path)
    if not path.is_file():
        raise CheckpointError(
            f"Expected a history at '{path}', found none. Pass a CSV (e.g. Lightning's metrics.csv), a JSONL "
            "file, trainer_state.json, or a TensorBoard log folder, with a 'loss' per step."
        )
    text = path.read_text(errors="replace")
    try:
        if path.suffix == ".csv":
            rows = _numeric_rows(csv.DictReader(text.splitlines()))
        elif path.suffix == ".jsonl":
            rows = (json.loads(line) for line in text.splitlines() if line.strip())
        else:
            data = json.loads(text)
            rows = data.get("log_history", []) if isinstance(data, dict) else []
        points = history_from_log_entries(rows, loss_keys, val_keys)
    except (ValueError, AttributeError, TypeError) as exc:
        raise CheckpointError(
            f"Expected '{path}' to be a CSV, JSON lines or trainer_state.json history, found it "
            f"unreadable ({exc}). Fix the file or drop --history."
        ) from None
    if not points:
        raise CheckpointError(
            f"Expected '{path}' to carry a loss per step (a column or key named "
            f"{' / '.join(loss_keys + val_keys)}), found none. Name yours with --history-loss / --history-val, "
            "or drop --history."
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
