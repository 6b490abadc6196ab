"""The front doors (the top floor of DESIGN §6): the command line and `triage.run`, and what the terminal
shows. They may import every floor below; nothing imports them but `triage/__init__.py`'s public names.

    commands.py   `triage run | demo | report | watch | read-history | bench` (typer)
    api.py        `triage.run`: the main job as a function (the command line is a thin layer over it)
    progress.py   the live view, JSON lines for CI, or nothing; verdict.py: the verdict in a few lines
    zoo.py        the fault zoo shipped in examples/; bench.py: `triage bench` over it
    watch/        `triage watch` (the sidecar) and `triage read-history`

`main` and `app` are imported on first use, so that importing `triage.cli.api` does not import typer.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name not in ("main", "app"):  # the console script's `triage.cli:main`
        raise AttributeError(f"module 'triage.cli' has no attribute '{name}'")
    return getattr(importlib.import_module("triage.cli.commands"), name)
