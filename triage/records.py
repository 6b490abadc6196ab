"""The records the engine keeps and the report carries. Plain data: no torch here, so the report
can be re-rendered from report.json without importing torch."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

# not_applicable: the experiment cannot run in this setup (its reason in `error`); never "tried", never "ruled out".
Status = Literal["ok", "error", "oom", "timeout", "not_applicable"]
Confidence = Literal["high", "medium", "low"]


class ExperimentRun(BaseModel):
    """One node's experiment as it ran."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    node: str = Field(description="The playbook node that ran it.")
    experiment: str = Field(description="The registered experiment name.")
    summary: str = Field(default="", description="What the experiment does, in a sentence.")
    params: dict[str, Any] = Field(description="Parameters as given, defaults filled in.")
    status: Status = Field(description="ok, error, oom, timeout or not applicable.",
                           json_schema_extra={"words": "how it ended"})  # a condition may read it (`baseline.status`)
    error: Optional[str] = Field(default=None, description="The traceback, when status is not ok.")
    seconds: float
    outcome: Optional[dict[str, Any]] = Field(default=None, description="The measured Outcome, as data.")
    same_as: Optional[str] = Field(
        default=None, description="The earlier node whose outcome this is: the same experiment with the same "
                                  "parameters as they act in this session (from the same snapshot and seed), "
                                  "so it was not run twice.")
    per_rank: dict[str, list[Any]] = Field(
        default_factory=dict, description="Distributed runs: the figures that differed between ranks, one "
                                          "value per rank (the outcome holds them reduced across ranks).")


class CandidateResult(BaseModel):
    """One candidate of a differential node: whether it was tried, whether its fix works, its score."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    id: str
    experiment: str
    then: Optional[str] = Field(description="The node it leads to when it wins; None for a control.")
    tier: int = Field(description="Its precedence as ranked: 1 where its `measured` abnormality held.")
    measured: Optional[bool] = Field(default=None, description="Its `measured` condition, where it declares one.")
    tried: bool = Field(description="It ran: its `if` held (or it has none), it was not outranked, and it could "
                                    "run in this setup (not `not_applicable`).")
    status: Optional[Status] = Field(default=None, description="How its experiment ended, where it was run: "
                                                               "ok, error, oom, timeout or not_applicable.")
    outranked: bool = Field(default=False, description="Not run: a fix of a lower tier already worked, and a "
                                                       "candidate of this tier could not win against it.")
    cap: Optional[Confidence] = Field(default=None, description="The most its win may claim (the candidate's "
                                                               "`confidence:`, where nothing was `measured`).")
    cap_reason: Optional[str] = Field(default=None, description="Why its win may claim less than high, where a "
                                                                "figure it measured says so (judge/differential.py).")
    unneeded: bool = Field(default=False, description="Not run: a control (no `then`) that no candidate tried "
                                                      "is compared with.")
    raced_out: Optional[str] = Field(default=None, description="Stopped before its last step: it could no longer "
                                                               "work (judge/race.py); why, in figures.")
    works: Optional[bool] = Field(default=None, description="The differential's `works` field, as measured.")
    score: Optional[float] = Field(default=None, description="The differential's `score` field (lower is better).")
    winner: bool = False
    also_works: bool = Field(default=False, description="A competitor of the winner's tier whose fix works "
                                                        "about as well (the verdict is then medium confidence).")


class Clause(BaseModel):
    """A clause of a branch condition that held when the engine took the branch."""

    model_config = ConfigDict(frozen=True)

    text: str = Field(description="As the playbook writes it, e.g. `not baseline.finite`.")
    refs: list[str] = Field(description="The `node.field` figures it reads, in reading order.")


class Decision(BaseModel):
    """The branch taken at one node, and the figures its conditions read."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    node: str
    goto: str
    when: Optional[str] = Field(description="The condition that held; None: `otherwise` was taken.")
    answer: Optional[str] = Field(default=None, description="The playbook's words for the branch taken "
                                                            "(`answer:` / `otherwise_answer:`), where it has them.")
    figures: dict[str, Any]
    settled: list[Clause] = Field(
        default_factory=list, description="The clauses that settled the branch, as the engine evaluated them "
                                          "on the unrounded figures: of the condition that held, those that "
                                          "made it hold (of an `or`, the ones that were true); when "
                                          "`otherwise` was taken, what made each condition fail.")
    candidates: list[CandidateResult] = Field(
        default_factory=list, description="At a differential node: every candidate, in the order written.")
    confidence: Optional[Confidence] = Field(
        default=None, description="At a differential node: high when the winner's fix works and every "
                                  "competitor of its tier did clearly worse, medium when one also works, "
                                  "low when no fix works.")
    cap: Optional[Confidence] = Field(
        default=None, description="At a decision: the most a verdict reached through the branch taken may claim "
                                  "(the playbook's `confidence:` on it: a symptom read near its threshold).")
    errors: list[str] = Field(
        default_factory=list, description="Conditions that could not be evaluated here (an overflow, say): "
                                          "each made its figure unknown, and the walk went on.")

    @model_validator(mode="before")
    @classmethod
    def _from_schema_1_3(cls, data: Any) -> Any:
        """A 1.3 report kept the clauses that held as `held` (and their refs again as `deciding`)."""
        if isinstance(data, dict) and "held" in data:
            data = {k: v for k, v in data.items() if k not in ("held", "deciding")} | \
                {"settled": data["held"] if data.get("when") is not None else []}
        return data

    @property
    def deciding(self) -> list[str]:
        """The keys of `figures` the settling clauses read, in reading order."""
        return list(dict.fromkeys(ref for clause in self.settled for ref in clause.refs))


class SetupFacts(BaseModel):
    """What a playbook condition may read as `setup.<field>`: facts of the run, not measurements."""

    model_config = ConfigDict(frozen=True)

    precision: str
    grad_clip: Optional[float]
    weight_decay: float = Field(description="The largest weight decay over the optimizer's param groups.")
    decay_reach: Optional[float] = Field(
        default=None, description="The share of the weights that weight decay alone can remove over the "
                                  "checkpoint's steps and 100 more: their sum of lr x weight_decay (the "
                                  "schedule's initial LR where higher; x1/(1-momentum) for SGD). None where "
                                  "that does not bound it (Adam's coupled L2, other optimizers, no step).")
    has_scheduler: bool
    has_train_step: bool
    auxiliary_term_count: int = Field(
        default=0, description="Loss terms Setup.auxiliary_terms names (a regulariser, a load-balancing loss).")
    has_val: bool
    total_steps: Optional[int]
    device_type: str
    checkpoint_step: Optional[int]
    batch_count: int
    optimizer_count: int = Field(default=1, description="Optimizers the run steps (Setup.optimizers: a GAN's 2).")
