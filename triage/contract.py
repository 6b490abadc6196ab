"""`triage.Setup`: what the user's `setup()` returns (DESIGN §1).

The field names are a fixed contract: other code and tests rely on them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["fp32", "bf16", "fp16"]

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Setup(BaseModel):
    """The model, optimizer, loss and data snapshot of the failing run."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", frozen=True)

    model: torch.nn.Module = Field(description="The network, as the failing run built it.")
    optimizer: torch.optim.Optimizer = Field(description="Bound to model.parameters().")
    loss_fn: Callable[..., Any] = Field(description="loss_fn(model, batch) -> scalar tensor.")
    batches: Any = Field(description="The data snapshot: a list of batches or a DataLoader.")
    val_batches: Optional[Any] = Field(default=None, description="Validation batches, if any.")
    scheduler: Optional[Any] = Field(default=None, description="An LR scheduler with state_dict().")
    scaler: Optional[Any] = Field(default=None, description="A torch GradScaler, if the run used one.")
    precision: Precision = Field(default="fp32", description="Autocast dtype of the failing run.")
    grad_clip: Optional[float] = Field(default=None, gt=0, description="Global-norm clip of the run.")
    train_step: Optional[Callable[..., Any]] = Field(
        default=None, description="The run's own step(model, optimizer, batch) -> loss."
    )
    total_steps: Optional[int] = Field(default=None, gt=0, description="Planned length of the run.")
    frozen_by_design: tuple[str, ...] = Field(
        default=(), description="Parameters left untrained on purpose (a linear probe's body, a fixed embedding): "
                                "names or name prefixes such as 'backbone'. They are not a frozen_parameters "
                                "fault. A PEFT model's base is recognised without this.")
    epoch_batches: Optional[Callable[[int], Any]] = Field(
        default=None, description="The run's data for one epoch, as its loop gets it: epoch_batches(epoch) -> "
                                  "the loader (e.g. `sampler.set_epoch(epoch); return loader`). Best called by "
                                  "the loop itself; lets triage check that epochs change order.")
    device: str = Field(default="cpu", description='Where to run: "cpu", "cuda", "cuda:1", ...')

    @field_validator("device", mode="before")
    @classmethod
    def _device_as_text(cls, value: Any) -> str:
        if isinstance(value, torch.device):
            return str(value)
        torch.device(value)  # raises a clear RuntimeError-turned-ValueError on nonsense
        return value

    @field_validator("batches", "val_batches")
    @classmethod
    def _iterable(cls, value: Any) -> Any:
        if value is None or isinstance(value, (list, tuple, torch.utils.data.DataLoader)):
            return value
        if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict, torch.Tensor)):
            return value
        raise ValueError(f"expected a list of batches or a DataLoader, found {type(value).__name__}")

    @field_validator("scheduler")
    @classmethod
    def _has_state(cls, value: Any) -> Any:
        if value is not None and not hasattr(value, "state_dict"):
            raise ValueError(f"expected an LR scheduler with state_dict(), found {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _optimizer_holds_model_params(self) -> "Setup":
        model_params = {id(p) for p in self.model.parameters()}
        optimizer_params = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if optimizer_params and not optimizer_params & model_params:
            raise ValueError(
                "the optimizer holds none of model.parameters(); build it from this model "
                "(e.g. torch.optim.AdamW(model.parameters(), ...))"
            )
        return self
