"""Experiments: the only code that runs training. Each returns an Outcome and never decides."""

from triage.experiments.activations import ACTIVATION_HEALTH
from triage.experiments.base import Context, Experiment, Outcome, Params
from triage.experiments.data_check import DATA_CHECK
from triage.experiments.gradient_flow import GRADIENT_FLOW
from triage.experiments.locate import LOCATE_NONFINITE
from triage.experiments.registry import Registry
from triage.experiments.replay import REPLAY
from triage.records import ExperimentRun

BUILTIN = (DATA_CHECK, REPLAY, LOCATE_NONFINITE, GRADIENT_FLOW, ACTIVATION_HEALTH)


def default_registry() -> Registry:
    """A fresh registry of the shipped experiments; add your own with `.register(...)`."""
    return Registry(BUILTIN)


__all__ = ["Context", "Experiment", "ExperimentRun", "Outcome", "Params", "Registry", "default_registry"]
