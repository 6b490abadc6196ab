"""A triage.Setup derived from a `transformers.Trainer` (what `--entry mymod:make_trainer` returns).

What comes from where:
- model: `trainer.model`;
- optimizer and scheduler: `trainer.create_optimizer_and_scheduler(total_steps)` (the ones passed as
  `optimizers=(...)` when the Trainer was given them);
- loss: `trainer.compute_loss(model, batch)` (label smoothing, `compute_loss_func`, a subclass's override);
- batches: a capture's own batches when the checkpoint is a capture, else `get_train_dataloader()`;
  validation: `get_eval_dataloader()` when the Trainer has an eval dataset;
- precision: `args.bf16` / `args.fp16`; clip: `args.max_grad_norm`; total steps: `args.max_steps`
  (else the epochs' length); device: `args.device`.
A `checkpoint-N/` folder's `trainer_state.json` gives the loss history (triage/load/checkpoint.py).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import torch

from triage.contract import Setup
from triage.flight.manifest import load_batches
from triage.load.checkpoint import Checkpoint

log = logging.getLogger(__name__)


class TrainerLoss:
    """loss_fn(model, batch) = trainer.compute_loss(model, batch), on a copy of the batch (compute_loss
    may pop 'labels' from the dict it is given)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def __call__(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        loss = self.trainer.compute_loss(model, dict(batch))
        return loss[0] if isinstance(loss, tuple) else loss


def total_steps(trainer: Any) -> Optional[int]:
    args = trainer.args
    if args.max_steps and args.max_steps > 0:
        return int(args.max_steps)
    try:
        per_epoch = math.ceil(len(trainer.get_train_dataloader()) / max(1, args.gradient_accumulation_steps))
    except TypeError:  # an IterableDataset has no length
        return None
    return int(per_epoch * math.ceil(args.num_train_epochs)) or None


def trainer_setup(trainer: Any, checkpoint: Optional[Checkpoint]) -> Setup:
    args = trainer.args
    manifest = checkpoint.manifest if checkpoint else None
    total = manifest.total_steps if manifest and manifest.total_steps else total_steps(trainer)
    trainer.create_optimizer_and_scheduler(num_training_steps=total or 1)
    from_capture = bool(manifest and manifest.batch_steps)
    batches = load_batches(checkpoint.capture_dir) if from_capture else trainer.get_train_dataloader()
    val = trainer.get_eval_dataloader() if trainer.eval_dataset is not None else None
    precision = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    clip = float(args.max_grad_norm) if args.max_grad_norm and args.max_grad_norm > 0 else None
    device = str(args.device)
    log.info("derived a Setup from %s (precision %s, clip %s, %s steps, batches from %s)", type(trainer).__name__,
             precision, clip, total, "the capture" if from_capture else "get_train_dataloader()")
    return Setup(model=trainer.model, optimizer=trainer.optimizer, scheduler=trainer.lr_scheduler,
                 loss_fn=TrainerLoss(trainer), batches=batches, val_batches=val, precision=precision,
                 grad_clip=clip, total_steps=total, device="cpu" if device == "cpu" else device)
