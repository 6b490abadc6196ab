"""The outcome models of the shipped experiments, without torch: what each experiment measures, field by
field, with each field's meaning (its description), its words and its unit declared beside it.

The experiments (triage/experiments/, which import torch) return these models and re-export them
(`from triage.experiments.replay import ReplayOutcome` still works); the report (triage/report/, which
renders without torch) reads report.json's outcomes through them and names every figure from them
(report/labels.py). One module per experiment, named as its experiment's module is.

SHIPPED names every shipped experiment and the model its outcome is; tests/outcomes/ holds it to the
experiments' registry.
"""

from __future__ import annotations

from triage.outcomes.activations import ActivationOutcome
from triage.outcomes.base import Outcome
from triage.outcomes.batch_scan import BatchScanOutcome
from triage.outcomes.checkpoint_check import CheckpointCheckOutcome
from triage.outcomes.curvature import CurvatureOutcome
from triage.outcomes.data_check import DataCheckOutcome
from triage.outcomes.epoch_order import EpochOrderOutcome
from triage.outcomes.example_order import ExampleOrderOutcome
from triage.outcomes.gradient_flow import GradientFlowOutcome
from triage.outcomes.history_check import HistoryOutcome
from triage.outcomes.init_check import InitCheckOutcome
from triage.outcomes.labels import LabelCheckOutcome
from triage.outcomes.locate import LocateOutcome
from triage.outcomes.loop_diff import LoopDiffOutcome
from triage.outcomes.lr_range import LrRangeOutcome
from triage.outcomes.lr_trace import LrTraceOutcome
from triage.outcomes.outputs import OutputCheckOutcome
from triage.outcomes.overlap import OverlapOutcome
from triage.outcomes.rank_data import RankDataOutcome
from triage.outcomes.replay import ReplayOutcome
from triage.outcomes.replicas import ReplicaOutcome
from triage.outcomes.search import LrSearchOutcome, SearchOutcome
from triage.outcomes.standard_loss import StandardLossOutcome

__all__ = ["Outcome", "SHIPPED"]

# Every shipped experiment by name: the model of its outcome.
SHIPPED: dict[str, type[Outcome]] = {
    "activation_health": ActivationOutcome, "batch_scan": BatchScanOutcome,
    "checkpoint_check": CheckpointCheckOutcome, "curvature": CurvatureOutcome, "data_check": DataCheckOutcome,
    "epoch_order": EpochOrderOutcome, "example_order": ExampleOrderOutcome, "gradient_flow": GradientFlowOutcome, "history_check": HistoryOutcome,
    "init_loss": InitCheckOutcome, "label_check": LabelCheckOutcome, "locate_nonfinite": LocateOutcome,
    "loop_diff": LoopDiffOutcome, "lr_range_test": LrRangeOutcome, "lr_trace": LrTraceOutcome,
    "output_check": OutputCheckOutcome, "overlap_check": OverlapOutcome, "rank_data": RankDataOutcome,
    "replay": ReplayOutcome, "replica_sync": ReplicaOutcome, "init_search": SearchOutcome,
    "lr_search": LrSearchOutcome, "standard_loss_swap": StandardLossOutcome,
}
