"""Where triage keeps what it can make again: demo checkpoints, drawn figures.

`$TRIAGE_CACHE`, by default `~/.cache/triage`. Everything under it is safe to delete.
"""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    return Path(os.environ.get("TRIAGE_CACHE", Path.home() / ".cache" / "triage"))
