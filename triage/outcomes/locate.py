"""What locate_nonfinite finds: the first step, module, op and source line that produce a non-finite value
(triage/experiments/locate.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome
from triage.views import SourceLine


class LocateOutcome(Outcome):
    found: bool = Field(
        description="A step with a non-finite loss or gradient was reached.",
        json_schema_extra={"words": "found"})
    step: Optional[int] = Field(
        default=None, description="That step (0-based, as replay counts).",
        json_schema_extra={"words": "step"})
    steps_run: int = Field(
        default=0, description="Training steps the replay ran.",
        json_schema_extra={"words": "steps replayed"})
    truncated: bool = Field(
        default=False, description="Cut by the walk's ceiling (--max-minutes) before finding one.",
        json_schema_extra={"words": "cut short by the time ceiling"})
    stage: Optional[str] = Field(
        default=None, description='"forward" or "backward": where it first appears (None: the step did not repeat '
                                  "its failure).",
        json_schema_extra={"words": "stage"})
    forward_module: Optional[str] = Field(
        default=None, description="First module creating a non-finite output.",
        json_schema_extra={"words": "forward module"})
    forward_module_type: Optional[str] = Field(default=None, json_schema_extra={"words": "forward module type"})
    backward_module: Optional[str] = Field(
        default=None, description="Module whose forward built the first autograd node with a non-finite grad.",
        json_schema_extra={"words": "backward module"})
    module: Optional[str] = Field(
        default=None, description="The culprit module for the stage.",
        json_schema_extra={"words": "module"})
    module_type: Optional[str] = Field(
        default=None, description="Its class: Linear, LayerNorm, ...",
        json_schema_extra={"words": "module type"})
    previous_module: Optional[str] = Field(
        default=None, description="Where the culprit is an nn.Sequential's bare index (`3`): the layer run before it, "
                                  "which names the place better than a number.",
        json_schema_extra={"words": "previous module"})
    previous_module_type: Optional[str] = Field(default=None, json_schema_extra={"words": "previous module type"})
    op: Optional[str] = Field(
        default=None, description='The operation that first produced a non-finite value: "Tensor.div", '
                                  '"SqrtBackward0", ...',
        json_schema_extra={"words": "op"})
    domain_edge: Optional[bool] = Field(
        default=None, description="The op has an edge to its domain where finite inputs give NaN/Inf (a log, a "
                                  "division, a square root, a power, ...); false for ops that only overflow (a "
                                  "matmul, an add, exp): values that grew past the dtype's range.",
        json_schema_extra={"words": "domain edge"})
    anomaly_op: Optional[str] = Field(
        default=None, description="The node anomaly mode's NaN check named.",
        json_schema_extra={"words": "anomaly op"})
    source: Optional[str] = Field(
        default=None, description='"path/file.py:123" of the user code.',
        json_schema_extra={"words": "source"})
    source_line: Optional[str] = Field(default=None, json_schema_extra={"words": "source line"})
    source_context: list[SourceLine] = Field(
        default_factory=list, description="Lines around it, the line marked.",
        json_schema_extra={"words": "source context"})
    inputs_finite: Optional[bool] = Field(
        default=None, description="The culprit's inputs (forward) or incoming gradients (backward) were finite.",
        json_schema_extra={"words": "inputs finite"})
    loss_finite: bool = Field(
        default=True, description="The loss of the failing step was finite.",
        json_schema_extra={"words": "loss finite"})
    nonfinite_parameters: list[str] = Field(
        default_factory=list, description="Parameters already non-finite before the failing step (an earlier "
                                          "optimizer update overflowed them).",
        json_schema_extra={"words": "non-finite parameters"})
    rank: Optional[int] = Field(
        default=None, description="Distributed: the rank where the non-finite value starts (its own step creates it; "
                                  "the module, op and source line are that rank's).",
        json_schema_extra={"words": "rank"})
    located_ranks: list[int] = Field(
        default_factory=list, description="Distributed: every rank whose own step created a non-finite value.",
        json_schema_extra={"words": "located ranks"})
