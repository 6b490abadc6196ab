"""Experiments (a floor of DESIGN §6): the only code that runs training. Each returns an Outcome and never
decides. They may import the foundations (triage/*.py) and loading (triage.load); nothing above.
"""

from triage.experiments.activations import ACTIVATION_HEALTH
from triage.experiments.base import Context, Experiment, NotApplicable, Outcome, Params
from triage.experiments.batch_scan import BATCH_SCAN
from triage.experiments.checkpoint_check import CHECKPOINT_CHECK
from triage.experiments.curvature import CURVATURE
from triage.experiments.data_check import DATA_CHECK
from triage.experiments.epoch_order import EPOCH_ORDER
from triage.experiments.example_order import EXAMPLE_ORDER
from triage.experiments.gradient_flow import GRADIENT_FLOW
from triage.experiments.history_check import HISTORY_CHECK
from triage.experiments.init_check import INIT_LOSS
from triage.experiments.labels import LABEL_CHECK
from triage.experiments.locate import LOCATE_NONFINITE
from triage.experiments.loop_diff import LOOP_DIFF
from triage.experiments.lr_range import LR_RANGE_TEST
from triage.experiments.lr_trace import LR_TRACE
from triage.experiments.outputs import OUTPUT_CHECK
from triage.experiments.overlap import OVERLAP_CHECK
from triage.experiments.rank_data import RANK_DATA
from triage.experiments.registry import Registry
from triage.experiments.replay import REPLAY
from triage.experiments.replicas import REPLICA_SYNC
from triage.experiments.search import INIT_SEARCH, LR_SEARCH
from triage.experiments.standard_loss import STANDARD_LOSS_SWAP
from triage.records import ExperimentRun

BUILTIN = (DATA_CHECK, CHECKPOINT_CHECK, LABEL_CHECK, OVERLAP_CHECK, HISTORY_CHECK, LOOP_DIFF, INIT_LOSS, REPLAY,
           BATCH_SCAN, LOCATE_NONFINITE, LR_RANGE_TEST, GRADIENT_FLOW, ACTIVATION_HEALTH, LR_TRACE,
           OUTPUT_CHECK, LR_SEARCH, INIT_SEARCH, REPLICA_SYNC, RANK_DATA, EPOCH_ORDER,
           STANDARD_LOSS_SWAP, CURVATURE, EXAMPLE_ORDER)


def default_registry() -> Registry:
    """A fresh registry of the shipped experiments; add your own with `.register(...)`."""
    return Registry(BUILTIN)


__all__ = ["Context", "Experiment", "ExperimentRun", "NotApplicable", "Outcome", "Params", "Registry",
           "default_registry"]
