"""The playbook file's schema (YAML → these pydantic models)."""

from __future__ import annotations

import re
from typing import Any, Callable, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from triage.judge.differential import CLOSE

Confidence = Literal["high", "medium", "low"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _words(value: Any) -> Any:
    if isinstance(value, bool):  # YAML reads a bare yes/no/on/off as true/false
        raise ValueError(f"expected words, found the YAML boolean {str(value).lower()}: quote it (\"no\")")
    return value


class Branch(_Strict):
    when: str = Field(description="A condition over earlier outcomes.")
    goto: str = Field(description="The node to go to when it holds.")
    answer: Optional[str] = Field(default=None, description="The node's question answered in words when this "
                                                            "branch is taken, for the terminal and the report.")
    confidence: Optional[Confidence] = Field(
        default=None, description="The most a verdict reached through this branch may claim: a symptom read "
                                  "near its threshold (medium) caps whatever the walk finds after it.")

    _answer_words = field_validator("answer", mode="before")(_words)


class RunNode(_Strict):
    """Runs one experiment, then follows the first branch whose condition holds."""

    run: str = Field(description="A registered experiment name.")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="Its parameters.")
    title: Optional[str] = Field(default=None, description="What this step asks, for the report.")
    budget_s: Optional[float] = Field(default=None, gt=0, description="Ignored, with a warning (it was a wall-clock "
                                      "budget): an experiment runs its steps; --max-minutes bounds the walk.")
    branches: list[Branch] = Field(default_factory=list)
    otherwise: str = Field(description="Where to go when no branch holds.")
    otherwise_answer: Optional[str] = Field(default=None, description="The question answered in words when no "
                                                                      "branch holds.")

    _otherwise_words = field_validator("otherwise_answer", mode="before")(_words)


class DecisionNode(_Strict):
    """Runs nothing: follows the first branch whose condition on earlier outcomes holds."""

    decide: str = Field(description="The question it answers, for the report.")
    branches: list[Branch] = Field(min_length=1)
    otherwise: str = Field(description="Where to go when no branch holds.")
    otherwise_answer: Optional[str] = Field(default=None, description="The question answered in words when no "
                                                                      "branch holds.")

    _otherwise_words = field_validator("otherwise_answer", mode="before")(_words)

    @property
    def title(self) -> str:
        return self.decide


class Candidate(_Strict):
    """One counterfactual of a differential node: an experiment that applies one suspected cause's fix."""

    run: str = Field(description="A registered experiment name.")
    with_: dict[str, Any] = Field(default_factory=dict, alias="with", description="Its parameters.")
    title: Optional[str] = Field(default=None, description="What this candidate tries, for the report.")
    if_: Optional[str] = Field(
        default=None, alias="if", description="Tried only when this condition holds (the fix applies: the "
                                              "run uses fp16, a scheduler, weight decay, ...).")
    then: Optional[str] = Field(
        default=None, description="Where the walk goes when this candidate wins (its diagnosis). Without "
                                  "it the candidate is a control: a reference run others are paired with.")
    tier: int = Field(default=1, ge=1, description="Precedence when several fixes work: the lowest tier "
                                                   "wins (the more specific cause, or the one that repairs a "
                                                   "measured abnormality); within a tier, the best score.")
    measured: Optional[str] = Field(
        default=None, description="The abnormality this fix repairs, as a condition on what was measured "
                                  "(the run clips every step, its weights collapsed): when it holds, the "
                                  "candidate ranks in tier 1, above settings that would only mask the cause.")
    confidence: Optional[Confidence] = Field(
        default=None, description="The most a win by this candidate may claim where nothing it repairs was "
                                  "`measured` (a change so drastic it damps faults it is not the cause of).")
    budget_s: Optional[float] = Field(default=None, gt=0, description="Ignored, with a warning (it was a wall-clock "
                                      "budget): an experiment runs its steps; --max-minutes bounds the walk.")


class DifferentialNode(_Strict):
    """Differential diagnosis: tries every candidate fix from the same snapshot, in the order written,
    and goes where the winner says; `otherwise` when no candidate's fix works."""

    title: Optional[str] = Field(default=None, description="What this step asks, for the report.")
    differential: dict[str, Candidate] = Field(min_length=1, description="Candidate id → candidate.")
    works: str = Field(default="fix_works", description="The outcome field (true/false) that says a "
                                                        "candidate's fix is verified.")
    score: str = Field(default="loss_end", description="The outcome field that ranks working candidates "
                                                       "within a tier: lower is better.")
    close: float = Field(default=CLOSE, gt=0, le=1, description="A competitor of the winner's tier that also "
                                                             "works and scores within this ratio of the winner "
                                                             "makes the verdict medium confidence, not high.")
    otherwise: str = Field(description="Where to go when no candidate's fix works.")


class LeafNode(_Strict):
    """Ends the walk with a diagnosis."""

    diagnosis: str = Field(description="A root-cause id (DESIGN §4) or one of the playbook's own.")
    title: Optional[str] = Field(default=None, description="Required for an id of the playbook's own.")
    fix: str = Field(description="The fix, in a sentence. It may quote what was measured as {node.field} "
                                 "(e.g. where the run's train_step is defined), filled in by `fix_text`.")
    confidence: Confidence = Field(
        default="medium", description="The most this verdict may claim; reached through a differential "
                                      "node, the differential's own (measured) confidence caps it.")
    evidence: list[str] = Field(default_factory=list, description="Nodes whose outcomes support it.")
    proof: Optional[str] = Field(default=None, description="The node whose experiment applied the fix.")
    location: dict[str, str] = Field(
        default_factory=dict, description="Location fields (module, op, source, batch, parameters) "
                                          "filled from node.field references.")


    def fix_refs(self) -> list[str]:
        """The {node.field} references the fix quotes."""
        return FIX_REF.findall(self.fix)

    def fix_text(self, lookup: Callable[[str, str], Any]) -> str:
        """The fix with each {node.field} replaced by its measured value (4 significant digits)."""
        return filled(self.fix, lookup)


FIX_REF = re.compile(r"\{([A-Za-z_]\w*\.[A-Za-z_]\w*)\}")


def filled(text: str, lookup: Callable[[str, str], Any]) -> str:
    """`text` with each {node.field} replaced by its measured value (4 significant digits)."""
    def value(match: re.Match) -> str:
        found = lookup(*match.group(1).split("."))
        if found is None:
            return "(not measured)"
        return f"{found:.4g}" if isinstance(found, float) else str(found)
    return FIX_REF.sub(value, text)


class Finding(_Strict):
    """A secondary finding, reported beside the root cause when its condition holds."""

    id: str
    when: str
    text: str = Field(description="What was found. It may quote what was measured as {node.field}, as a fix may.")
    evidence: list[str] = Field(default_factory=list)
    confidence: Optional[Confidence] = Field(
        default=None, description="When it holds, the most the verdict may claim: a run of a kind the checks "
                                  "were not validated on (a loss negative by nature, an ambiguous target).")


class PlaybookFile(_Strict):
    name: str
    description: str = ""
    entry: str
    imports: list[str] = Field(default_factory=list, description="Modules exposing EXPERIMENTS.")
    defaults: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Experiment name → parameters every node running it starts from "
                                          "(a node's own `with:` overrides them).")
    nodes: dict[str, dict[str, Any]] = Field(description="Node id → a RunNode, a DifferentialNode or a LeafNode.")
    findings: list[Finding] = Field(default_factory=list)
