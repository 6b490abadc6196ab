"""The held-out axes and kinds of run asked for by issues 20 (item 9) and 21 (item 7), measured blind.

Every case here is in the `blind` split: nobody tunes triage on it. A case is a `CaseSpec` whose
`variant` names the axis value ("sched_onecycle", "probe_rg", ...) on an existing family, or a spec of
one of the new families (families.BLIND_FAMILIES) with no variant (axis "heads", "self_loss", "peft").

The axes, their families and causes are tabled in benchmarks/suite/README.md ("The blind split").
"""

from __future__ import annotations

from dataclasses import replace

from suite.config import RunConfig, Schedule
from suite.faults import HEALTHY, INJECTIONS, Fault, _data, _model, baseline, healthy
from suite.loop import Knobs
from suite.symptoms import DIVERGENCE, NO_LEARNING

SCHEDULE_TOTAL, SCHEDULE_WARMUP = 300, 20

SCHEDULES = {
    "sched_constant": None,
    "sched_linear_warmup": Schedule("linear_warmup", warmup=SCHEDULE_WARMUP, total=SCHEDULE_TOTAL),
    "sched_lambda_warmup": Schedule("lambda_warmup", warmup=SCHEDULE_WARMUP, total=SCHEDULE_TOTAL),
    "sched_cosine": Schedule("cosine", total=SCHEDULE_TOTAL),
    "sched_onecycle": Schedule("onecycle", warmup=SCHEDULE_WARMUP, total=SCHEDULE_TOTAL),
    "sched_plateau": Schedule("plateau", total=SCHEDULE_TOTAL),
    # added after the first six were measured (still blind: triage unchanged): issue 20's other schedulers
    "sched_hf_linear": Schedule("hf_linear_warmup", warmup=SCHEDULE_WARMUP, total=SCHEDULE_TOTAL),
    "sched_warm_restarts": Schedule("warm_restarts", total=SCHEDULE_TOTAL),
    "sched_chained": Schedule("chained", warmup=SCHEDULE_WARMUP, total=SCHEDULE_TOTAL),
}

# axis -> its variants (on existing families); new families carry their axis by name.
AXIS_VARIANTS = {
    "schedule": tuple(SCHEDULES),
    "frozen_by_design": ("probe_rg", "probe_opt"),
    "raw_fp16": ("raw_fp16", "raw_bf16", "std_fp16"),
    "loops": ("loop_manual", "loop_two_opt", "loop_lbfgs", "loop_accum", "loop_accum_fp16", "loop_epoch_sched"),
}
FAMILY_AXIS = {"multilabel": "heads", "huber_regressor": "heads", "smoothed_classifier": "heads",
               "self_loss_lm": "self_loss", "peft_lm": "peft"}
AXES = tuple(AXIS_VARIANTS) + ("heads", "self_loss", "peft")
VARIANT_AXIS = {v: axis for axis, variants in AXIS_VARIANTS.items() for v in variants}


def axis_of(family: str, variant: str) -> str:
    return VARIANT_AXIS[variant] if variant else FAMILY_AXIS[family]


def axis_grid() -> list[tuple[str, str, str, str, int, str]]:
    """(cause, family, optimizer, severity, seed, variant) of every blind case."""
    both = ("sgd", "adamw")
    grid = []

    def add(families, optimizers, variant, *causes):  # causes: (cause, severity) or (cause, severity, seed)
        grid.extend((c[0], f, o, c[1], c[2] if len(c) > 2 else 0, variant)
                    for f in families for o in optimizers for c in causes)

    two = ("mlp", "tabular_regressor")
    for variant in AXIS_VARIANTS["schedule"]:  # frozen severe: the optimizer holds the head bias only
        add(two, both, variant, (HEALTHY, "mild"), ("lr_too_high", "severe"), ("lr_too_low", "mild"),
            ("frozen_parameters", "mild"), ("frozen_parameters", "severe"))
    probed = ("mlp", "cnn_bn", "resnet", "tabular_regressor", "binary_classifier")
    for variant in ("probe_rg", "probe_opt"):
        add(probed, both, variant, (HEALTHY, "mild"))
    for family in two:
        for opt in both:
            add((family,), (opt,), "probe_opt", ("lr_too_low", "severe"))
            add((family,), (opt,), "probe_rg", ("lr_too_high", "severe"))
    for family in ("mlp", "tabular_regressor", "binary_classifier"):
        for opt in both:
            for variant, cause in (("raw_fp16", "fp16_overflow"), ("raw_bf16", HEALTHY), ("std_fp16", HEALTHY)):
                add((family,), (opt,), variant, (cause, "mild"))
    plain = ((HEALTHY, "mild"), (HEALTHY, "severe", 1), ("lr_too_high", "severe"), ("lr_too_low", "mild"),
             ("frozen_parameters", "mild"))
    for family in ("multilabel", "huber_regressor", "smoothed_classifier", "self_loss_lm"):
        for opt in both:
            add((family,), (opt,), "", *plain)
            if family != "self_loss_lm":
                add((family,), (opt,), "", ("bad_initialization", "severe"))
    add(("peft_lm",), both, "", (HEALTHY, "mild"), (HEALTHY, "mild", 1), ("lr_too_high", "severe"),
        ("lr_too_low", "mild"))
    for family in two:
        add((family,), ("sgd",), "loop_manual", (HEALTHY, "mild"), ("lr_too_high", "severe"), ("lr_too_low", "mild"))
        add((family,), ("lbfgs",), "loop_lbfgs", (HEALTHY, "mild"), ("lr_too_low", "mild"))
        for opt in both:
            add((family,), (opt,), "loop_two_opt", (HEALTHY, "mild"), ("lr_too_high", "severe"))
            add((family,), (opt,), "loop_accum", (HEALTHY, "mild"), ("lr_too_low", "mild"))
            add((family,), (opt,), "loop_accum_fp16", (HEALTHY, "mild"))
            add((family,), (opt,), "loop_epoch_sched", (HEALTHY, "mild"), ("lr_too_high", "severe"))
    return grid


