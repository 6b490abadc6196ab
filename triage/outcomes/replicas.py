"""What replica_sync measures: whether the ranks of a data-parallel run hold the same parameters
(triage/experiments/replicas.py)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from triage.outcomes.base import Outcome

Moment = Literal["checkpoint", "init", "replay"]


class ParamSpread(Outcome):
    name: str = Field(description="The parameter's name.", json_schema_extra={"words": "name"})
    moment: Moment = Field(json_schema_extra={"words": "moment"})
    spread: float = Field(
        description="max over elements of (largest - smallest rank's value) / max |w|.",
        json_schema_extra={"words": "spread"})


class ReplicaOutcome(Outcome):
    world_size: int = Field(description="Processes in the distributed run.", json_schema_extra={"words": "ranks"})
    wrapper: str = Field(
        description='What setup() returned: "ddp", "fsdp2" (sharded) or "plain".',
        json_schema_extra={"words": "wrapper"})
    applies: bool = Field(
        description="Replicas to compare: more than one rank, parameters not sharded.",
        json_schema_extra={"words": "applies"})
    parameter_count: int = Field(default=0, json_schema_extra={"words": "parameter count"})
    differ_at_checkpoint: list[str] = Field(
        default_factory=list, description="Parameters that differ at the checkpoint (setup()'s init when none was "
                                          "given).",
        json_schema_extra={"words": "differ at checkpoint"})
    differ_at_init: list[str] = Field(
        default_factory=list, description="Parameters setup() itself builds differently on each rank.",
        json_schema_extra={"words": "differ at init"})
    drifted: list[str] = Field(
        default_factory=list, description="Parameters equal at the checkpoint that differ after the replay.",
        json_schema_extra={"words": "drifted"})
    parameters: list[str] = Field(
        default_factory=list, description="Every parameter out of sync, worst first.",
        json_schema_extra={"words": "parameters"})
    out_of_sync_count: int = Field(default=0, json_schema_extra={"words": "out of sync count"})
    first_moment: Optional[Moment] = Field(
        default=None, description="The first moment replicas differed.",
        json_schema_extra={"words": "first moment"})
    worst_parameter: Optional[str] = Field(default=None, json_schema_extra={"words": "worst parameter"})
    max_spread: Optional[float] = Field(
        default=None, description="The largest relative spread measured.",
        json_schema_extra={"words": "max spread"})
    ranks_apart: list[int] = Field(
        default_factory=list, description="Ranks whose copy of the worst parameter differs from the most common one.",
        json_schema_extra={"words": "ranks apart"})
    steps_run: int = Field(
        default=0, description="Training steps the replay ran.",
        json_schema_extra={"words": "steps replayed"})
    loop: Optional[str] = Field(
        default=None, description="Whose step the replay ran: the run's own or the reference.",
        json_schema_extra={"words": "loop"})
    spreads: list[ParamSpread] = Field(
        default_factory=list, description="The parameters out of sync (at most 20).",
        json_schema_extra={"words": "spreads"})
    explanation: Optional[str] = Field(
        default=None, description="What the pattern points to.",
        json_schema_extra={"words": "explanation"})
