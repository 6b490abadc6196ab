"""The stock-PyTorch validity check: a generated case counts only if

1. its symptom reproduces: the faulty run, continued from its checkpoint for STEPS steps with the stock
   loop (`suite.loop`), shows the symptom class its cause has (healthy runs: none);
2. its named fix removes it (applied as the fault's `fix_from` says: faults.py);
3. the competing fixes do not: every knob fix of the other causes of the same symptom class, applied
   from the checkpoint (default init: from scratch), leaves the symptom in place.

Nothing here calls triage's experiments or replay; triage is used only to save the checkpoint.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from pydantic import BaseModel, ConfigDict

import triage
from suite.config import RunConfig
from suite.families import build_setup, constant_level
from suite.loop import Knobs, Trace, batch_losses, load_checkpoint, train, val_loss
from suite.symptoms import (DIVERGENCE, HIGH_START, MEANINGFUL, NO_LEARNING, NONE, OVERFITTING, VAL_LEAK, Reading,
                             fixed_by, read)

STEPS = 40            # what triage replays
VAL_EVERY = 5         # validation during a continuation, for runs that have validation data
OUTLIER_Z = 6.0       # a batch whose loss is this many robust deviations above the median is outlying
LEAK_RATIO = 0.85     # validation this much better than held-out data is "suspiciously good"

# A competing fix that also removes the symptom but only masks this cause, where the cause leaves a
# measurable abnormality that triage checks first (so the case stays unambiguous): clipping or a lower LR
# bound the huge steps of an outlying batch (the outlier scan names the batch, DESIGN §4); a lower LR
# keeps an fp16 run (fp16 is a setting) or a blown-up init (its loss at setup()'s init) in range; a
# higher LR makes up for a clip that bounds every step (the fraction of steps clipped) or for a
# schedule decayed below 1% of its peak (the schedule's own LR).
MASKS = {("bad_batch", "exploding_gradients"), ("bad_batch", "lr_too_high"), ("fp16_overflow", "lr_too_high"),
         ("bad_initialization", "lr_too_high"), ("clipping_too_aggressive", "lr_too_low"),
         ("lr_schedule_decayed", "lr_too_low")}


class Figures(BaseModel):
    """What one run measured (windows are medians of the first/last fifth of its losses)."""

    model_config = ConfigDict(frozen=True)

    label: str
    start: Optional[float] = None
    end: Optional[float] = None
    peak: Optional[float] = None
    steps: int = 0
    nonfinite: bool = False
    val_last: Optional[float] = None
    val_best: Optional[float] = None
    symptoms: tuple[str, ...] = ()
    removes: Optional[bool] = None   # for a fix or a competitor: whether it removes the symptom


class Validity(BaseModel):
    """The verdict of the stock check on one case, with the figures it measured."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    reason: str
    symptom: str = NONE
    constant: Optional[float] = None
    faulty: Optional[Figures] = None
    fix: Optional[Figures] = None
    competitors: tuple[Figures, ...] = ()
    extra: dict[str, float] = {}
    seconds: float = 0.0


def validate(case, checkpoint: Optional[Path] = None) -> Validity:
    """Run the check on `case` (a `suite.cases.Case`). Writes the case's checkpoint to `checkpoint` (or a
    temporary file) and reads it back like any resumed run. A generator that raises is a failed check."""
    started = time.perf_counter()
    try:
        if checkpoint is None:
            with tempfile.TemporaryDirectory(prefix="suite-check-") as tmp:
                verdict = _validate(case, Path(tmp) / "checkpoint.pt")
        else:
            verdict = _validate(case, Path(checkpoint))
    except Exception as exc:  # a broken generator is an excluded case with its reason, never a crash
        verdict = Validity(ok=False, reason=f"generation failed: {type(exc).__name__}: {exc}")
    return verdict.model_copy(update={"seconds": round(time.perf_counter() - started, 3)})


