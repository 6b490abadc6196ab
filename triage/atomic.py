"""Writing a file whole or not at all: a temporary file beside it, flushed, then renamed over it.

A reader (a browser, `triage report`, a CI job tailing report.json) never sees half a file: a full disk,
a killed process or a second Ctrl-C leaves the previous version (or nothing) and no temporary behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; raises OSError (the temporary removed) when it cannot."""
    path = Path(path)
    data = text.encode("utf-8")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a report is shared like any other file
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return path
