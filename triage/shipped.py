"""Where the shipped playbooks and examples are: the source checkout, or inside the installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped_path(name: str) -> Path:
    """`playbooks` or `examples`: beside the package in a checkout, under `_shipped/` in a wheel."""
    in_checkout = _PACKAGE.parent / name
    return in_checkout if in_checkout.is_dir() else _PACKAGE / "_shipped" / name
