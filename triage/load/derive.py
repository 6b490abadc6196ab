"""A Setup derived from what the framework already built, so `--entry` can name it directly:

- a LightningModule class (built with the checkpoint's saved hyper-parameters), or a function returning
  a LightningModule, or a (LightningModule, LightningDataModule) pair;
- a function returning a transformers.Trainer.

The frameworks are recognised through `sys.modules` only: triage imports neither; the user's module did.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional

from triage.contract import Setup
from triage.load.checkpoint import Checkpoint


def _lightning_module_types() -> tuple[type, ...]:
    found = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "LightningModule"):
            found.append(module.LightningModule)
    return tuple(found)


def _is_lightning_module(value: Any) -> bool:
    types = _lightning_module_types()
    return bool(types) and isinstance(value, types)


def _is_trainer(value: Any) -> bool:
    module = sys.modules.get("transformers")
    if module is None or "transformers.trainer" not in sys.modules:
        return False
    return isinstance(value, sys.modules["transformers.trainer"].Trainer)


def derived_factory(entry: Callable[[], Any], checkpoint: Optional[Checkpoint]) -> Callable[[], Any]:
    """The setup factory for `entry`: a user's setup() is returned as it is; a LightningModule class, or a
    function returning a module or a Trainer, becomes a factory that derives the Setup."""
    types = _lightning_module_types()
    if types and inspect.isclass(entry) and issubclass(entry, types):
        from triage.load.lightning_setup import build_module, lightning_setup

        @functools.wraps(entry, updated=())
        def from_class() -> Setup:
            return lightning_setup(build_module(entry, checkpoint), None, checkpoint)
        return from_class

    @functools.wraps(entry, updated=())
    def factory() -> Any:
        return derive_setup(entry(), checkpoint)
    return factory


def derive_setup(result: Any, checkpoint: Optional[Checkpoint]) -> Any:
    """A Setup from what an entry returned; anything unrecognised is returned unchanged (call_setup says
    what it expected)."""
    if isinstance(result, Setup):
        return result
    if _is_lightning_module(result):
        from triage.load.lightning_setup import lightning_setup
        return lightning_setup(result, None, checkpoint)
    if isinstance(result, tuple) and len(result) == 2 and _is_lightning_module(result[0]):
        from triage.load.lightning_setup import lightning_setup
        return lightning_setup(result[0], result[1], checkpoint)
    if _is_trainer(result):
        from triage.load.transformers_setup import trainer_setup
        return trainer_setup(result, checkpoint)
    return result
