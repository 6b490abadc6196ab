"""The stable root-cause ids of DESIGN §4 and their human titles.

`report.json` carries the id; playbooks may add ids of their own (with a title).
"""

from __future__ import annotations

ROOT_CAUSES: dict[str, str] = {
    "nonfinite_data": "Non-finite values in the data",
    "lr_too_high": "Learning rate too high",
    "exploding_gradients": "Exploding gradients",
    "fp16_overflow": "fp16 overflow under autocast",
    "numerical_instability": "Numerical instability in an operation",
    "bad_initialization": "Bad initialization",
    "bad_batch": "A bad batch in the data",
    "lr_too_low": "Learning rate too low",
    "no_gradient_flow": "No gradient reaches trainable parameters",
    "frozen_parameters": "Parameters frozen or missing from the optimizer",
    "dead_relu": "Dead ReLU units",
    "vanishing_gradients": "Vanishing gradients",
    "lr_schedule_decayed": "Learning-rate schedule decayed to ~0",
    "label_bug": "Labels are broken",
    "wrong_loss": "Wrong loss function for the outputs",
    "loop_bug": "Bug in the training loop",
    "weight_decay_too_high": "Weight decay too high",
    "clipping_too_aggressive": "Gradient clipping too aggressive",
    "overfitting": "Overfitting",
    "train_val_overlap": "Train and validation sets overlap",
    "replicas_out_of_sync": "Replicas out of sync across ranks",
    "identical_rank_data": "Every rank trains on the same data",
    "epoch_order_repeated": "Every epoch repeats the same order",
    "healthy": "No fault reproduced",
    "unexplained": "Symptom reproduced, no tested cause explains it",
    "nonfinite_checkpoint": "The checkpoint already holds NaN or Inf",
}
