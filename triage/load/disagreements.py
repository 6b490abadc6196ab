"""Where setup() and the checkpoint disagree on the run's settings (DESIGN §2, "what the replay uses is said").

`load_state_dict` quietly replaces what setup() built with what the checkpoint holds: a user who edited
setup()'s LR to reproduce a fault would replay the checkpoint's. Each difference is named with both values,
and the replays use the checkpoint's.
"""

from __future__ import annotations

import math
from typing import Any, Optional

FINDING_ID = "setup_checkpoint_disagree"

# Optimizer group settings read before and after loading (with a scheduler, `lr` is the schedule's value
# at the checkpoint and differs by design: the schedule's own base, `initial_lr`, is compared instead).
GROUP_KEYS = ("lr", "initial_lr", "weight_decay", "momentum", "dampening", "nesterov", "betas", "eps", "alpha")


def settings(optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """The settings a checkpoint can overwrite, as setup() built them (or as loaded)."""
    groups = [{k: group[k] for k in GROUP_KEYS if k in group} for group in optimizer.param_groups]
    base = getattr(scheduler, "base_lrs", None) if scheduler is not None else None
    return {"groups": groups, "base_lrs": list(base) if base is not None else None,
            "has_scheduler": scheduler is not None}


def differences(built: dict[str, Any], loaded: dict[str, Any]) -> list[str]:
    """Each setting that differs, as 'what: setup() X, checkpoint Y'."""
    found = []
    if len(built["groups"]) != len(loaded["groups"]):
        found.append(f"param groups: setup() builds {len(built['groups'])}, the checkpoint has {len(loaded['groups'])}")
    for i, (mine, theirs) in enumerate(zip(built["groups"], loaded["groups"])):
        for key in GROUP_KEYS:
            if key == "lr" and built["has_scheduler"]:
                continue
            if key in mine and key in theirs and not _same(mine[key], theirs[key]):
                group = f" of param group {i}" if len(built["groups"]) > 1 else ""
                found.append(f"{key}{group}: setup() {_show(mine[key])}, checkpoint {_show(theirs[key])}")
    if built["base_lrs"] is not None and loaded["base_lrs"] is not None and not _same(built["base_lrs"],
                                                                                       loaded["base_lrs"]):
        found.append(f"the scheduler's base LRs: setup() {_show(built['base_lrs'])}, "
                     f"checkpoint {_show(loaded['base_lrs'])}")
    return found


def finding_text(found: list[str]) -> Optional[str]:
    if not found:
        return None
    return ("setup() and the checkpoint disagree — " + "; ".join(found)
            + ". The replays use the checkpoint's values, as load_state_dict does: to replay setup()'s, "
              "edit the checkpoint or drop its optimizer state.")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0) or a == b
    return a == b


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return str(value)
