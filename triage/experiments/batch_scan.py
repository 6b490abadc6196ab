"""Per-batch scan: the loss and gradient norm of every snapshot batch at the checkpoint's weights, and the
batches that stand out from the rest by a robust z-score."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from pydantic import Field

from triage.batches import named_tensors, sample_ids
from triage.experiments.base import Context, Experiment, Params
from triage.experiments.training import forward_backward, grad_scaler, probe_scaler, trainable
from triage.views import Bars, Table
from triage.outcomes.batch_scan import BatchScanOutcome
from triage.judge.readings import OUTLIER_MAD_FLOOR, OUTLIER_Z

# MAD -> standard deviation for normal data; the z-scores below read like ordinary ones.
MAD_TO_STD = 1.4826


class BatchScanParams(Params):
    # 6, not the textbook 3: per-batch losses are skewed and heavy-tailed (a batch of hard examples,
    # a rare class), and with up to 256 batches a 3-sigma cut flags several healthy ones. A corrupted
    # batch (inputs scaled by orders of magnitude, wrong labels) sits at z of tens or more.
    z_threshold: float = Field(default=OUTLIER_Z, gt=0, description="Robust z above which a batch is an outlier.")
    # In natural-log units: a spread of batch losses below ~10% counts as 10%, so a set of nearly
    # identical batches flags only a batch whose loss or gradient is several times theirs.
    mad_floor: float = Field(default=OUTLIER_MAD_FLOOR, gt=0, description="Smallest MAD of log loss / log grad norm.")


def measure(ctx: Context, p: BatchScanParams) -> BatchScanOutcome:
    session = ctx.session
    setup, device = session.setup, session.device
    params = trainable(setup.model)
    scaler = grad_scaler(setup, setup.precision, device)  # fp16 gradients would underflow unscaled
    losses, norms = [], []
    for index, batch in enumerate(session.batches):
        if ctx.out_of_time():
            break
        loss, norm = forward_backward(setup, batch, setup.precision, None, probe_scaler(scaler, device), device, params)
        losses.append(loss)
        norms.append(norm)
        ctx.progress(index + 1, len(session.batches))
    ctx.restart()  # drop the gradients and any BatchNorm statistics the forwards moved
    z_loss, z_grad = _robust_z(losses, p.mad_floor), _robust_z(norms, p.mad_floor)
    z = [max(a, b) for a, b in zip(z_loss, z_grad)]
    # A batch on which the model itself produces NaN/Inf from finite data (data_check ran before) is
    # not an outlier of the data but a numerical fault: reported apart, for the locator to explain.
    nonfinite = [i for i, (a, b) in enumerate(zip(losses, norms)) if not (math.isfinite(a) and math.isfinite(b))]
    outliers = [i for i, value in enumerate(z) if value > p.z_threshold and i not in nonfinite]
    candidates = outliers or list(range(len(z)))
    worst = max(candidates, key=lambda i: z[i]) if z else None
    # One rank's batches: across ranks the worst batch index is reduced apart from these figures, so a
    # distributed run names no tensor rather than one from another rank's batch.
    suspect = _suspect_tensor(session.batches[:len(losses)], worst, p) if outliers and ctx.ranks.world_size == 1 \
        else {}
    return BatchScanOutcome(
        losses=losses, grad_norms=norms, z_loss=z_loss, z_grad=z_grad, outliers=outliers,
        outlier_count=len(outliers), nonfinite_batches=nonfinite, nonfinite_count=len(nonfinite),
        first_nonfinite_batch=nonfinite[0] if nonfinite else None,
        worst_batch=worst, worst_z=z[worst] if worst is not None else 0.0, batches_scanned=len(losses),
        **suspect,
    )


def _suspect_tensor(batches: list, worst: int, p: BatchScanParams) -> dict:
    """The tensor of batch `worst` whose largest |value| stands out most from the same tensor's in the
    other batches (robust z of its log), with that value and where it is; {} where none stands out.
    Scale is what a corrupted batch usually changes (wrong units, a missed normalisation, a bad label id);
    a batch that is wrong in another way (shuffled labels) names no tensor."""
    peaks: dict[str, list[float]] = {}
    for batch in batches:
        for key, tensor in named_tensors(batch):
            if tensor.numel() and not tensor.is_complex() and tensor.dtype != torch.bool:
                finite = tensor[torch.isfinite(tensor)] if tensor.is_floating_point() else tensor
                peaks.setdefault(key, []).append(float(finite.abs().max()) if finite.numel() else math.nan)
    best: Optional[tuple[float, str]] = None
    for key, values in peaks.items():
        if len(values) != len(batches) or not math.isfinite(values[worst]):
            continue  # a tensor some batches lack, or one that holds no finite value here
        z = _robust_z([v if v > 0 else math.nan for v in values], p.mad_floor)[worst] if values[worst] > 0 else 0.0
        if math.isfinite(z) and z > p.z_threshold and (best is None or z > best[0]):
            best = (z, key)
    if best is None:
        return {}
    z, key = best
    tensor = dict(named_tensors(batches[worst]))[key]
    magnitude = torch.where(torch.isfinite(tensor), tensor, torch.zeros_like(tensor)).abs() \
        if tensor.is_floating_point() else tensor.abs()
    flat = int(magnitude.reshape(-1).argmax())
    where = [int(i) for i in torch.unravel_index(torch.tensor(flat), tensor.shape)] if tensor.dim() else []
    ids = sample_ids(batches[worst])
    return {"worst_tensor": key, "worst_tensor_z": z, "worst_value": float(tensor[tuple(where)].item()),
            "worst_value_index": where, "typical_value": float(np.median([v for v in peaks[key] if math.isfinite(v)])),
            "worst_sample_id": ids[where[0]] if ids and where and where[0] < len(ids) else None}


def _robust_z(values: list[float], mad_floor: float) -> list[float]:
    """(log x - median) / (1.4826 * MAD) over the finite values; a non-finite value scores +inf.

    In log space a batch twice as bad counts the same at any scale. Values that are not all
    positive (a loss that can go negative) are scored as they are.
    """
    finite = np.array([v for v in values if math.isfinite(v)], dtype=float)
    if finite.size == 0:
        return [math.inf] * len(values)
    use_log = bool((finite > 0).all())
    xs = np.log(finite) if use_log else finite
    median = float(np.median(xs))
    mad = max(float(np.median(np.abs(xs - median))), mad_floor)
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append(math.inf)
        else:
            x = math.log(v) if use_log else v
            out.append((x - median) / (MAD_TO_STD * mad))
    return out


BATCH_SCAN = Experiment(
    name="batch_scan",
    summary="Measures the loss and gradient norm of every snapshot batch at the checkpoint's weights and "
            "flags the batches that stand out by robust z-score.",
    params=BatchScanParams,
    outcome=BatchScanOutcome,
    measure=measure,
    views=tuple(
        Bars(title=f"{name} of each snapshot batch", field=field, highlight="outliers", index_label="snapshot batch",
             axis_label=name.lower(), caption="Red: an outlier (robust z-score above the threshold). "
                                              "×: non-finite at the checkpoint's weights.")
        for name, field in (("Loss", "losses"), ("Gradient norm", "grad_norms"))
    ) + (Table(title="Each batch", fields=("losses", "grad_norms", "z_loss", "z_grad"), limit=16),),
)