def _validate(case, path: Path) -> Validity:
    fault = case.fault
    constant = constant_level(fault.faulty)
    case.write_checkpoint(path)
    if not _finite_checkpoint(path):
        return Validity(ok=False, reason="the checkpoint itself is non-finite (the fault struck before it)",
                        constant=constant)
    faulty = _continue(fault.faulty, path)
    reading = read(faulty, constant)
    figures = _figures("as run", faulty, reading)
    seen = reading.symptoms()
    if fault.cause == "healthy":
        ok = not seen and reading.end is not None and reading.end < 0.9 * constant
        shows = ", ".join(seen) or "a loss at the constant level"
        reason = "healthy: no symptom" if ok else f"a healthy run shows {shows}"
        return Validity(ok=ok, reason=reason, constant=constant, faulty=figures)
    if VAL_LEAK in fault.symptoms:
        return _check_leak(case, path, constant, figures, reading)
    symptom = next((s for s in fault.symptoms if s in seen), None)
    if symptom is None:
        return Validity(ok=False, reason=f"symptom did not reproduce: expected {'/'.join(fault.symptoms)}, "
                        f"saw {', '.join(seen) or 'none'} ({_describe(reading)})", constant=constant, faulty=figures)
    on_val = symptom == OVERFITTING
    fix_trace = _named_fix(case, path)
    fix = _figures("named fix", fix_trace, read(fix_trace, constant), reading, constant, on_val)
    if not fix.removes:
        return Validity(ok=False, reason=f"the named fix does not remove the symptom ({_short(fix)})",
                        symptom=symptom, constant=constant, faulty=figures, fix=fix)
    competitors = []
    for cause, label, run in _competitors(case, path):
        trace = run()
        if trace is None:
            continue
        competitors.append(_figures(label, trace, read(trace, constant), reading, constant, on_val))
        if competitors[-1].removes and (fault.cause, cause) not in MASKS:
            return Validity(ok=False, reason=f"a competing fix ({label}, for {cause}) also removes it "
                            f"({_short(competitors[-1])})", symptom=symptom, constant=constant, faulty=figures,
                            fix=fix, competitors=tuple(competitors))
    return Validity(ok=True, reason=f"{symptom} reproduces; the named fix removes it; "
                    f"{len(competitors)} competing fix(es) do not", symptom=symptom, constant=constant,
                    faulty=figures, fix=fix, competitors=tuple(competitors))


# --- runs -------------------------------------------------------------------------------------------

def _continue(cfg: RunConfig, path: Path, knobs: Knobs = Knobs()) -> Trace:
    """The run resumed from the checkpoint (the fixed run's setup may differ in code or data; its
    optimizer state is loaded when it fits, as a user resuming would)."""
    setup = build_setup(cfg)
    try:
        load_checkpoint(setup, path)
    except (ValueError, KeyError):  # e.g. the fixed optimizer holds more parameters than the faulty one
        setup = load_checkpoint(build_setup(cfg), path, optimizer_too=False)
    torch.manual_seed(cfg.seed + 1)
    return train(setup, STEPS, knobs, val_every=VAL_EVERY if cfg.data.val_batches else 0)


def _from_scratch(cfg: RunConfig, path: Path, default_init: bool = False) -> Trace:
    """The run trained from its own init for as many steps as the faulty checkpoint had, then STEPS
    more (those are read)."""
    steps = checkpoint_step(path)
    setup = build_setup(cfg, default_init=default_init)
    torch.manual_seed(cfg.seed + 1)
    before = train(setup, steps)
    if not before.finite:
        return before
    return train(setup, STEPS, val_every=VAL_EVERY if cfg.data.val_batches else 0, first_batch=steps)


def checkpoint_step(path: Path) -> int:
    return int(torch.load(path, weights_only=True).get("step") or 0)


def _named_fix(case, path: Path) -> Trace:
    fault = case.fault
    if fault.fix_from == "knobs":
        return _continue(fault.faulty, path, fault.fix_knobs)
    if fault.fix_from == "checkpoint":
        return _continue(fault.fixed, path)
    return _from_scratch(fault.fixed, path)


def _competitors(case, path: Path) -> list[tuple[str, str, Callable[[], Optional[Trace]]]]:
    """(cause, label, run) for each knob fix of the other causes of the fault's symptom classes; run()
    gives None where the knob would change nothing in this run (no fp16, no outlying batch, no clipping).
    The learning rate is tried over the range triage searches (x0.1 to x1e-4 down, x10 to x1000 up): a
    fault some learning rate also removes (a loss scaled uniformly is an LR in other units under SGD)
    cannot be told from an LR fault, so it is ambiguous, not a test."""
    cfg = case.fault.faulty
    knobs = []
    if DIVERGENCE in case.fault.symptoms or HIGH_START in case.fault.symptoms:
        knobs += [_lr(cfg, path, "lr_too_high", f) for f in (0.1, 0.01, 1e-3, 1e-4)]
        knobs += [
            ("exploding_gradients", "clip 1.0", lambda: _continue(cfg, path, Knobs(clip=1.0))),
            ("fp16_overflow", "bf16", lambda: _continue(cfg, path, Knobs(precision="bf16"))
             if cfg.precision == "fp16" else None),
            ("bad_batch", "skip outlying batches", lambda: _skip_outliers(cfg, path)),
            ("bad_initialization", "default init", lambda: _from_scratch(cfg, path, default_init=True)),
        ]
    if NO_LEARNING in case.fault.symptoms:
        knobs += [_lr(cfg, path, "lr_too_low", f) for f in (10.0, 100.0, 1000.0)]
        knobs += [
            ("weight_decay_too_high", "no weight decay", lambda: _continue(cfg, path, Knobs(no_weight_decay=True))
             if cfg.weight_decay > 0.01 else None),
            ("clipping_too_aggressive", "no clipping", lambda: _continue(cfg, path, Knobs(clip=None))
             if cfg.grad_clip is not None else None),
            ("lr_schedule_decayed", "LR held at its peak", lambda: _continue(cfg, path, Knobs(hold_peak_lr=cfg.lr))
             if cfg.schedule is not None else None),
        ]
    # overfitting and val_leak: no other cause of these classes has a knob fix
    return [k for k in knobs if k[0] != case.fault.cause]


