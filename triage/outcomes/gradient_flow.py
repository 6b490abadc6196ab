"""What gradient_flow measures: the gradient each parameter gets in one forward/backward at the
checkpoint's weights (triage/experiments/gradient_flow.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class ParamGradNorm(Outcome):
    """One parameter's gradient: its L2 norm (0.0 when it got none) and its size."""

    name: str = Field(description="The parameter's name.", json_schema_extra={"words": "name"})
    norm: float = Field(json_schema_extra={"words": "norm"})
    numel: int = Field(json_schema_extra={"words": "elements"})


class GradientFlowOutcome(Outcome):
    loss: Optional[float] = Field(
        default=None, description="Mean loss over the batches used.",
        json_schema_extra={"words": "loss"})
    layer_norms: list[ParamGradNorm] = Field(
        description="Per parameter, in registration (depth) order.",
        json_schema_extra={"words": "layer norms"})
    trainable_count: int = Field(
        description="Parameters with requires_grad that the optimizer holds.",
        json_schema_extra={"words": "trainable count"})
    no_grad: list[str] = Field(
        description="Trainable parameters that got no gradient at all (grad None): the graph from them to the loss is "
                    "cut.",
        json_schema_extra={"words": "no gradient"})
    no_grad_count: int = Field(json_schema_extra={"words": "no gradient count"})
    no_grad_fraction: float = Field(
        description="Of the trainable parameters' elements.",
        json_schema_extra={"words": "no gradient share", "unit": "%"})
    zero_grad: list[str] = Field(
        default_factory=list, description="Trainable parameters whose gradient is exactly zero through an intact "
                                          "graph (e.g. behind dead units).",
        json_schema_extra={"words": "zero gradient"})
    zero_grad_fraction: float = Field(
        default=0.0, description="Of the trainable parameters' elements.",
        json_schema_extra={"words": "zero gradient share", "unit": "%"})
    frozen: list[str] = Field(
        description="Parameters with requires_grad=False (those frozen by design left out).",
        json_schema_extra={"words": "frozen"})
    frozen_count: int = Field(json_schema_extra={"words": "frozen count"})
    frozen_fraction: float = Field(
        description="Of all parameter elements.",
        json_schema_extra={"words": "frozen share", "unit": "%"})
    not_in_optimizer: list[str] = Field(
        description="requires_grad=True but in no optimizer param group (those left out by design not counted).",
        json_schema_extra={"words": "not in optimizer"})
    not_in_optimizer_count: int = Field(json_schema_extra={"words": "not in optimizer count"})
    not_in_optimizer_fraction: float = Field(
        description="Of all parameter elements.",
        json_schema_extra={"words": "not in optimizer share", "unit": "%"})
    outside_with_grad_fraction: float = Field(
        default=0.0, description="Of all parameter elements, those in no optimizer that got a gradient: the loss "
                                 "trains them, nothing steps them.",
        json_schema_extra={"words": "gradient outside the optimizer", "unit": "%"})
    by_design: list[str] = Field(
        default_factory=list, description="Parameters that do not train on purpose: a PEFT model's base, or the names "
                                          "Setup.frozen_by_design declares.",
        json_schema_extra={"words": "by design"})
    by_design_fraction: float = Field(
        default=0.0, description="Of all parameter elements.",
        json_schema_extra={"words": "by design share", "unit": "%"})
    peft: bool = Field(
        default=False, description="The model is a PEFT model (adapters on a frozen base).",
        json_schema_extra={"words": "PEFT"})
    loss_has_grad: bool = Field(
        description="The loss is attached to a graph (loss.requires_grad).",
        json_schema_extra={"words": "loss has gradient", "ranks": "all"})
    early_late_ratio: Optional[float] = Field(
        default=None, description="Median grad norm of the first quarter of weight matrices (dim >= 2) over that of "
                                  "the last quarter.",
        json_schema_extra={"words": "early late ratio", "unit": "×"})
    min_layer_norm: Optional[float] = Field(
        default=None, description="Over parameters that got a gradient.",
        json_schema_extra={"words": "min layer norm"})
    max_layer_norm: Optional[float] = Field(default=None, json_schema_extra={"words": "max layer norm"})
    auxiliary_terms: list[str] = Field(
        default_factory=list, description="The loss terms Setup.auxiliary_terms names (a regulariser, a load-balancing "
                                          "loss): the objective is the other terms.",
        json_schema_extra={"words": "auxiliary terms"})
    auxiliary_declared: Optional[bool] = Field(
        default=None, description="True where Setup.auxiliary_terms named the auxiliary terms; False where it named "
                                  "none, and the term reported is the one of the loss's terms that alone trains the "
                                  "largest share of weights the others read; None where the loss has no terms.",
        json_schema_extra={"words": "auxiliary terms named by the run"})
    objective_reaches_input: Optional[bool] = Field(
        default=None, description="Where the run named no auxiliary term: whether the other terms' gradient reaches "
                                  "any weight of a module handed the batch's inputs (False: everything they train "
                                  "sits after a step that passes no gradient). None where not read.",
        json_schema_extra={"words": "objective's gradient reaches the input layer"})
    objective_missed: list[str] = Field(
        default_factory=list, description="Trainable parameters the whole loss's gradient reaches and the objective's "
                                          "does not: only the auxiliary terms train them.",
        json_schema_extra={"words": "missed by the objective"})
    objective_missed_fraction: float = Field(
        default=0.0, description="Of the trainable parameters' elements.",
        json_schema_extra={"words": "missed by the objective share", "unit": "%"})
    objective_shift: Optional[float] = Field(
        default=None, description="How much the objective's value moves (relative, on the first batch, in eval mode) "
                                  "when the parameters it sends no gradient are moved by a tenth of their size: above "
                                  "0, it reads them through a step that passes no gradient (an argmax, an index).",
        json_schema_extra={"words": "objective shift when they move", "unit": "%"})
