"""Figures and changes in the words a person reads: 4 significant digits, `lr×0.1`, `clip at 1.0`."""

from __future__ import annotations

import math
from typing import Any


def format_figure(value: Any) -> str:
    """One figure as a person reads it: 4 significant digits, true/false, — for not measured."""
    if value is None:
        return "—"
    if value in ("NaN", "Infinity", "-Infinity"):  # how report.json carries non-finite numbers
        return {"NaN": "NaN", "Infinity": "inf", "-Infinity": "-inf"}[value]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.4g}"
    if isinstance(value, list):
        if len(value) > 8:
            return f"[{len(value)} items]"
        return "[" + ", ".join(format_figure(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_figure(v)}" for k, v in list(value.items())[:6]) + \
            (", …" if len(value) > 6 else "") + "}"
    return str(value)


def _batches(indices: Any) -> str:
    return ("batch " if len(indices) == 1 else "batches ") + ", ".join(map(str, indices))


_CHANGES = {
    "lr_scale": lambda v: f"lr×{format_figure(v)}",
    "wd_scale": lambda v: f"weight decay×{format_figure(v)}",
    "clip": lambda v: f"clip at {format_figure(v)}" if v is not None else "clip as the run",
    "clip_scale": lambda v: f"clip×{format_figure(v)}",
    "no_clip": lambda v: "no clipping" if v else "clipping as the run",
    "clip_at_norm_of": lambda v: f"clip at the typical gradient norm '{v}' measured" if v else "clip as the run",
    "lr_scale_from": lambda v: f"lr×the ratio '{v}' suggested" if v else "lr as the run",
    "hold_peak_of": lambda v: f"lr held at the schedule's peak ('{v}')" if v else "lr schedule as the run",
    "unfreeze": lambda v: "every parameter trained" if v else "frozen parameters as the run",
    "unsquash": lambda v: "squashing output undone" if v else "output as the run",
    "revive_dead": lambda v: "dead units re-initialised" if v else "dead units left",
    "swap_saturating": lambda v: "sigmoid/tanh replaced by ReLU" if v else "activations as the run",
    "init_scale": lambda v: f"init scale {format_figure(v)}",
    "direction": lambda v: f"learning rates searched {'upward' if v == 'up' else 'downward'}",
    "precision": lambda v: f"{v} autocast" if v else "precision as the run",
    "steps": lambda v: f"{v} steps",
    "subset": lambda v: f"first {v} examples only" if v else "all examples",
    "skip_batches": lambda v: f"skipping {_batches(v)}" if v else "no batch skipped",
    "skip_outliers_of": lambda v: f"skipping the outlier batches '{v}' found" if v else "no batch skipped",
    "realign_labels_of": lambda v: f"labels moved back to the next token ('{v}' measured them further ahead)"
    if v else "labels as the run",
    "loop": lambda v: {"user": "the run's own train_step", "reference": "triage's reference loop"}.get(
        v, "the run's own train_step where it has one"),
    "lr_of": lambda v: f"the LR of optimizer '{v}' only" if v else "every optimizer's LR",
    "init": lambda v: {"setup": "fresh init from setup()", "default": "PyTorch default init",
                       "checkpoint": "weights from the checkpoint"}.get(v, f"init={v}"),
    "val_every": lambda v: f"val loss every {v} steps" if v else "no val loss",
}


def describe_change(key: str, value: Any) -> str:
    """A changed replay parameter in the words of the checklist: lr×0.1, clip at 1.0, …"""
    try:
        return _CHANGES[key](value) if key in _CHANGES else f"{key}={format_figure(value)}"
    except (TypeError, ValueError):
        return f"{key}={format_figure(value)}"
