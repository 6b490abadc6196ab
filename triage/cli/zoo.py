"""The fault zoo shipped in examples/: one small runnable module per root cause.

Each example module defines ROOT_CAUSE, setup() (the faulty run), fixed_setup() (the same run
with the fix applied) and write_checkpoint(path) (trains the faulty run and saves its checkpoint).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Optional

from triage import user_cache
from triage.errors import EntryError, TriageError
from triage.shipped import shipped_path

log = logging.getLogger(__name__)


def examples_dir() -> Path:
    return shipped_path("examples")


def example_names(folder: Optional[Path] = None) -> list[str]:
    return sorted(p.stem for p in (folder or examples_dir()).glob("*.py") if not p.stem.startswith("_"))


def example_path(name: str, folder: Optional[Path] = None) -> Path:
    path = (folder or examples_dir()) / f"{name}.py"
    if not path.is_file():
        raise EntryError(f"Expected a zoo example named '{name}', found none. "
                         f"Examples: {', '.join(example_names())}.")
    return path


def example_summary(name: str, folder: Optional[Path] = None) -> str:
    """The example in a line, from its docstring, without importing it (that would import torch): the
    text after its "root_cause: " label, up to the first colon or sentence end outside parentheses."""
    doc = ast.get_docstring(ast.parse(example_path(name, folder).read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split())
    label, sep, rest = text.partition(": ")
    text = rest if sep and " " not in label.split(" (")[0] else text
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text[i:i + 2] in (": ", ". "):
            return text[:i]
    return text.rstrip(".")


def load_example(name: str, folder: Optional[Path] = None) -> ModuleType:
    """An example module of the zoo (or of another folder of modules that follow its convention)."""
    path = example_path(name, folder)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # examples import their shared helpers
    spec = importlib.util.spec_from_file_location(f"triage_zoo_{path.parent.name}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        raise EntryError(f"Expected the zoo's dependencies to be installed, found '{exc.name}' missing. "
                         "Run `pip install \"torch-triage[examples]\"` (from a checkout: `pip install -e "
                         "\".[examples]\"`; the zoo uses scikit-learn's bundled digits).") from exc
    return module


def cache_dir() -> Path:
    return user_cache.root() / "demo"


def demo_checkpoint(name: str) -> Path:
    """The example's checkpoint, written on first use (and again whenever the example's code changes)."""
    source = example_path(name).read_bytes() + (examples_dir() / "_zoo.py").read_bytes()
    file_name = f"{name}-{hashlib.sha256(source).hexdigest()[:10]}.pt"
    try:
        return _written(cache_dir() / file_name, name)
    except OSError as exc:  # an unwritable or full cache folder: the demo still runs, from a temporary folder
        fallback = Path(tempfile.gettempdir()) / f"triage-demo-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        log.warning("cannot keep the demo checkpoint in %s (%s); writing it to %s (set TRIAGE_CACHE to a writable "
                    "folder to keep it)", cache_dir(), exc.strerror or exc, fallback)
        try:
            return _written(fallback / file_name, name)
        except OSError as again:
            raise TriageError(f"Expected to write the demo's checkpoint under '{cache_dir()}' or '{fallback}', found "
                              f"neither writable ({again.strerror or again}). Set TRIAGE_CACHE to a folder you can "
                              "write.") from None


def _written(path: Path, name: str) -> Path:
    """The example's checkpoint at `path`, written beside it and renamed there if missing: a concurrent reader
    never sees half a file, and a failed write leaves no part behind."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        load_example(name).write_checkpoint(partial)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
