"""`--history` from TensorBoard event files, read with the tensorboard package's own EventAccumulator."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from triage.errors import CheckpointError
from triage.integrations import require

EVENTS = "events.out.tfevents"


def is_tensorboard(path: Path) -> bool:
    path = Path(path)
    if path.is_file():
        return path.name.startswith(EVENTS)
    return path.is_dir() and next(path.rglob(f"{EVENTS}*"), None) is not None


def _run_dir(path: Path) -> Path:
    """The one folder holding event files (a run's log folder, or one of its subfolders)."""
    if path.is_file():
        return path.parent
    folders = sorted({p.parent for p in path.rglob(f"{EVENTS}*")})
    if len(folders) > 1:
        names = ", ".join(str(f) for f in folders[:5])
        raise CheckpointError(f"Expected one TensorBoard run under '{path}', found {len(folders)} ({names}). "
                              "Pass --history the folder of the failing run.")
    return folders[0]


def read_tensorboard(path: Path, loss_keys: Sequence[str], val_keys: Sequence[str],
                     max_points: int) -> list[dict[str, Optional[float]]]:
    """The scalars under the first tag of `loss_keys` and of `val_keys` the run logged, merged by step.
    At most `max_points` per tag are kept (TensorBoard's reservoir: an even sample that always keeps the
    newest), so a log of any length is read in bounded memory. Each point is a dict: step, loss and/or
    val_loss (history.py makes them HistoryPoints)."""
    accumulator = require("tensorboard.backend.event_processing.event_accumulator", "tensorboard")
    events = accumulator.EventAccumulator(str(_run_dir(Path(path))), size_guidance={accumulator.SCALARS: max_points})
    events.Reload()
    tags = events.Tags().get("scalars", [])
    loss_tag = next((t for t in loss_keys if t in tags), None)
    val_tag = next((t for t in val_keys if t in tags), None)
    if loss_tag is None and val_tag is None:
        raise CheckpointError(f"Expected the TensorBoard run '{path}' to log a loss under one of "
                              f"{' / '.join(loss_keys)}, found the tags {tags[:12]}. Name yours with "
                              "--history-loss TAG (and --history-val TAG).")
    points: dict[int, dict[str, Optional[float]]] = {}
    for tag, field in ((loss_tag, "loss"), (val_tag, "val_loss")):
        for event in events.Scalars(tag) if tag else []:
            points.setdefault(int(event.step), {})[field] = float(event.value)
    return [{"step": step, **values} for step, values in sorted(points.items())]
