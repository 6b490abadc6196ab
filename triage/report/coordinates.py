"""The run's own coordinates for what the experiments name by snapshot position: the training step at which
a snapshot batch was used, the tensor of the batch and the value in it that is wrong, the example's index in
the dataset. Pure functions of report data (no torch).

Steps: a replay continues the run's count from the checkpoint, its step i (0-based) being the run's step
checkpoint + 1 + i on snapshot batch i. A capture's manifest records the step at which the run itself used
each batch it saved (`CheckpointInfo.batch_steps`); that record wins. Where neither is known the report keeps
the snapshot's own index and says "snapshot batch".
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from triage.outcomes.batch_scan import BatchScanOutcome
from triage.outcomes.data_check import DataCheckOutcome
from triage.outcomes.search import SearchOutcome
from triage.report.outcomes import outcome_of

if TYPE_CHECKING:
    from triage.records import ExperimentRun
    from triage.report.model import Report

StepSource = Literal["capture", "replay"]


class BatchPlace(BaseModel):
    """A snapshot batch in the run's terms."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    batch: int = Field(description="Its index in the snapshot (Setup.batches).")
    step: Optional[int] = Field(default=None, description="The run's training step at which it was used.")
    step_source: Optional[StepSource] = Field(
        default=None, description="capture: the capture's manifest recorded the step the run used it at; replay: "
                                  "the checkpoint's step + 1 + its index, the step the replays give it as they "
                                  "continue the run's count; None: no step is known.")
    checkpoint_step: Optional[int] = None
    tensor: Optional[str] = Field(default=None, description="The tensor of the batch that is wrong: its dict key "
                                                            "or tuple position ([0], ['x']).")
    value: Optional[float] = Field(default=None, description="The value found wrong in it (NaN, inf, or the "
                                                             "largest magnitude where that stands out).")
    value_index: list[int] = Field(default_factory=list, description="Where that value is in the tensor; its "
                                                                     "first entry is the example in the batch.")
    typical_value: Optional[float] = Field(default=None, description="The same tensor's largest |value|, median "
                                                                     "over the snapshot's batches.")
    sample_id: Optional[int] = Field(default=None, description="That example's index in the dataset, where the "
                                                               "batch carries it; None where it does not.")
    nonfinite: Optional[int] = Field(default=None, description="A data check's find: the tensor's NaN and Inf "
                                                               "values in all.")
    numel: Optional[int] = Field(default=None, description="The tensor's number of values.")

    def step_words(self) -> str:
        """`step 11 of the run (checkpoint step 5 + 6)`, `step 153 of the run (as the capture recorded)`,
        or `snapshot batch 2` where no step is known."""
        if self.step is None:
            return f"snapshot batch {self.batch}"
        if self.step_source == "capture":
            return f"step {self.step} of the run (snapshot batch {self.batch}, as the capture recorded it)"
        return f"step {self.step} of the run (snapshot batch {self.batch}: checkpoint step {self.checkpoint_step} " \
               f"+ {self.batch + 1})"

    def what_words(self) -> str:
        """`tensor [0] holds 6823 at [3, 17] (example 3 of the batch; ...)`; "" where no tensor was named."""
        return f"tensor {self.tensor} {self.value_words()}" if self.tensor is not None else ""

    def value_words(self) -> str:
        """`holds 6823 at [3, 17] (example 3 of the batch; the batches' largest |value| is typically 6.1)`."""
        where = f" at {self.value_index}" if self.value_index else ""
        example = f"example {self.value_index[0]} of the batch" if self.value_index else ""
        if self.sample_id is not None:
            example += f"{', ' if example else ''}dataset index {self.sample_id}"
        else:
            example += f"{'; ' if example else ''}its dataset index is not in the snapshot"
        typical = f"; the batches' largest |value| is typically {_show(self.typical_value)}" \
            if self.typical_value is not None else ""
        count = f"{self.nonfinite} of its {self.numel} values non-finite; " \
            if self.nonfinite is not None and self.numel is not None else ""
        return f"holds {_show(self.value)}{where} ({count}{example}{typical})"

    def words(self) -> str:
        what = self.what_words()
        return self.step_words() + (f": {what}" if what else "")


