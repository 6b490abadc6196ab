"""The user's source line: which stack frames are the user's (not torch's, triage's or the standard
library's), and the file's text around a line."""

from __future__ import annotations

import linecache
import os
import sysconfig
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Optional

import torch

import triage
from triage.views import SourceLine


@lru_cache(maxsize=None)
def _library_dirs() -> tuple[tuple[str, ...], str, str]:
    """(torch's and triage's folders, the standard library, site-packages), resolved."""
    def folder(path: str) -> str:
        return str(Path(path).resolve()) + os.sep
    paths = sysconfig.get_paths()
    return (tuple(folder(Path(m.__file__).parent) for m in (torch, triage)),
            folder(paths["stdlib"]), folder(paths["purelib"]))


@lru_cache(maxsize=4096)
def is_user_file(path: str) -> bool:
    """Not torch, not triage, not the standard library; third-party model code counts as the user's."""
    if path.startswith("<frozen"):
        return False
    resolved = str(Path(path).resolve())
    ours, stdlib, site_packages = _library_dirs()
    if resolved.startswith(ours):
        return False
    return not resolved.startswith(stdlib) or resolved.startswith(site_packages)


def user_frame(frames: traceback.StackSummary) -> Optional[tuple[str, int]]:
    for frame in reversed(frames):
        if is_user_file(frame.filename):
            return frame.filename, frame.lineno
    return None


def display_file(path: str) -> str:
    """The file as the user knows it: relative to where triage runs when inside it, else absolute."""
    try:
        shown = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        shown = path
    return path if shown.startswith("..") else shown


def display_path(path: str, line: int) -> str:
    return f"{display_file(path)}:{line}"


def source_line(path: str, line: int) -> Optional[str]:
    return linecache.getline(path, line).strip() or None


def source_context(path: str, line: int, around: int = 2) -> list[SourceLine]:
    """The lines around `line` (the file's own text, as far as it goes), `line` marked as the culprit."""
    shown = display_file(path)
    lines = []
    for n in range(max(1, line - around), line + around + 1):
        text = linecache.getline(path, n)
        if text:
            lines.append(SourceLine(file=shown, line=n, text=text.rstrip("\r\n"), is_culprit=n == line))
    return lines
