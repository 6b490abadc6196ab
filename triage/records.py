"""The records the engine keeps and the report carries. Plain data: no torch here, so the report
can be re-rendered from report.json without importing torch."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["ok", "error", "oom", "timeout"]


class ExperimentRun(BaseModel):
    """One node's experiment as it ran."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    node: str = Field(description="The playbook node that ran it.")
    experiment: str = Field(description="The registered experiment name.")
    summary: str = Field(default="", description="What the experiment does, in a sentence.")
    params: dict[str, Any] = Field(description="Parameters as given, defaults filled in.")
    status: Status
    error: Optional[str] = Field(default=None, description="The traceback, when status is not ok.")
    seconds: float
    outcome: Optional[dict[str, Any]] = Field(default=None, description="The measured Outcome, as data.")


class Decision(BaseModel):
    """The branch taken at one node, and the figures its conditions read."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    node: str
    goto: str
    when: Optional[str] = Field(description="The condition that held; None: `otherwise` was taken.")
    figures: dict[str, Any]


class SetupFacts(BaseModel):
    """What a playbook condition may read as `setup.<field>`: facts of the run, not measurements."""

    model_config = ConfigDict(frozen=True)

    precision: str
    grad_clip: Optional[float]
    has_scheduler: bool
    has_train_step: bool
    has_val: bool
    total_steps: Optional[int]
    device_type: str
    checkpoint_step: Optional[int]
    batch_count: int
