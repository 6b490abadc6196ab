"""The shipped experiments' outcome models live in one torch-free package (triage/outcomes/, issue 36
item 3): it imports without torch, each field declares its words and unit beside it, SHIPPED names every
shipped experiment's model, and the experiments hand out the very same classes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import triage.experiments as experiments
import triage.outcomes as outcomes
from triage.experiments import default_registry
from triage.outcomes import SHIPPED
from triage.outcomes.base import Outcome

REPO = Path(__file__).resolve().parents[2]
# The units report/labels.py documents and shows.
UNITS = {"", "×", "%", "steps", "batches", "σ", "× start loss", "× their size", "per step"}


def models_in(package) -> list[type[Outcome]]:
    """Every Outcome model a module of `package` holds (declared there or imported), once each."""
    found = {}
    for module in pkgutil.iter_modules(package.__path__):
        namespace = importlib.import_module(f"{package.__name__}.{module.name}")
        for _, cls in inspect.getmembers(namespace, inspect.isclass):
            if issubclass(cls, Outcome) and cls is not Outcome:
                found[cls] = None
    return list(found)


# Imports every module of triage/outcomes/ with torch made unimportable, and says whether torch came in.
IMPORT_WITHOUT_TORCH = r"""
import importlib, importlib.abc, pkgutil, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch is not to be imported here")
sys.meta_path.insert(0, Blocked())
import triage.outcomes
for module in pkgutil.iter_modules(triage.outcomes.__path__):
    importlib.import_module(f"triage.outcomes.{module.name}")
print("torch" in sys.modules)
"""


def test_the_outcome_models_import_without_torch():
    done = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_TORCH], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("model", models_in(outcomes), ids=lambda m: m.__name__)
def test_every_field_declares_its_words_and_unit_beside_it(model):
    unsaid = []
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        said, unit = extra.get("words"), extra.get("unit", "")
        if not isinstance(said, str) or not said or "_" in said:  # words, not a field name
            unsaid.append(f"{name}: words {said!r}")
        if unit not in UNITS:
            unsaid.append(f"{name}: unit {unit!r}")
    assert unsaid == []


def test_shipped_names_every_experiment_with_its_outcome_model():
    registry = default_registry()
    assert sorted(SHIPPED) == registry.names()
    assert [e.name for e in registry if SHIPPED[e.name] is not e.outcome] == []


def test_the_experiments_hand_out_the_torch_free_models():
    """No outcome model is declared beside torch code: every one the experiments' modules hold is the one in
    triage/outcomes/ (so `from triage.experiments.replay import ReplayOutcome` is that class)."""
    from triage.experiments.base import Outcome as experiments_outcome
    assert experiments_outcome is Outcome
    assert [m.__module__ for m in models_in(experiments) if not m.__module__.startswith("triage.outcomes.")] == []