def _lr(cfg: RunConfig, path: Path, cause: str, factor: float):
    return cause, f"lr x{factor:g}", lambda: _continue(cfg, path, Knobs(lr_scale=factor))


def _skip_outliers(cfg: RunConfig, path: Path) -> Optional[Trace]:
    """Skip the batches whose loss at the checkpoint is a finite outlier (robust z-score)."""
    flagged = outlying_batches(load_checkpoint(build_setup(cfg), path))
    return _continue(cfg, path, Knobs(skip=tuple(flagged))) if flagged else None


def outlying_batches(setup: triage.Setup) -> list[int]:
    losses = batch_losses(setup)
    finite = [x for x in losses if math.isfinite(x)]
    if len(finite) < 3:
        return []
    median = statistics.median(finite)
    spread = max(1.4826 * statistics.median(abs(x - median) for x in finite), 0.05 * abs(median), 1e-8)
    return [i for i, x in enumerate(losses) if math.isfinite(x) and (x - median) / spread > OUTLIER_Z]


def _check_leak(case, path: Path, constant: float, figures: Figures, reading: Reading) -> Validity:
    """train_val_overlap: validation rows duplicated from training, and validation loss clearly below
    the same model's loss on held-out rows (the fixed run's validation set); deduplicated, it is not."""
    fault = case.fault
    leaky_setup = load_checkpoint(build_setup(fault.faulty), path)
    clean_setup = load_checkpoint(build_setup(fault.fixed), path)
    duplicated = duplicate_fraction(leaky_setup)
    leaky, clean = val_loss(leaky_setup), val_loss(clean_setup)
    extra = {"duplicated": duplicated, "val_leaky": leaky, "val_held_out": clean,
             "duplicated_after_fix": duplicate_fraction(clean_setup)}
    if reading.diverged:
        reason, ok = "the run itself diverges", False
    elif duplicated < 0.1 or leaky > LEAK_RATIO * clean or clean - leaky < MEANINGFUL * constant:
        reason, ok = (f"validation is not suspiciously good (duplicated {duplicated:.0%}, val {leaky:.3f} vs "
                      f"held-out {clean:.3f})"), False
    elif extra["duplicated_after_fix"] > 0:
        reason, ok = "deduplicated validation still holds training rows", False
    else:
        reason, ok = (f"val_leak: {duplicated:.0%} of validation rows are training rows, val {leaky:.3f} vs "
                      f"held-out {clean:.3f}; deduplicated, none"), True
    return Validity(ok=ok, reason=reason, symptom=VAL_LEAK if ok else NONE, constant=constant,
                    faulty=figures, extra=extra)


def duplicate_fraction(setup: triage.Setup) -> float:
    """Share of validation examples whose inputs equal some training example's inputs exactly."""
    train = {tuple(row.flatten().tolist()) for b in setup.batches for row in b[0]}
    rows = [tuple(row.flatten().tolist()) for b in setup.val_batches for row in b[0]]
    return sum(r in train for r in rows) / max(1, len(rows))


def _finite_checkpoint(path: Path) -> bool:
    state = torch.load(path, weights_only=True)
    return all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())


# --- figures ----------------------------------------------------------------------------------------

def _figures(label: str, trace: Trace, reading: Reading, faulty: Optional[Reading] = None,
             constant: Optional[float] = None, on_validation: bool = False) -> Figures:
    removes = None if faulty is None else fixed_by(reading, faulty, constant, on_validation)
    return Figures(label=label, start=_round(reading.start), end=_round(reading.end), peak=_round(reading.peak),
                   steps=len(trace.losses), nonfinite=reading.nonfinite, val_last=_round(reading.val_last),
                   val_best=_round(reading.val_best), symptoms=reading.symptoms(), removes=removes)


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else (round(x, 5) if math.isfinite(x) else x)


def _describe(r: Reading) -> str:
    if r.end is None:
        return "no finite loss"
    text = f"start {r.start:.3g}, end {r.end:.3g}"
    if r.val_last is not None:
        text += f", val best {r.val_best:.3g} last {r.val_last:.3g}"
    return text


def _short(f: Figures) -> str:
    if f.end is None:
        return "no finite loss"
    text = f"end {f.end:.3g}" + (" after a non-finite loss" if f.nonfinite else "")
    if f.val_last is not None:
        text += f", val {f.val_last:.3g}"
    return text + (f", shows {', '.join(f.symptoms)}" if f.symptoms else "")
