"""What init_loss measures: the loss at the checkpoint, at setup()'s own init and at PyTorch's default
init, against ln K and the loss of learning nothing (triage/experiments/init_check.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome


class InitCheckOutcome(Outcome):
    num_classes: Optional[int] = Field(
        default=None, description="K, the number of scores the model outputs (the logits' last dim; classification).",
        json_schema_extra={"words": "classes"})
    expected_loss: Optional[float] = Field(
        default=None, description="ln K: uniform guessing.",
        json_schema_extra={"words": "loss of uniform guessing"})
    loss_checkpoint: float = Field(
        description="Mean loss over the batches checked, at the checkpoint's weights.",
        json_schema_extra={"words": "loss at the checkpoint"})
    loss_setup_init: float = Field(
        description="Loss with setup()'s own init (setup() called again).",
        json_schema_extra={"words": "loss setup init"})
    loss_default_init: float = Field(
        description="Loss with every module's reset_parameters().",
        json_schema_extra={"words": "loss default init"})
    checkpoint_ratio: Optional[float] = Field(
        default=None, description="loss_checkpoint / ln K.",
        json_schema_extra={"words": "checkpoint ratio", "unit": "×"})
    setup_init_ratio: Optional[float] = Field(
        default=None, description="loss_setup_init / ln K.",
        json_schema_extra={"words": "setup init ratio", "unit": "×"})
    default_init_ratio: Optional[float] = Field(
        default=None, description="loss_default_init / ln K.",
        json_schema_extra={"words": "default init ratio", "unit": "×"})
    setup_init_vs_nothing: Optional[float] = Field(
        default=None, description="loss_setup_init / the loss of learning nothing (label entropy, binary entropy, "
                                  "target variance): >> 1 is an init that starts far from sane, for models without ln "
                                  "K too.",
        json_schema_extra={"words": "setup init vs nothing", "unit": "×"})
    activation_std_growth_checkpoint: Optional[float] = Field(
        default=None, description="Std of the last Linear/Conv output over the first's, at the checkpoint.",
        json_schema_extra={"words": "activation std growth checkpoint"})
    activation_std_growth_setup: Optional[float] = Field(
        default=None, description="The same at setup()'s init: >> 1 is activations exploding with depth.",
        json_schema_extra={"words": "activation std growth setup"})
    activation_std_growth_default: Optional[float] = Field(
        default=None, description="The same at default init.",
        json_schema_extra={"words": "activation std growth default"})
    setup_init_is_default: Optional[bool] = Field(
        default=None, description="setup()'s init is PyTorch's default scheme: every weight matrix's spread at "
                                  "setup()'s init within 25% of its spread after reset_parameters(). A restart with "
                                  "the default init is then the run's own init redrawn, a control.",
        json_schema_extra={"words": "setup init is default"})
    weight_norm_checkpoint: float = Field(
        description="Norm of all the checkpoint's weight matrices (dim >= 2).",
        json_schema_extra={"words": "weight norm checkpoint"})
    weight_norm_setup_init: float = Field(
        description="The same at setup()'s own init.",
        json_schema_extra={"words": "weight norm setup init"})
    weight_norm_vs_init: Optional[float] = Field(
        default=None, description="weight_norm_checkpoint / weight_norm_setup_init: well below 1 is weights that "
                                  "collapsed since the start (weight decay, say); well above, weights that blew up.",
        json_schema_extra={"words": "weight norm vs init", "unit": "×"})
