"""The one checked way the report and the terminal read an experiment's outcome back from report.json.

report.json carries each run's outcome as a JSON dict (NaN and inf written as "NaN", "Infinity"). A reader
asks `outcome_of(run, ReplayRead)` and gets the outcome validated into a typed model, or None where the
run holds no outcome or its experiment measures something else (a data check is no replay). Readers use
attributes (`outcome.loss_end`): a misspelt or renamed field is an AttributeError, never a blank.

The models here are the report's reading of the experiments' own Outcome models (triage/experiments/),
the fields the report and the terminal show, with the same names and types. They are declared here, not
imported, because the report renders without torch and the experiments' modules import it.
tests/report/test_report_outcomes.py holds them to the experiments' models: every field here exists on the
Outcome of each experiment READS maps to it, with the same type; READS names every shipped experiment; and
every field a reader in report/ and cli/ asks for exists on the model it asked `outcome_of` for.

Read leniently, so an older report renders: a field missing from the dict (a report of an earlier schema)
reads as None, as it did when readers picked fields by name (a list too: readers write `or []`); fields
the model does not show are ignored; a field whose value does not fit its type reads as None too. An
experiment READS does not name (one a playbook's `imports:` registered) is read as the model the reader
asked for, with the fields of it that it has: it renders as it did when readers picked fields by name.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Optional, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict

from triage.records import ExperimentRun

__all__ = ["READS", "Reading", "outcome_of"]

log = logging.getLogger(__name__)


class Reading(BaseModel):
    """An outcome as report.json carries it, read back: only the fields the report shows."""

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="strings")


class VerifiedFixRead(Reading):
    """A replay that verified a fix against the run as it was (experiments/verify.py's VerifiedFix)."""

    reference_end: Optional[float] = None
    against: Optional[str] = None
    fix_works: Optional[bool] = None
    improvement: Optional[float] = None
    sane: Optional[bool] = None


class ReplayRead(VerifiedFixRead):
    """experiments/replay.py's ReplayOutcome."""

    loss_end: Optional[float] = None
    steps_run: Optional[int] = None
    finite: Optional[bool] = None
    first_nonfinite_step: Optional[int] = None
    lrs: Optional[list[float]] = None
    clip_threshold: Optional[float] = None
    skipped: Optional[list[int]] = None
    loop_used: Optional[Literal["reference", "user"]] = None
    rank_loss_end: Optional[list[Optional[float]]] = None
    first_nonfinite_ranks: Optional[list[int]] = None


class SearchRead(ReplayRead):
    """experiments/search.py's SearchOutcome: the chosen trial's replay."""

    chosen: Optional[str] = None


class LrSearchRead(SearchRead):
    """experiments/search.py's LrSearchOutcome."""

    lr_factor: Optional[float] = None
    lr_owner: Optional[str] = None


class NonFiniteTensorRead(Reading):
    """experiments/data_check.py's NonFiniteTensor."""

    split: Optional[str] = None
    batch: Optional[int] = None
    key: Optional[str] = None
    nan: Optional[int] = None
    inf: Optional[int] = None
    numel: Optional[int] = None
    first_index: Optional[list[int]] = None
    first_value: Optional[float] = None
    sample_id: Optional[int] = None


class DataCheckRead(Reading):
    """experiments/data_check.py's DataCheckOutcome."""

    nonfinite: Optional[list[NonFiniteTensorRead]] = None


class BatchScanRead(Reading):
    """experiments/batch_scan.py's BatchScanOutcome."""

    worst_batch: Optional[int] = None
    worst_tensor: Optional[str] = None
    worst_value: Optional[float] = None
    worst_value_index: Optional[list[int]] = None
    typical_value: Optional[float] = None
    worst_sample_id: Optional[int] = None


class GradientFlowRead(Reading):
    """experiments/gradient_flow.py's GradientFlowOutcome."""

    frozen: Optional[list[str]] = None
    not_in_optimizer: Optional[list[str]] = None


class LocateRead(Reading):
    """experiments/locate.py's LocateOutcome."""

    rank: Optional[int] = None
    module: Optional[str] = None
    op: Optional[str] = None
    source: Optional[str] = None


class ReplicaRead(Reading):
    """experiments/replicas.py's ReplicaOutcome."""

    parameters: Optional[list[str]] = None
    ranks_apart: Optional[list[int]] = None
    out_of_sync_count: Optional[int] = None
    first_moment: Optional[Literal["checkpoint", "init", "replay"]] = None
    worst_parameter: Optional[str] = None


# Every shipped experiment by name: the model its outcome is read as, None where the report reads none of it.
READS: dict[str, Optional[type[Reading]]] = {
    "replay": ReplayRead, "standard_loss_swap": ReplayRead, "init_search": SearchRead, "lr_search": LrSearchRead,
    "data_check": DataCheckRead, "batch_scan": BatchScanRead, "gradient_flow": GradientFlowRead,
    "locate_nonfinite": LocateRead, "replica_sync": ReplicaRead,
    "checkpoint_check": None, "label_check": None, "overlap_check": None, "history_check": None, "loop_diff": None,
    "init_loss": None, "lr_range_test": None, "activation_health": None, "lr_trace": None, "output_check": None,
    "rank_data": None, "epoch_order": None, "curvature": None,
}

R = TypeVar("R", bound=Reading)


def outcome_of(run: Optional[ExperimentRun], expected: type[R]) -> Optional[R]:
    """`run`'s outcome read as its experiment's model, where that model is `expected` or a subclass of it;
    None where there is no run, it holds no outcome, or its experiment measures something else."""
    if run is None or not run.outcome:
        return None
    if run.experiment not in READS:
        log.debug("experiment %r is not a shipped one: its outcome is read as a %s", run.experiment, expected.__name__)
        model: type[Reading] = expected
    else:
        shipped = READS[run.experiment]
        if shipped is None or not issubclass(shipped, expected):
            return None
        model = shipped
    return _read(model, run.outcome)  # type: ignore[return-value]


def _read(model: type[Reading], data: dict[str, Any]) -> Reading:
    """`data` validated into `model`; a field whose value does not fit reads as None."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        bad = {error["loc"][0] for error in exc.errors() if error["loc"]}
        log.debug("outcome fields %s do not fit %s: read as None", sorted(map(str, bad)), model.__name__)
        return model.model_validate({k: v for k, v in data.items() if k not in bad})