def batch_step(batch: int, checkpoint_step: Optional[int], batch_steps: Optional[list[int]]
               ) -> tuple[Optional[int], Optional[StepSource]]:
    """The run's step of snapshot batch `batch`: the capture's record, else checkpoint + 1 + batch."""
    if batch_steps and 0 <= batch < len(batch_steps):
        return batch_steps[batch], "capture"
    if checkpoint_step is not None and batch >= 0:
        return checkpoint_step + 1 + batch, "replay"
    return None, None


def batch_place(report: "Report", batch: int) -> BatchPlace:
    """Snapshot batch `batch` in the run's terms, with the tensor and value a data check or the batch scan
    found wrong in it."""
    step, source = batch_step(batch, report.checkpoint.step, report.checkpoint.batch_steps)
    found = _nonfinite_in(report.experiments, batch) or _outlier_in(report.experiments, batch) or {}
    return BatchPlace(batch=batch, step=step, step_source=source, checkpoint_step=report.checkpoint.step, **found)


def _nonfinite_in(experiments: list["ExperimentRun"], batch: int) -> dict[str, Any]:
    """The first non-finite tensor the data check found in training batch `batch`."""
    for run in experiments:
        checked = outcome_of(run, DataCheckOutcome)
        for entry in (checked.nonfinite if checked is not None else None) or []:
            if entry.split == "train" and entry.batch == batch:
                return {"tensor": entry.key, "value": _float(entry.first_value),
                        "value_index": list(entry.first_index or []), "sample_id": entry.sample_id,
                        "nonfinite": _int(entry.nan) + _int(entry.inf), "numel": entry.numel}
    return {}


def _outlier_in(experiments: list["ExperimentRun"], batch: int) -> dict[str, Any]:
    """The tensor whose scale the batch scan found standing out in batch `batch`."""
    for run in experiments:
        scan = outcome_of(run, BatchScanOutcome)
        if scan is not None and scan.worst_batch == batch and scan.worst_tensor:
            return {"tensor": scan.worst_tensor, "value": _float(scan.worst_value),
                    "value_index": list(scan.worst_value_index or []),
                    "typical_value": _float(scan.typical_value), "sample_id": scan.worst_sample_id}
    return {}


def replay_offset(report: "Report", runs: list["ExperimentRun"]) -> Optional[int]:
    """The run's step of replay step 0 (checkpoint + 1) where every run drawn on one axis continues from the
    checkpoint; None where the step is unknown or one of them restarted from a fresh initialisation."""
    if report.checkpoint.step is None or any(restarted(run) for run in runs):
        return None
    return report.checkpoint.step + 1


def restarted(run: "ExperimentRun") -> bool:
    """The replay started from a fresh initialisation (its own, or the init a search chose), not the checkpoint."""
    search = outcome_of(run, SearchOutcome)
    chosen = search.chosen if search is not None else None
    return run.params.get("init", "checkpoint") != "checkpoint" or (isinstance(chosen, str) and chosen.startswith("init="))


def nonfinite_step_words(step: Any, at: Optional[int]) -> str:
    """Where a replay went non-finite: `step 9 of the run` (at: the run's step of replay step 0), else
    `replay step 4` (counted from 0, as the outcome does); `an unknown step` where none was recorded."""
    if not isinstance(step, int) or isinstance(step, bool):
        return "an unknown step"
    return f"step {at + step} of the run" if at is not None else f"replay step {step}"


def step_axis(report: "Report") -> str:
    """The x label of a plot drawn at the run's steps."""
    return f"step of the run (the checkpoint's is {report.checkpoint.step})"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> Optional[float]:
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _show(value: Optional[float]) -> str:
    if value is None:
        return "—"
    if math.isnan(value):
        return "NaN"
    return ("inf" if value > 0 else "-inf") if math.isinf(value) else f"{value:.4g}"
