"""The report's schema: what report.json holds and every renderer reads. Versioned; it round-trips."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from triage.records import Decision, ExperimentRun
from triage.report.coordinates import BatchPlace
from triage.report.fix_trial import FixTrial
from triage.load.history import HistoryPoint
from triage.views import View

SCHEMA_VERSION = "1.9"

ReportStatus = Literal["complete", "incomplete", "interrupted"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")


class Location(_Frozen):
    """Where the fault is, as far as the experiments could tell."""

    module: Optional[str] = Field(default=None, description="Qualified module name, e.g. encoder.layers.1.norm.")
    module_type: Optional[str] = Field(default=None, description="Its class, e.g. LayerNorm.")
    previous_module: Optional[str] = Field(
        default=None, description="Where `module` is an nn.Sequential's bare index (`3`): the layer before it.")
    previous_module_type: Optional[str] = Field(default=None, description="That layer's class.")
    op: Optional[str] = Field(default=None, description="The autograd op, e.g. SqrtBackward0.")
    source: Optional[str] = Field(default=None, description="file:line of the user's code.")
    batch: Optional[int] = Field(default=None, description="Index of the bad snapshot batch.")
    batch_place: Optional[BatchPlace] = Field(
        default=None, description="That batch in the run's terms: the training step it was used at, the tensor "
                                  "and value found wrong in it, the example (schema 1.8).")
    parameters: Optional[list[str]] = Field(default=None, description="Parameter names involved.")
    rank: Optional[int] = Field(default=None, description="Distributed runs: the rank where it starts.")


class FindingRecord(_Frozen):
    id: str
    text: str
    evidence: list[str] = Field(default_factory=list, description="Node ids whose outcomes show it.")


class GraphCandidate(_Frozen):
    """A candidate of a differential node, as the playbook declares it."""

    id: str
    experiment: str
    title: Optional[str] = None
    then: Optional[str] = Field(default=None, description="The node it leads to when it wins; None: a control.")
    tier: int = 1


class GraphNode(_Frozen):
    id: str
    kind: Literal["run", "decision", "differential", "leaf"]
    label: str = Field(description="The experiment run, or the diagnosis id.")
    title: Optional[str] = None
    candidates: list[GraphCandidate] = Field(default_factory=list, description="A differential node's candidates.")


class GraphEdge(_Frozen):
    source: str
    target: str
    labels: list[str]


class Flowchart(_Frozen):
    name: str
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class DistributedInfo(_Frozen):
    """How a distributed run was triaged: one triage process per rank, in lockstep."""

    world_size: int
    backend: str = Field(description="The process group's backend (gloo, nccl).")
    wrapper: str = Field(description='What setup() returned: "ddp", "fsdp2" or "plain".')
    launch: str = Field(description="The command that launched the ranks (torchrun ...).")
    rank_timeout_s: float = Field(description="How long a rank may stay silent in a collective.")
    batches_per_rank: int = Field(description="Snapshot batches each rank replayed (the same on every rank).")


class Environment(_Frozen):
    triage: str
    torch: str
    python: str
    platform: str
    device: str
    precision: str
    seed: int
    playbook: str
    playbook_sha256: str
    distributed: Optional[DistributedInfo] = Field(default=None, description="None: a single process.")


class CheckpointInfo(_Frozen):
    path: Optional[str]
    layout: Optional[str]
    step: Optional[int]
    step_source: Optional[str] = Field(default=None, description="Where the step was read, e.g. the "
                                                                 "checkpoint's 'iter_num'.")
    capture_rank: Optional[int] = Field(default=None, description="A flight-recorder capture of a distributed "
                                                                  "run: the rank that wrote it.")
    capture_world_size: Optional[int] = Field(default=None, description="That run's number of ranks.")
    batch_steps: Optional[list[int]] = Field(
        default=None, description="A capture: the training step at which the run used each batch it saved, in "
                                  "the snapshot's order (the manifest's record; schema 1.8).")


class Report(_Frozen):
    schema_version: str = SCHEMA_VERSION
    status: ReportStatus = Field(
        default="complete", description="complete: the walk reached a verdict. incomplete: triage is still "
                                        "running, or stopped without finishing (report.json is rewritten "
                                        "after every experiment). interrupted: stopped by Ctrl-C; the "
                                        "experiments finished by then are all here, and no verdict.")
    created: str = Field(description="ISO time the triage finished.")
    root_cause: str = Field(description="A root-cause id (DESIGN §4) or a playbook's own.")
    title: str
    confidence: Literal["high", "medium", "low"]
    fix: str
    proof: Optional[str] = Field(default=None, description="Node id of the experiment that applied the fix.")
    unverified_proof: Optional[str] = Field(
        default=None, description="Node id of the experiment that applied the fix where it did not verify (a loop "
                                  "bug the reference loop did not clearly beat): evidence, not proof.")
    fix_trial: Optional[FixTrial] = Field(
        default=None, description="The proof's replay in values: each setting before and after, the step it was "
                                  "tried from, and the loss with the fix against without it (schema 1.7).")
    evidence: list[str] = Field(default_factory=list)
    location: Location
    findings: list[FindingRecord] = Field(default_factory=list)
    path: list[str] = Field(description="Node ids walked, entry to leaf.")
    decisions: list[Decision]
    experiments: list[ExperimentRun]
    views: dict[str, list[View]] = Field(
        default_factory=dict, description="What each experiment declared the report should draw of its "
                                          "outcome, by experiment name (triage/views.py).")
    flowchart: Flowchart
    history: list[HistoryPoint] = Field(default_factory=list, description="The failing run's loss curve.")
    checkpoint: CheckpointInfo
    environment: Environment
    command: str = Field(description="The command that reproduces this triage.")
    seconds: float
    stopped: Optional[str] = Field(default=None, description="Why the walk ended before a leaf (a rank raised "
                                                             "or stopped responding, or the --max-minutes ceiling "
                                                             "passed); None when it reached one.")
    cut: list[str] = Field(default_factory=list, description="Experiments the --max-minutes ceiling cut part way "
                                                             "or before they began: unmeasured, not ruled out.")

    def experiment(self, node: str) -> Optional[ExperimentRun]:
        return next((e for e in self.experiments if e.node == node), None)

    def data(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
