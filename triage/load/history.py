"""The failing run's own loss curve: from the checkpoint's `history` or a `--history` file."""

from __future__ import annotations

import csv
import json
import math
from collections import deque
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


# Limits: a log of any size is read in bounded memory. The report needs the run's recent curve: the
# newest MAX_POINTS points (the flight recorder's history_len), read from the file's last TAIL_BYTES.
MAX_POINTS = 100_000
MAX_ROWS = MAX_POINTS + MAX_POINTS // 2  # rows read from the tail (some carry only other metrics)
TAIL_BYTES = 32 * 2**20
MAX_LINE_BYTES = 2**20  # a CSV header
MAX_JSON_BYTES = 64 * 2**20  # trainer_state.json is one document: read whole, so bounded
MAX_STEP = 10**15


class HistoryPoint(BaseModel):
    """One logged step of the failing run: its training loss, its validation loss, or both."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    step: int
    loss: Optional[float] = None
    val_loss: Optional[float] = None


def history_from_value(value: Any) -> list[HistoryPoint]:
    """A checkpoint's `history`: a list of losses, a list of dicts, or a dict of lists."""
    try:
        return _history_from_value(value)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"Expected the checkpoint's `history` to be a list of losses, a list of dicts or a "
                              f"dict of lists, found it unreadable ({exc}). Re-save it, or pass --history.") from None


def _history_from_value(value: Any) -> list[HistoryPoint]:
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
        return [HistoryPoint(step=i, loss=float(v)) for i, v in enumerate(value) if _is_number(v)][-MAX_POINTS:]
    return []


def history_from_log_entries(entries: Iterable[dict[str, Any]], loss_keys: tuple[str, ...] = _LOSS_KEYS,
                             val_keys: tuple[str, ...] = _VAL_KEYS) -> list[HistoryPoint]:
    """Points from log rows (dicts); the newest MAX_POINTS are kept. A row whose step is not a whole
    number between 0 and MAX_STEP is an error that names it (`inf` or `nan` is when a log broke, not a step)."""
    points: deque[HistoryPoint] = deque(maxlen=MAX_POINTS)
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"row {i + 1} is a {type(entry).__name__}, not a mapping of names to values")
        loss = _first_number(entry, loss_keys)
        val_loss = _first_number(entry, val_keys)
        step = entry.get("step", i)
        if (loss is not None or val_loss is not None) and _is_number(step):
            points.append(HistoryPoint(step=_step(step, i), loss=loss, val_loss=val_loss))
    return list(points)


def _step(value: Any, row: int) -> int:
    step = float(value)
    if not (math.isfinite(step) and 0 <= step <= MAX_STEP and step == int(step)):
        raise ValueError(f"row {row + 1} has step {value!r}; a step is a whole number from 0 to {MAX_STEP:.0e}")
    return int(step)


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
    from triage.load.tensorboard import is_tensorboard, read_tensorboard

    if is_tensorboard(path):
        return [HistoryPoint(**point) for point in read_tensorboard(path, loss_keys, val_keys, MAX_POINTS)]
    if path.is_dir():
        found = next((path / n for n in ("metrics.csv", "trainer_state.json", "history.csv") if (path / n).is_file()), None)
        path = found or next(iter(sorted(path.rglob("metrics.csv"))), path)
    if not path.is_file():
        found = "a device, a pipe or a socket, not a file" if path.exists() else "none"
        raise CheckpointError(
            f"Expected a history at '{path}', found {found}. Pass a CSV (e.g. Lightning's metrics.csv), a JSONL "
            "file, trainer_state.json, or a TensorBoard log folder, with a 'loss' per step."
        )
    try:
        if path.suffix == ".csv":
            header, lines = _tail(path, header=True)
            rows = _numeric_rows(csv.DictReader([header, *lines]))
        elif path.suffix == ".jsonl":
            _, lines = _tail(path, header=False)
            rows = (json.loads(line) for line in lines if line.strip())
        else:
            data = json.loads(_whole(path))
            rows = data.get("log_history", []) if isinstance(data, dict) else []
            rows = rows[-MAX_ROWS:] if isinstance(rows, list) else []
        points = history_from_log_entries(rows, loss_keys, val_keys)
    except (ValueError, AttributeError, TypeError, csv.Error, RecursionError, MemoryError) as exc:
        found = "JSON nested too deeply" if isinstance(exc, RecursionError) else exc
        raise CheckpointError(
            f"Expected '{path}' to be a CSV, JSON lines or trainer_state.json history, found it "
            f"unreadable ({found}). Fix the file or drop --history."
        ) from None
    except OSError as exc:
        raise CheckpointError(f"Expected to read the history '{path}', found it unreadable "
                              f"({exc.strerror or exc}). Check --history.") from None
    if not points:
        raise CheckpointError(
            f"Expected '{path}' to carry a loss per step (a column or key named "
            f"{' / '.join(loss_keys + val_keys)}), found none. Name yours with --history-loss / --history-val, "
            "or drop --history."
        )
    return points


def _tail(path: Path, header: bool) -> tuple[str, list[str]]:
    """The first line (a CSV's header, when `header`) and the lines of the last TAIL_BYTES of the file, at
    most MAX_ROWS of them: a log of any size is read in bounded memory and time."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        first = handle.readline(MAX_LINE_BYTES) if header else b""
        start = max(handle.tell(), size - TAIL_BYTES)
        handle.seek(start)
        data = handle.read(TAIL_BYTES)
    if start > len(first):  # began inside a line: drop its end
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    lines = _decode(data).splitlines()[-MAX_ROWS:]
    return _decode(first).strip("\r\n"), lines


def _whole(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{size / 2**20:.0f} MiB, over the {MAX_JSON_BYTES // 2**20} MiB a JSON history is read "
                         "whole; pass its log as JSON lines or CSV, which are read from their tail")
    return _decode(path.read_bytes())


def _decode(data: bytes) -> str:
    """UTF-8 (with or without a BOM), UTF-16 with a BOM, else Latin-1 (which reads any byte)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _numeric_rows(rows: Iterable[dict[str, str]]) -> Iterable[dict[str, Any]]:
    for row in rows:
        yield {k: _to_number(v) for k, v in row.items() if isinstance(v, str)}


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
