"""On-disk cache of each case's checkpoint and validity verdict, so repeated benchmark runs skip them.

Key: a hash of the generator's source files (this package, minus the runner and the summary) and the
case id. Editing any generator file starts a fresh cache folder; old folders can simply be deleted.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Optional

from suite.check import Validity, validate

DEFAULT_ROOT = Path.home() / ".cache" / "triage" / "suite"
PACKAGE = Path(__file__).resolve().parent
NOT_GENERATOR = {"cache.py", "runner.py", "summary.py", "__init__.py"}  # changing these changes no case


@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """Hashed once per process, when the generator modules are already imported: a file edited during a
    run must not file that run's cases under the new source."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name not in NOT_GENERATOR:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


class CaseCache:
    """`root/<source hash>/<case id>/{checkpoint.pt, validity.json}`."""

    def __init__(self, root: Optional[Path] = None):
        self.folder = Path(root or DEFAULT_ROOT) / source_hash()

    def checkpoint_path(self, case_id: str) -> Path:
        return self.folder / case_id / "checkpoint.pt"

    def _verdict_path(self, case_id: str) -> Path:
        return self.folder / case_id / "validity.json"

    def cached(self, case_id: str) -> Optional[Validity]:
        verdict = self._verdict_path(case_id)
        if not verdict.exists() or not self.checkpoint_path(case_id).exists():
            return None
        try:
            return Validity.model_validate(json.loads(verdict.read_text()))
        except ValueError:  # a file cut short by an interrupted run: validate again
            return None

    def validity(self, case) -> tuple[Validity, Path, bool]:
        """The case's verdict and checkpoint, from the cache or freshly made; the flag says which."""
        case_id = case.spec.id
        verdict = self.cached(case_id)
        if verdict is not None:
            return verdict, self.checkpoint_path(case_id), True
        path = self.checkpoint_path(case_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        verdict = validate(case, checkpoint=path)
        tmp = self._verdict_path(case_id).with_suffix(".tmp")
        tmp.write_text(verdict.model_dump_json(indent=1))
        tmp.replace(self._verdict_path(case_id))  # atomic: a reader never sees half a file
        return verdict, path, False
