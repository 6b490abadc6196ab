"""Integrations with training frameworks, each an optional extra that `import triage` never imports. The
callbacks run inside the user's training process (the capture floor, with triage.flight): they may
import only the foundations and triage.flight.

    triage.integrations.lightning      TriageCallback for lightning.Trainer    pip install "torch-triage[lightning]"
    triage.integrations.transformers   TriageCallback for transformers.Trainer pip install "torch-triage[transformers]"
    triage.integrations.runinfo        how a framework names its run settings (precision, clip)

Reading what the frameworks save belongs to loading (triage.load): `--history` from TensorBoard event
files (tensorboard.py, pip install "torch-triage[tensorboard]"), and the Setup derived when `--entry` names a
LightningModule class, or a function returning a LightningModule (optionally with its
LightningDataModule) or a transformers.Trainer (derive.py, lightning_setup.py, transformers_setup.py).
`require` below names the extra to install for either.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from triage.errors import TriageError


class MissingExtraError(TriageError):
    """An integration was used without its optional dependency installed."""


def require(module: str, extra: str) -> ModuleType:
    """Import `module`, or fail with one line that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f"Expected the '{module}' package for this integration, found it is not installed. "
                                f'Run `pip install "torch-triage[{extra}]"` (from a checkout: '
                                f'`pip install -e ".[{extra}]"`).') from None
