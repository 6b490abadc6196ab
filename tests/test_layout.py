"""The package keeps its layout by layer (DESIGN §6, README "Layout"): no import runs up a floor, no
import circle, every module on a floor, every folder says what it holds. The floors are
benchmarks/architecture.py's FLOORS, the table issue 24's before/after figures come from."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def architecture():
    spec = importlib.util.spec_from_file_location("architecture", REPO / "benchmarks" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph(architecture):
    return architecture.imports(architecture.modules(REPO / "triage"))


def test_no_import_runs_up_a_floor(architecture, graph):
    up = [f"{a} ({architecture.floor_of(a)}) imports {b} ({architecture.floor_of(b)})"
          for a, b in architecture.arrows_up(graph)]
    assert up == []


def test_no_import_circle(architecture, graph):
    assert architecture.circles(graph) == []


def test_every_module_is_on_a_floor(architecture, graph):
    assert [m for m in graph if architecture.floor_of(m) == "unassigned"] == []


def test_every_folder_opens_with_what_it_holds():
    bare = [str(p.relative_to(REPO)) for p in sorted((REPO / "triage").rglob("__init__.py"))
            if not ast.get_docstring(ast.parse(p.read_text()))]
    assert bare == []