# --- building a blind case's Fault ------------------------------------------------------------------

def build_axis_fault(cause: str, family: str, optimizer: str, severity: str, seed: int, variant: str) -> Fault:
    base = _base(family, optimizer, seed)
    if variant in SCHEDULES:
        return _scheduled(cause, base, severity, SCHEDULES[variant], variant)
    if variant in ("probe_rg", "probe_opt"):
        return _probe(cause, base, severity, variant)
    if variant in AXIS_VARIANTS["raw_fp16"]:
        return _raw_units(cause, base, variant)
    if variant in AXIS_VARIANTS["loops"]:
        return _own_loop(cause, base, severity, variant)
    return _plain(cause, base, severity)


def _base(family: str, optimizer: str, seed: int) -> RunConfig:
    if optimizer == "lbfgs":  # a full-batch-style method: lr 1 is its usual setting
        return replace(baseline(family, "sgd", seed), optimizer="lbfgs", lr=1.0)
    if family == "peft_lm":  # a fine-tune from a pretrained base learns fast at first: noticed early
        return replace(baseline(family, optimizer, seed), checkpoint_step=3)
    return baseline(family, optimizer, seed)


def _plain(cause: str, base: RunConfig, severity: str) -> Fault:
    if cause == HEALTHY:
        return healthy(base, "plain" if severity == "mild" else "small_batch")
    return INJECTIONS[cause](base, severity)


def _scheduled(cause: str, base: RunConfig, severity: str, schedule, variant: str) -> Fault:
    """The injection on a run whose LR follows `schedule` over a 300-step plan (stepped every step;
    ReduceLROnPlateau on the loss)."""
    if schedule is not None:
        base = replace(base, schedule=schedule, total_steps=SCHEDULE_TOTAL)
    fault = _plain(cause, base, severity)
    return replace(fault, story=f"{fault.story} [{variant}]")


def _probe(cause: str, base: RunConfig, severity: str, variant: str) -> Fault:
    """A linear probe: the backbone pretrained in code and frozen by design (requires_grad_(False), or
    left out of the optimizer), a fresh head trained. Healthy, or the probe's own LR wrong."""
    how = {"probe_rg": "probe_requires_grad", "probe_opt": "probe_optimizer"}[variant]
    base = _model(replace(base, freeze=how), pretrained=True)
    fault = _plain(cause, base, severity)
    return replace(fault, story=f"{fault.story} [linear probe, backbone frozen by design: {how}]")


def _raw_units(cause: str, base: RunConfig, variant: str) -> Fault:
    """Features in raw units around 1e5 (1e5 + 5e4 z), a LayerNorm after the first layer (as the model's
    owner added to cope with them): fp16 autocast overflows the first layer (fix bf16); bf16 trains;
    fp16 on standardised features trains."""
    raw = _model(_data(base, input_scale=5e4, raw_offset=1e5), input_norm=True)
    if variant == "raw_fp16":
        faulty = replace(raw, precision="fp16", checkpoint_step=0)
        return Fault("fp16_overflow", faulty, replace(faulty, precision="bf16"), (DIVERGENCE,), "knobs",
                     "raw-unit features (~1e5) under fp16 autocast; fix: bf16", Knobs(precision="bf16"))
    run = replace(raw, precision="bf16") if variant == "raw_bf16" else replace(base, precision="fp16")
    fault = healthy(run, "plain")
    return replace(fault, story=f"healthy ({variant})")


def _own_loop(cause: str, base: RunConfig, severity: str, variant: str) -> Fault:
    """A correct loop of the run's own (issue 21): the fault, where there is one, is a learning rate.
    Its fix is the LR knob where the loop's LR lives in the Setup's optimizer (it reaches the loop
    through the param groups); for the hand-written update (no optimizer object) and the head's own
    optimizer, the run with the right LR from the checkpoint (no knob reaches those)."""
    loops = {"loop_manual": dict(train_step="manual_sgd", lr=base.lr * 4),
             "loop_two_opt": dict(train_step="two_optimizers", head_lr=3e-3),
             "loop_lbfgs": dict(train_step="lbfgs_closure"),
             "loop_accum": dict(train_step="accumulate"),
             "loop_accum_fp16": dict(train_step="accumulate", precision="fp16"),
             "loop_epoch_sched": dict(schedule=Schedule("step", gamma=0.7, per_epoch=True), total_steps=240)}
    run = replace(base, **loops[variant])
    story = f"[{variant}]"
    if cause == HEALTHY:
        return replace(healthy(run, "plain"), story=f"healthy {story}")
    if variant == "loop_two_opt":  # the head's optimizer's LR has a typo: 1000x
        faulty = replace(run, head_lr=run.head_lr * 1000, checkpoint_step=0)
        return Fault(cause, faulty, run, (DIVERGENCE, NO_LEARNING), "checkpoint",
                     f"the head's optimizer at lr {faulty.head_lr:g} {story}")
    fault = INJECTIONS[cause](run, severity)
    if variant == "loop_manual":
        fault = replace(fault, fix_from="checkpoint")
    return replace(fault, story=f"{fault.story} {story}")

