"""`TriageCallback` for `transformers.Trainer`: the flight recorder as a TrainerCallback.

    from triage.integrations.transformers import TriageCallback
    trainer = Trainer(..., callbacks=[TriageCallback(dir="captures", entry="mymod:make_trainer")])

Per optimizer step it reads the loss the model returned (a forward hook: the Trainer's own log averages
over `logging_steps` and, with `logging_nan_inf_filter`, hides a NaN) and the gradient norm before the
optimizer step; it also watches `on_log` for a non-finite `loss` or `grad_norm`. It keeps a CPU copy of
the last good state every `snapshot_every` steps and the batches as the model received them. A capture
holds a Trainer `checkpoint-N/` folder (model.safetensors without tied duplicates, optimizer.pt,
scheduler.pt, trainer_state.json, config.json). With `triage_on_capture=True` (and `entry=`) the capture is
triaged in a detached low-priority process (triage/flight/autotriage.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Union

import torch

from triage.flight.autotriage import OnCapture, auto_triage
from triage.flight.recorder import FlightRecorder, RecorderSettings, scalars, total_grad_norm
from triage.flight.triggers import Trigger
from triage.integrations import require
from triage.ties import alias_groups

_tf = require("transformers", "transformers")
_TRAINER_KWARGS = ("num_items_in_batch",)


def hf_checkpoint_writer(model: torch.nn.Module):
    """Writes the state the callback kept as a Trainer checkpoint folder."""

    def write(folder: Path, state: Any, step: int) -> tuple[str, str]:
        from safetensors.torch import save_file

        out = folder / f"checkpoint-{step}"
        out.mkdir()
        weights = dict(state["model"])
        for group in alias_groups(weights):  # one tensor under two names: keep the first, as the Trainer does
            for name in group[1:]:
                del weights[name]
        save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
        torch.save(state["optimizer"], out / "optimizer.pt")
        if state.get("scheduler") is not None:
            torch.save(state["scheduler"], out / "scheduler.pt")
        (out / "trainer_state.json").write_text(json.dumps(state["trainer_state"], indent=1, default=str))
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_json_file"):
            config.to_json_file(str(out / "config.json"))
        return out.name, "huggingface"

    return write


class TriageCallback(_tf.TrainerCallback):
    """Captures a failing Trainer run for triage (see the module docstring)."""

    def __init__(self, dir: Union[str, Path] = "triage-captures", *, entry: Optional[str] = None,
                 settings: Optional[RecorderSettings] = None, stop_on_capture: bool = False,
                 triage_on_capture: OnCapture = None):
        self.dir = Path(dir)
        self.triage_on_capture = triage_on_capture
        auto_triage(triage_on_capture, entry)  # a missing entry fails here, before training
        self.entry = entry
        self.settings = settings or RecorderSettings()
        self.stop_on_capture = stop_on_capture
        self.flight: Optional[FlightRecorder] = None
        self._hooks: list[Any] = []
        self._losses: list[torch.Tensor] = []
        self._batches: list[Any] = []
        self._grad_norm: Any = None

    @property
    def captures(self) -> list[Path]:
        return list(self.flight.captures) if self.flight else []

    # --- the Trainer's events ---

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        self.model, self.optimizer, self.scheduler = model, optimizer, lr_scheduler
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._hooks = [model.register_forward_pre_hook(self._see_inputs, with_kwargs=True),
                       model.register_forward_hook(self._see_output)]
        self.flight = FlightRecorder(self.settings, self.dir, "transformers", hf_checkpoint_writer(model),
                                     lambda: self._run_info(args, state), self.entry, self.triage_on_capture)
        self.flight.step = state.global_step
        self.flight.remember(state.global_step, self._state(state))

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if (state.global_step + 1) % self.settings.grad_norm_every == 0:
            self._grad_norm = total_grad_norm(self._params)

    def on_step_end(self, args, state, control, **kwargs):
        if self.flight is None:
            return
        step = state.global_step
        losses, batches, norm = self._losses, self._batches, self._grad_norm
        self._losses, self._batches, self._grad_norm = [], [], None
        loss = torch.stack([l.float() for l in losses]).mean() if losses else None
        value, norm = scalars(loss, norm) if loss is not None else (None, scalars(0.0, norm)[1])
        lr = self.optimizer.param_groups[0].get("lr") if self.optimizer is not None else None
        for batch in batches[:-1]:  # gradient accumulation: every micro-batch of the step
            self.flight.batches.add(step, batch)
        trigger = self.flight.record(step, value, norm, float(lr) if lr is not None else None,
                                     batches[-1] if batches else None)
        if trigger is not None:
            self._capture(control, trigger)
        elif self.flight.due(step) and value is not None and math.isfinite(value):
            self.flight.remember(step, self._state(state))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.flight is None or not logs or self.flight.captures:
            return
        for key, kind in (("loss", "nonfinite_loss"), ("grad_norm", "nonfinite_grad")):
            value = logs.get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                self._capture(control, Trigger(kind=kind, step=state.global_step,
                                               detail=f"the Trainer logged {key}={value}"))
                return

    def on_train_end(self, args, state, control, **kwargs):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # --- helpers ---

    def _see_inputs(self, module, args, kwargs):
        if module.training and torch.is_grad_enabled():
            # The collator's batch; num_items_in_batch is the Trainer's loss normaliser for this step, not data.
            self._batches.append({k: v for k, v in kwargs.items() if k not in _TRAINER_KWARGS} if kwargs else args)

    def _see_output(self, module, args, output):
        if not (module.training and torch.is_grad_enabled()):
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._losses.append(loss.detach())

    def _capture(self, control, trigger: Trigger) -> Optional[Path]:
        folder = self.flight.capture(trigger)
        if folder is not None and self.stop_on_capture:
            control.should_training_stop = True
        return folder

    def _state(self, state) -> dict[str, Any]:
        return {"model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else {},
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "trainer_state": {"global_step": state.global_step, "max_steps": state.max_steps,
                                  "log_history": list(state.log_history)}}

    def _run_info(self, args, state) -> dict[str, Any]:
        precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        clip = float(args.max_grad_norm) if args.max_grad_norm and args.max_grad_norm > 0 else None
        settings = {name: getattr(args, name, None) for name in (
            "learning_rate", "lr_scheduler_type", "warmup_steps", "max_steps", "num_train_epochs", "fp16", "bf16",
            "max_grad_norm", "gradient_accumulation_steps", "per_device_train_batch_size", "logging_nan_inf_filter")}
        settings["lr_scheduler_type"] = str(settings["lr_scheduler_type"])
        return {"precision": precision, "grad_clip": clip, "total_steps": state.max_steps or None,
                "device": str(args.device), "run_settings": settings}
