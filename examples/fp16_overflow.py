"""fp16_overflow: a BatchNorm CNN fed raw 16-bit scanner intensities (0..65535), trained under fp16 autocast:
the first conv's fp16 inputs and outputs pass fp16's ceiling of 65504, so the loss is NaN from the first
step (BatchNorm makes the raw scale harmless in fp32). Fix: bf16 autocast (fp32's range), or fp32."""

from __future__ import annotations

import torch

import triage
from _zoo import DigitsCNN, cross_entropy, digits_raw_image_batches, write_run_checkpoint

ROOT_CAUSE = "fp16_overflow"
RAW_MAX = 65535.0  # uint16 full scale


def _setup(precision: str) -> triage.Setup:
    model = DigitsCNN()
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                        loss_fn=cross_entropy, batches=digits_raw_image_batches(RAW_MAX), precision=precision)


def setup() -> triage.Setup:
    return _setup("fp16")


def fixed_setup() -> triage.Setup:
    return _setup("bf16")


def write_checkpoint(path):
    # NaN from the first step: the checkpoint is the one written at step 0, just before.
    return write_run_checkpoint(setup, path, steps=0)
