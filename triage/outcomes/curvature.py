"""What curvature measures: the sharpness at the checkpoint against the largest this optimizer at this LR
keeps stable (triage/experiments/curvature.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class CurvatureOutcome(Outcome):
    sharpness: Optional[float] = Field(
        default=None, description="Top eigenvalue of the loss's Hessian (of P^-1 H, preconditioned, for Adam).",
        json_schema_extra={"words": "sharpness"})
    estimates: list[float] = Field(
        default_factory=list, description="The power iteration's estimate per step.",
        json_schema_extra={"words": "estimates"})
    preconditioned: bool = Field(
        default=False, description="Adam-style: the eigenvalue of P^-1 H.",
        json_schema_extra={"words": "preconditioned"})
    lr: Optional[float] = Field(
        default=None, description="The run's LR at the checkpoint (its first param group).",
        json_schema_extra={"words": "learning rate"})
    edge: Optional[float] = Field(
        default=None, description="The largest sharpness this optimizer at this LR keeps stable: 2(1+momentum)/lr, "
                                  "38/lr for Adam.",
        json_schema_extra={"words": "stable limit of sharpness"})
    edge_ratio: Optional[float] = Field(
        default=None, description="sharpness / edge: above 1, past the edge of stability at the run's LR.",
        json_schema_extra={"words": "sharpness / stable limit", "unit": "×"})
    stable_lr_scale: Optional[float] = Field(
        default=None, description="The LR factor at which sharpness meets the edge (1 / edge_ratio).",
        json_schema_extra={"words": "stable LR scale"})
    converged: bool = Field(
        default=False, description="The estimate settled within tolerance.",
        json_schema_extra={"words": "converged"})
