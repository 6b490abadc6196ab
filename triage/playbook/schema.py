"""The playbook file's schema (YAML → these pydantic models)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Confidence = Literal["high", "medium", "low"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Branch(_Strict):
    when: str = Field(description="A condition over earlier outcomes.")
    goto: str = Field(description="The node to go to when it holds.")


class RunNode(_Strict):
    """Runs one experiment, then follows the first branch whose condition holds."""

    run: str = Field(description="A registered experiment name.")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="Its parameters.")
    title: Optional[str] = Field(default=None, description="What this step asks, for the report.")
    budget_s: float = Field(default=60.0, gt=0, description="Wall-clock budget of the experiment.")
    branches: list[Branch] = Field(default_factory=list)
    otherwise: str = Field(description="Where to go when no branch holds.")


class LeafNode(_Strict):
    """Ends the walk with a diagnosis."""

    diagnosis: str = Field(description="A root-cause id (DESIGN §4) or one of the playbook's own.")
    title: Optional[str] = Field(default=None, description="Required for an id of the playbook's own.")
    fix: str = Field(description="The fix, in a sentence.")
    confidence: Confidence = "medium"
    evidence: list[str] = Field(default_factory=list, description="Nodes whose outcomes support it.")
    proof: Optional[str] = Field(default=None, description="The node whose experiment applied the fix.")
    location: dict[str, str] = Field(
        default_factory=dict, description="Location fields (module, op, source, batch, parameters) "
                                          "filled from node.field references.")


class Finding(_Strict):
    """A secondary finding, reported beside the root cause when its condition holds."""

    id: str
    when: str
    text: str
    evidence: list[str] = Field(default_factory=list)


class PlaybookFile(_Strict):
    name: str
    description: str = ""
    entry: str
    imports: list[str] = Field(default_factory=list, description="Modules exposing EXPERIMENTS.")
    nodes: dict[str, dict[str, Any]] = Field(description="Node id → a RunNode or a LeafNode.")
    findings: list[Finding] = Field(default_factory=list)
