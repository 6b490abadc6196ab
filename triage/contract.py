"""`triage.Setup`: what the user's `setup()` returns (DESIGN §1).

The field names are a fixed contract: other code and tests rely on them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from triage.optimizer_set import ManualUpdate, OptimizerSet

Precision = Literal["fp32", "bf16", "fp16"]

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(precision: str, device: "torch.device | str") -> contextlib.AbstractContextManager:
    """The run's autocast at `precision` on `device` (none for fp32): what every replay and probe runs under."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=AUTOCAST_DTYPES[precision])


class Setup(BaseModel):
    """The model, optimizer, loss and data snapshot of the failing run."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", frozen=True)

    model: torch.nn.Module = Field(description="The network, as the failing run built it.")
    optimizer: torch.optim.Optimizer = Field(
        description="Bound to model.parameters(). Several optimizers: pass `optimizers` instead (this then "
                    "holds them as one OptimizerSet). No optimizer object at all (a loop that updates the "
                    "weights itself): leave both out, give train_step and, to let LR candidates reach it, "
                    "manual_lr.")
    optimizers: Optional[dict[str, torch.optim.Optimizer]] = Field(
        default=None, description='Several optimizers by name, e.g. {"G": opt_g, "D": opt_d}: train_step is '
                                  "then handed them as one OptimizerSet (`optimizers['G']`), and a checkpoint's "
                                  "optimizer states are matched to them by name.")
    manual_lr: Optional[float] = Field(
        default=None, gt=0, description="The LR of a loop with no optimizer object: triage then calls "
                                        "train_step(model, lr, batch) with the LR each replay step uses.")
    loss_fn: Callable[..., Any] = Field(
        description="loss_fn(model, batch) -> scalar tensor, or a dict of named scalar terms whose sum is the loss "
                    "({'task': ..., 'balance': ...}).")
    auxiliary_terms: tuple[str, ...] = Field(
        default=(), description="Terms of loss_fn's dict that are not the task's objective: a regulariser written into "
                                "the loss (an L2 penalty), an auxiliary loss (a load-balancing term). triage trains on "
                                "every term and judges by the others: it checks that the objective's gradient reaches "
                                "the weights it depends on, and tries the run without these terms.")
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
    scheduler_interval: Literal["step", "epoch"] = Field(
        default="step", description='How often the run stepped its scheduler: once per optimizer step, or '
                                    'once per epoch of steps_per_epoch steps. ReduceLROnPlateau is handed '
                                    "the mean training loss since its last step.")
    steps_per_epoch: Optional[int] = Field(
        default=None, gt=0, description='Optimizer steps in one epoch of the run (needed with '
                                        'scheduler_interval="epoch").')
    frozen_by_design: tuple[str, ...] = Field(
        default=(), description="Parameters left untrained on purpose (a linear probe's body, a fixed embedding): "
                                "names or name prefixes such as 'backbone'. They are not a frozen_parameters "
                                "fault. A PEFT model's base is recognised without this.")
    epoch_batches: Optional[Callable[[int], Any]] = Field(
        default=None, description="The run's data for one epoch, as its loop gets it: epoch_batches(epoch) -> "
                                  "the loader (e.g. `sampler.set_epoch(epoch); return loader`). Best called by "
                                  "the loop itself; lets triage check that epochs change order.")
    device: str = Field(default="cpu", description='Where to run: "cpu", "cuda", "cuda:1", ...')

    @model_validator(mode="before")
    @classmethod
    def _one_optimizer_object(cls, data: Any) -> Any:
        """Several optimizers become one OptimizerSet, no optimizer (a manual update) a ManualUpdate."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        given, named = data.get("optimizer"), data.get("optimizers")
        if isinstance(given, (dict, list, tuple)) and named is None:  # optimizer={"G": ..., "D": ...} or [a, b]
            named = given if isinstance(given, dict) else {str(i): o for i, o in enumerate(given)}
            data["optimizers"], given = named, None
        if named is not None:
            if given is not None and not (isinstance(given, OptimizerSet) and given.optimizers == named):
                raise ValueError("expected either optimizer= (one) or optimizers= (several, by name), found both; "
                                 "pass every optimizer in optimizers={name: optimizer}")
            if not isinstance(named, dict):
                raise ValueError(f"expected optimizers to be a dict of name -> optimizer, found "
                                 f"{type(named).__name__}")
            data["optimizer"] = OptimizerSet(named)
        elif given is None:
            if data.get("train_step") is None or not isinstance(data.get("model"), torch.nn.Module):
                raise ValueError("expected an optimizer (optimizer=, or optimizers={name: ...}), found none. "
                                 "A loop that updates the weights itself: pass its train_step, and manual_lr")
            data["optimizer"] = ManualUpdate(data["model"].parameters(), data.get("manual_lr"))
        elif data.get("manual_lr") is not None:
            raise ValueError("expected manual_lr only for a loop with no optimizer object, found an optimizer too; "
                             "its param groups hold the LR: leave manual_lr out")
        return data

    @model_validator(mode="after")
    def _epochs_have_a_length(self) -> "Setup":
        if self.scheduler_interval == "epoch" and self.steps_per_epoch is None:
            raise ValueError('expected steps_per_epoch with scheduler_interval="epoch", found none; pass the '
                             "number of optimizer steps in one epoch of the run (len(train_loader))")
        return self

    @property
    def steps_per_scheduler_step(self) -> int:
        """Optimizer steps between two scheduler steps: 1, or an epoch's where the run steps it once an epoch."""
        return self.steps_per_epoch if self.scheduler_interval == "epoch" and self.steps_per_epoch else 1

    @property
    def manual_update(self) -> bool:
        """The run's loop updates the weights itself: train_step is handed the LR, not an optimizer."""
        return isinstance(self.optimizer, ManualUpdate)

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
