"""What loop_diff measures: the run's own train_step against the reference loop, from the same snapshot
on the same batches (triage/experiments/loop_diff.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class LoopDiffOutcome(Outcome):
    has_train_step: bool = Field(json_schema_extra={"words": "has train step"})
    train_step_source: Optional[str] = Field(
        default=None, description="file:line where the run's train_step is defined (None: none, or inspect cannot "
                                  "tell, as for a builtin).",
        json_schema_extra={"words": "train step source"})
    steps_run: int = Field(
        default=0, description="Training steps the replay ran.",
        json_schema_extra={"words": "steps replayed"})
    params_never_changed: list[str] = Field(
        default_factory=list, description="Trainable parameters the user's steps left exactly as they were.",
        json_schema_extra={"words": "parameters never changed"})
    unchanged_fraction: float = Field(
        default=0.0, description="Their share of the trainable elements.",
        json_schema_extra={"words": "unchanged share", "unit": "%"})
    reference_never_changed: list[str] = Field(
        default_factory=list, description="Trainable parameters the reference loop left unchanged too.",
        json_schema_extra={"words": "reference never changed"})
    extra_unchanged_fraction: float = Field(
        default=0.0, description="Share of trainable elements unchanged by the user's steps only.",
        json_schema_extra={"words": "extra unchanged share", "unit": "%"})
    grads_accumulate: bool = Field(
        default=False, description="grad_growth > growth_threshold.",
        json_schema_extra={"words": "gradients accumulate"})
    grad_growth: Optional[float] = Field(
        default=None, description="Median over the second half of the calls of |the gradient optimizer.step was "
                                  "given| / |the fresh gradients, at the same weights, of the batches since the "
                                  "gradients were last reset (zero_grad or a step)|, read against the loop's first "
                                  "step where that divides its micro-batches (accumulation); the gradient left after "
                                  "the call when nothing stepped. ~1 is normal; above growth_threshold, gradients "
                                  "accumulate.",
        json_schema_extra={"words": "gradient growth", "unit": "×"})
    stale_gradient_share: Optional[float] = Field(
        default=None, description="Several optimizers (a GAN's G and D): of the steps of the optimizer that kept them "
                                  "most, the share whose gradient was its previous step's gradient plus every "
                                  "gradient computed since, to 0.1%: nothing reset it in between (None: one "
                                  "optimizer, or too few steps to compare).",
        json_schema_extra={"words": "steps on a kept gradient", "unit": "%"})
    stale_optimizer: Optional[str] = Field(
        default=None, description="That optimizer's name (Setup.optimizers).",
        json_schema_extra={"words": "optimizer that kept its gradients"})
    stale_steps: Optional[int] = Field(
        default=None, description="Its steps given a kept gradient.",
        json_schema_extra={"words": "steps on a kept gradient"})
    stale_compared: Optional[int] = Field(
        default=None, description="That optimizer's steps compared with the one before.",
        json_schema_extra={"words": "steps compared"})
    foreign_gradient_share: Optional[float] = Field(
        default=None, description="Several optimizers (a GAN's G and D): of the steps of the optimizer that took "
                                  "them most, the share given, besides the gradients of its own backward, those of "
                                  "a backward that only other optimizers stepped on, to 0.1% (the critic's backward "
                                  "through a fake it did not detach, with the generator's zero_grad before it, not "
                                  "after; None: one optimizer, or too few steps to compare).",
        json_schema_extra={"words": "steps on another objective's gradient", "unit": "%"})
    foreign_optimizer: Optional[str] = Field(
        default=None, description="That optimizer's name (Setup.optimizers).",
        json_schema_extra={"words": "optimizer given another objective's gradient"})
    foreign_steps: Optional[int] = Field(
        default=None, description="Its steps given another objective's gradient.",
        json_schema_extra={"words": "steps on another objective's gradient"})
    foreign_compared: Optional[int] = Field(
        default=None, description="That optimizer's steps compared.",
        json_schema_extra={"words": "steps compared"})
    foreign_others: Optional[str] = Field(
        default=None, description="The optimizers that stepped on backwards it did not step on, quoted.",
        json_schema_extra={"words": "other objectives' optimizers"})
    closure_reevaluations: int = Field(
        default=0, description="Backwards of a closure optimizer's (LBFGS's) closure after the first inside one "
                               "step, over all the steps.",
        json_schema_extra={"words": "closure evaluated again"})
    closure_kept: int = Field(
        default=0, description="Of those, the backwards that began with the previous evaluation's gradient still "
                               "in the weights' .grad.",
        json_schema_extra={"words": "evaluations on a kept gradient"})
    closure_sums_gradients: bool = Field(
        default=False, description="On most of those (at least 4), the previous evaluation's gradient was still "
                                   "in the weights' .grad when the backward began: the closure does not reset "
                                   "the gradients, so each evaluation's gradient is summed with those before it "
                                   "and the line search compares losses with gradients of other points.",
        json_schema_extra={"words": "closure sums gradients"})
    step_grads_zero: bool = Field(
        default=False, description="The optimizer stepped, but every time on all-zero (or no) gradients.",
        json_schema_extra={"words": "step gradients zero"})
    separate_objectives: bool = Field(
        default=False, description="Several optimizers, and most backwards of the user's steps were stepped on "
                                   "by only some of them before the next backward (a GAN's critic, then its "
                                   "generator, in one call or in turns): several objectives, each optimizer "
                                   "minimising its own. Backwards that every optimizer steps on (several "
                                   "optimizers on one loss, accumulated or not) are one objective.",
        json_schema_extra={"words": "several objectives in a step"})
    left_in_eval: bool = Field(
        default=False, description="Some forward of the user's step ran in eval mode.",
        json_schema_extra={"words": "left in eval"})
    eval_forward_fraction: float = Field(
        default=0.0, description="Share of the user's forwards in eval mode.",
        json_schema_extra={"words": "eval forward share", "unit": "%"})
    eval_after_step: bool = Field(
        default=False, description="The model was in eval mode after a user step.",
        json_schema_extra={"words": "eval after step"})
    optimizer_stepped: bool = Field(
        default=False, description="The user's steps updated the weights: optimizer.step() ran, a GradScaler skipped "
                                   "a step on inf gradients, or (a loop with no optimizer object, or one that updates "
                                   "the weights by hand) the weights moved.",
        json_schema_extra={"words": "optimizer stepped", "ranks": "all"})
    optimizer_steps: int = Field(
        default=0, description="optimizer.step() calls the run's own step took (each optimizer of a set counts).",
        json_schema_extra={"words": "optimizer steps"})
    scaler_skipped_steps: int = Field(
        default=0, description="Calls in which Setup.scaler's scale fell: a GradScaler step skipped on inf gradients.",
        json_schema_extra={"words": "scaler skipped steps"})
    manual_updates: int = Field(
        default=0, description="Calls that moved the weights with no optimizer step.",
        json_schema_extra={"words": "manual updates"})
    zero_grad_calls: int = Field(
        default=0, description="optimizer.zero_grad() and model.zero_grad() calls.",
        json_schema_extra={"words": "zero gradient calls"})
    unknown_optimizers: Optional[str] = Field(
        default=None, description="The optimizers train_step stepped that setup() did not hand triage (None: none): "
                                  "replays cannot restore or reach them.",
        json_schema_extra={"words": "unknown optimizers"})
    loss_detached: bool = Field(
        default=False, description="No trainable parameter received a gradient in any user step, where the "
                                   "reference loop's backward of loss_fn reached some (where neither does, the "
                                   "graph is cut in the loss or the model, not in the loop).",
        json_schema_extra={"words": "loss detached"})
    returned_loss_has_grad: Optional[bool] = Field(
        default=None, description="The loss train_step returned is part of an autograd graph (a float or a detached "
                                  "tensor is a normal thing to return; None: not a tensor).",
        json_schema_extra={"words": "returned loss has gradient"})
    user_losses: list[float] = Field(default_factory=list, json_schema_extra={"words": "user losses"})
    reference_losses: list[float] = Field(default_factory=list, json_schema_extra={"words": "reference losses"})
    user_loss_ratio: Optional[float] = Field(
        default=None, description="Median last fifth / first fifth.",
        json_schema_extra={"words": "user loss ratio", "unit": "×"})
    reference_loss_ratio: Optional[float] = Field(
        default=None, description="The same for the reference.",
        json_schema_extra={"words": "reference loss ratio", "unit": "×"})
