"""One injection per root cause: how it changes a family's healthy run, what its fix is, what symptom it
must show and how the validity check applies the fix.

Every injection takes the family's healthy `baseline(...)` and a severity ("mild" | "severe") and returns
a `Fault`. Where a cause is unnatural in a family it is injected the way a real bug produces it there; the
`story` says which bug that is.

How the check applies the named fix (`fix_from`):
- "knobs": continue the faulty run from its checkpoint with a loop change (lr, clip, precision, skipped
  batch, LR held at its peak, the reference loop): the fix is a hyper-parameter or loop setting.
- "checkpoint": the fixed run's setup loads the faulty checkpoint and continues: the fix is code or data
  that leaves the weights compatible (a cut removed, labels repaired, the right loss).
- "scratch": the fixed run trains from its own initialisation for as many steps as the faulty run had
  before and after its checkpoint: the fix changes the init or the architecture, or the checkpoint's
  state is itself the damage (collapsed weights).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from suite.config import DataConfig, RunConfig, Schedule
from suite.families import FAMILIES
from suite.loop import Knobs
from suite.data import INPUTS, WEIGHTS
from suite.symptoms import DIVERGENCE, HIGH_START, NO_LEARNING, NONE, OVERFITTING, VAL_LEAK

CAUSES = (
    "nonfinite_data", "lr_too_high", "exploding_gradients", "fp16_overflow", "numerical_instability",
    "bad_initialization", "bad_batch", "lr_too_low", "no_gradient_flow", "frozen_parameters", "dead_relu",
    "vanishing_gradients", "lr_schedule_decayed", "label_bug", "wrong_loss", "loop_bug",
    "weight_decay_too_high", "clipping_too_aggressive", "overfitting", "train_val_overlap",
)
HEALTHY = "healthy"
SEVERITIES = ("mild", "severe")
OPTIMIZERS = ("sgd", "adamw")


@dataclass(frozen=True)
class Fault:
    """A faulty run, its fixed twin, and what the validity check must see."""

    cause: str
    faulty: RunConfig
    fixed: RunConfig
    symptoms: tuple[str, ...]   # the symptom classes this fault may show (one must reproduce)
    fix_from: str               # "knobs" | "checkpoint" | "scratch" (module docstring)
    story: str                  # the bug, in this family, in one line
    fix_knobs: Knobs = Knobs()


def baseline(family: str, optimizer: str, seed: int = 0) -> RunConfig:
    """The family's healthy run: a learning rate that trains, AdamW's default weight decay, no clipping."""
    fam = FAMILIES[family]
    return RunConfig(family=family, optimizer=optimizer, lr=fam.good_lr[optimizer], seed=seed,
                     weight_decay=0.01 if optimizer == "adamw" else 0.0,
                     data=DataConfig(batch_size=16 if fam.task == "lm" else 32),
                     checkpoint_step=25 if family == "rnn" else 10)  # the LSTM needs ~20 steps to take off


def _data(cfg: RunConfig, **changes) -> RunConfig:
    return replace(cfg, data=replace(cfg.data, **changes))


def _model(cfg: RunConfig, **changes) -> RunConfig:
    return replace(cfg, model=replace(cfg.model, **changes))


def _pick(severity: str, mild, severe):
    return mild if severity == "mild" else severe


# --- divergence -------------------------------------------------------------------------------------

def nonfinite_data(base: RunConfig, severity: str) -> Fault:
    """NaN (mild: 2 rows of one batch) or Inf (severe: 8 rows of three batches) where the pipeline wrote
    missing values; for the language model, in the per-sequence loss weights."""
    batches = _pick(severity, (3,), (1, 4, 7))
    lm = FAMILIES[base.family].task == "lm"
    faulty = _data(replace(base, checkpoint_step=batches[0]), nonfinite_batches=batches,
                   nonfinite_rows=_pick(severity, 2, 8), nonfinite_value=_pick(severity, "nan", "inf"),
                   nonfinite_part=WEIGHTS if lm else INPUTS)
    where = "loss weights" if lm else "inputs"
    return Fault("nonfinite_data", faulty, _data(faulty, impute=True), (DIVERGENCE,), "checkpoint",
                 f"missing values exported as {faulty.data.nonfinite_value} into the {where} of batches "
                 f"{list(batches)}; fix: impute them")


def lr_too_high(base: RunConfig, severity: str) -> Fault:
    """The learning rate 30x (mild) or 300x (severe) the one that trains for SGD; 100x or 1000x for AdamW,
    whose normalised steps shrug off 30x on these nets. The loss blows up, or spikes and then sits at the
    constant-predictor level (oscillation)."""
    factor = _pick(severity, 30.0, 300.0) if base.optimizer == "sgd" else _pick(severity, 100.0, 1000.0)
    faulty = replace(base, lr=base.lr * factor, checkpoint_step=0)
    return Fault("lr_too_high", faulty, replace(faulty, lr=base.lr), (DIVERGENCE, NO_LEARNING), "knobs",
                 f"lr {faulty.lr:g}, {factor:g}x the one that trains; fix: lr {base.lr:g}",
                 Knobs(lr_scale=1 / factor))


def exploding_gradients(base: RunConfig, severity: str) -> Fault:
    """The loss multiplied by a weight of 300 (mild) or 3000 (severe): a multi-task weight in the wrong
    units, as a sum over the batch instead of a mean would be. Every gradient is that much larger, so
    lr x0.1 is still far too much while clipping at 1.0 bounds each step. AdamW normalises the gradient
    scale away, so under AdamW the fault is expected not to reproduce (the check excludes it)."""
    weight = _pick(severity, 300.0, 3000.0)
    faulty = replace(base, checkpoint_step=0, loss_weight=weight)
    return Fault("exploding_gradients", faulty, replace(faulty, grad_clip=1.0), (DIVERGENCE,), "knobs",
                 f"loss weight {weight:g}; fix: clip the global grad norm at 1.0", Knobs(clip=1.0))


def fp16_overflow(base: RunConfig, severity: str) -> Fault:
    """Inputs in raw units (x1e5 mild, x1e7 severe) normalised right after the first layer (BatchNorm,
    LayerNorm), so fp32 and bf16 train, under fp16 autocast: the first layer's fp16 output passes 65504
    and the loss is NaN from the first step. The language model's variant: post-norm blocks under a
    token-embedding multiplier (x300, x3000), so the attention scores overflow."""
    scale = _pick(severity, 1e5, 1e7)
    faulty = replace(base, precision="fp16", checkpoint_step=0)
    if FAMILIES[base.family].task == "lm":
        faulty = _model(faulty, embed_scale=_pick(severity, 300.0, 3000.0), post_norm=True)
        story = f"post-norm LM with token embeddings x{faulty.model.embed_scale:g} under fp16 autocast"
    else:
        faulty = _model(_data(faulty, input_scale=scale), input_norm=True)
        story = f"inputs in raw units (x{scale:g}) normalised after the first layer, under fp16 autocast"
    return Fault("fp16_overflow", faulty, replace(faulty, precision="bf16"), (DIVERGENCE,), "knobs",
                 story + "; fix: bf16 autocast", Knobs(precision="bf16"))


def numerical_instability(base: RunConfig, severity: str) -> Fault:
    """A hand-written per-example normalisation without eps meets blank examples (a blank image, a flat
    trace, a record of defaults, a padded sequence): 0/0 = NaN at any learning rate. Fix: eps = 1e-5."""
    batches = _pick(severity, (4,), (0, 3, 6, 9))
    faulty = _model(_data(replace(base, checkpoint_step=batches[0]), blank_batches=batches,
                          blank_rows=_pick(severity, 1, 4)), example_norm_eps=0.0)
    return Fault("numerical_instability", faulty, _model(faulty, example_norm_eps=1e-5), (DIVERGENCE,),
                 "checkpoint", f"per-example normalisation with eps=0; blank examples in batches {list(batches)}")


def bad_initialization(base: RunConfig, severity: str) -> Fault:
    """Every weight matrix N(0, 1) (mild) or N(0, 9) (severe) whatever its fan-in ("unit variance"):
    activations and logits blow up with depth, the loss starts far above the constant-predictor level
    and does not come below it. Fix: PyTorch's default init."""
    std = _pick(severity, 1.0, 3.0)
    faulty = _model(replace(base, checkpoint_step=2), init_std=std)
    return Fault("bad_initialization", faulty, _model(faulty, init_std=None), (HIGH_START,), "scratch",
                 f"weights initialised N(0, {std:g}^2) regardless of fan-in; fix: default init")


def bad_batch(base: RunConfig, severity: str) -> Fault:
    """One shard (batch 5) exported in other units, x100 (mild) or x1e5 (severe): its inputs where the
    first layer takes them raw (mlp, regressor); where a norm layer right after the first layer would
    absorb any input scale, its per-example loss weights (a class-balancing or data-mixing weight
    computed from counts in the wrong units). SGD is thrown off and diverges; AdamW's steps stay bounded
    but its second-moment estimate is inflated, and the run stalls."""
    scale = _pick(severity, 100.0, 1e5)
    part = WEIGHTS if FAMILIES[base.family].normalises_inputs else INPUTS
    faulty = _data(replace(base, checkpoint_step=5), bad_batch=5, bad_batch_scale=scale, bad_batch_part=part)
    return Fault("bad_batch", faulty, _data(faulty, bad_batch_scale=1.0), (DIVERGENCE, NO_LEARNING), "knobs",
                 f"batch 5's {'loss weights' if part == WEIGHTS else 'inputs'} in other units (x{scale:g}); "
                 "fix: skip (or re-export) it", Knobs(skip=(5,)))


# --- no learning ------------------------------------------------------------------------------------

def lr_too_low(base: RunConfig, severity: str) -> Fault:
    """The learning rate 1/100 (mild) or 1/3000 (severe) of the one that trains."""
    factor = _pick(severity, 100.0, 3000.0)
    faulty = replace(base, lr=base.lr / factor, checkpoint_step=20)
    return Fault("lr_too_low", faulty, replace(faulty, lr=base.lr), (NO_LEARNING,), "knobs",
                 f"lr {faulty.lr:g}, 1/{factor:g} of the one that trains", Knobs(lr_scale=factor))


def no_gradient_flow(base: RunConfig, severity: str) -> Fault:
    """Mild: forward() detaches the outputs (a stop-gradient meant for a teacher's logits) and adds a
    learnable calibration bias after the cut, the only thing that learns. Severe: the loss is computed on
    a NumPy copy of the outputs made a leaf with requires_grad=True "so backward works": nothing learns."""
    faulty = replace(base, checkpoint_step=40)
    if severity == "mild":
        faulty, fixed = _model(faulty, detach="output"), _model(faulty, detach=None)
        story = "outputs detached in forward(), a calibration bias after the cut; fix: remove .detach()"
    else:
        faulty, fixed = replace(faulty, loss_on_copy=True), faulty
        story = "loss on a NumPy copy of the outputs (a new leaf); fix: the loss on the outputs themselves"
    return Fault("no_gradient_flow", faulty, fixed, (NO_LEARNING,), "scratch" if severity == "mild" else "checkpoint",
                 story)


def frozen_parameters(base: RunConfig, severity: str) -> Fault:
    """All but the output bias frozen on a never-trained net. Mild: requires_grad_(False) on the model
    (left from an export step) with the output bias re-enabled; severe: the optimizer built from the
    output bias alone (the optimizer of a "re-fit the class prior" step). Fix: train every parameter."""
    how = _pick(severity, "requires_grad", "optimizer")
    faulty = replace(base, freeze=how, checkpoint_step=40)
    return Fault("frozen_parameters", faulty, replace(faulty, freeze=None), (NO_LEARNING,), "checkpoint",
                 _pick(severity, "model.requires_grad_(False) but the output bias",
                       "optimizer holds the output bias only") + "; fix: train every parameter")


def dead_relu(base: RunConfig, severity: str) -> Fault:
    """The neck's ReLU biases initialised at -3 (mild) or -10 (severe), "to start sparse": the units
    (almost) never fire on the data, so (almost) nothing below the head learns. Fix: default init."""
    bias = _pick(severity, -3.0, -10.0)
    faulty = _model(replace(base, checkpoint_step=60), neck_bias=bias)
    return Fault("dead_relu", faulty, _model(faulty, neck_bias=None), (NO_LEARNING,), "scratch",
                 f"neck ReLU biases initialised at {bias:g}; fix: default init")


def vanishing_gradients(base: RunConfig, severity: str) -> Fault:
    """A deep sigmoid neck (8 or 12 layers, default init) between trunk and head; in the residual family
    a refactor also dropped the skips (and norms) and made the blocks sigmoid. Fix: the usual ReLU neck
    (and the skips back)."""
    depth = _pick(severity, 8, 12)
    faulty = _model(replace(base, checkpoint_step=60), neck_activation="sigmoid", neck_depth=depth)
    story = f"{depth} sigmoid neck layers"
    if base.family == "resnet":
        faulty = _model(faulty, skips=False, block_activation="sigmoid")
        story += ", residual skips dropped, sigmoid blocks"
    return Fault("vanishing_gradients", faulty, replace(faulty, model=base.model), (NO_LEARNING,), "scratch",
                 story + "; fix: ReLU neck" + (" and skips back" if base.family == "resnet" else ""))


def lr_schedule_decayed(base: RunConfig, severity: str) -> Fault:
    """ExponentialLR meant per epoch stepped per batch (gamma 0.9 mild, 0.8 severe) in a 2000-step run:
    the loss drops early, then the LR is ~3e-5 (2e-10) of its peak by the checkpoint and the run stalls."""
    gamma = _pick(severity, 0.9, 0.8)
    faulty = replace(base, schedule=Schedule("exponential", gamma=gamma), total_steps=2000, checkpoint_step=100)
    fixed = replace(faulty, schedule=Schedule("warmup_cosine", warmup=0, total=2000))
    return Fault("lr_schedule_decayed", faulty, fixed, (NO_LEARNING,), "knobs",
                 f"ExponentialLR(gamma={gamma}) stepped per batch; fix: cosine over the 2000 steps",
                 Knobs(hold_peak_lr=base.lr))


def label_bug(base: RunConfig, severity: str) -> Fault:
    """Targets shuffled apart from their inputs (two arrays shuffled separately): 80% of them (mild) or
    all. The snapshot is 24 batches, so the continuation sees each example about twice, as a run on a
    real dataset would, rather than memorising the random labels."""
    fraction = _pick(severity, 0.8, 1.0)
    faulty = _data(replace(base, checkpoint_step=10), shuffled_labels=fraction, n_batches=24)
    return Fault("label_bug", faulty, _data(faulty, shuffled_labels=0.0), (NO_LEARNING,), "checkpoint",
                 f"{fraction:.0%} of targets moved to other examples; fix: keep each example with its target")


def wrong_loss(base: RunConfig, severity: str) -> Fault:
    """Classifiers and the LM: probabilities into cross_entropy (mild; a double softmax, floor
    ln(e + K - 1) - 1) or cross_entropy with label_smoothing=0.9 (severe; a typo for 0.1, floor ~ln K).
    The regressor: a sigmoid on the output for standardised targets (mild) or a (B, 1) - (B,) MSE that
    broadcasts every row against every target (severe). The binary classifier: a sigmoid before
    BCEWithLogitsLoss (mild; the logit is stuck in (0, 1)) or its targets smoothed by 0.9 (severe; 0.45 /
    0.55). Fix: the plain loss, trained from the start."""
    kind = {"regress": _pick(severity, "sigmoid_mse", "broadcast_mse"),
            "binary": _pick(severity, "double_sigmoid", "smoothed_bce")}.get(
        FAMILIES[base.family].task, _pick(severity, "softmax_ce", "smoothed_ce"))
    faulty = replace(base, loss=kind, checkpoint_step=80)
    return Fault("wrong_loss", faulty, replace(faulty, loss="default"), (NO_LEARNING,), "scratch",
                 f"loss {kind}; fix: the plain loss on raw outputs")


def loop_bug(base: RunConfig, severity: str) -> Fault:
    """The run's own train_step never updates the weights: the loss rebuilt from .item() as a new leaf
    (mild: backward reaches no weight) or zero_grad() called between backward() and step() (severe: every
    gradient wiped before it is used). Fix: the reference loop (zero_grad, forward, backward, step)."""
    kind = _pick(severity, "loss_from_item", "zero_grad_after_backward")
    faulty = replace(base, train_step=kind, checkpoint_step=40)
    return Fault("loop_bug", faulty, replace(faulty, train_step=None), (NO_LEARNING,), "knobs",
                 f"train_step {kind}; fix: zero_grad, forward, backward, step", Knobs(reference_loop=True))


def weight_decay_too_high(base: RunConfig, severity: str) -> Fault:
    """SGD weight_decay 0.5 or 2 (an L2 term stronger than the loss), AdamW weight_decay 10 or 50:
    weights shrink faster than the data pushes back. Fix: the usual decay (0 for SGD, 0.01 for AdamW)."""
    wd = _pick(severity, 0.5, 2.0) if base.optimizer == "sgd" else _pick(severity, 10.0, 50.0)
    faulty = replace(base, weight_decay=wd, checkpoint_step=60)
    return Fault("weight_decay_too_high", faulty, replace(faulty, weight_decay=base.weight_decay),
                 (NO_LEARNING,), "scratch", f"weight_decay={wd:g}; fix: {base.weight_decay:g}")


def clipping_too_aggressive(base: RunConfig, severity: str) -> Fault:
    """SGD: the global grad norm clipped at 1e-3 or 1e-5 while it is ~1 (every step a thousandth as long).
    AdamW rescales gradients itself, so clipping only hurts once the clipped gradient sinks under its eps:
    max_norm 1e-9 or 1e-11 (a value meant for eps)."""
    clip = _pick(severity, 1e-3, 1e-5) if base.optimizer == "sgd" else _pick(severity, 1e-9, 1e-11)
    faulty = replace(base, grad_clip=clip, checkpoint_step=40)
    return Fault("clipping_too_aggressive", faulty, replace(faulty, grad_clip=None), (NO_LEARNING,), "knobs",
                 f"grad_clip={clip:g}; fix: no clipping (or 1.0, a bound on outliers)", Knobs(clip=None))


# --- generalisation ---------------------------------------------------------------------------------

def overfitting(base: RunConfig, severity: str) -> Fault:
    """A small training set (96 or 48 examples in batches of 16) with annotation noise (20% of labels;
    noise of std 0.6 on the regressor's standardised targets), no weight decay, checkpointed where its
    owner notices: the first validation log 2% above the best (at most 200 steps). Fix: 8x (16x) more
    data and weight decay, trained from the start."""
    n = _pick(severity, 96, 48)
    noise = 0.3 if FAMILIES[base.family].task == "regress" else 0.2
    faulty = _data(replace(base, weight_decay=0.0, checkpoint_step=200, checkpoint_on_val_rise=True, val_every=10),
                   train_examples=n, batch_size=16, label_noise=noise, val_batches=6)
    fixed = _data(replace(faulty, weight_decay=5e-4 if base.optimizer == "sgd" else 0.1),
                  train_examples=None, batch_size=32, n_batches=24)
    return Fault("overfitting", faulty, fixed, (OVERFITTING,), "scratch",
                 f"{n} noisy training examples, no weight decay; fix: more data and weight decay")


def train_val_overlap(base: RunConfig, severity: str) -> Fault:
    """Validation batches whose first 40% (mild) or all (severe) rows are copies of training rows (the
    split was made after a step that duplicated rows). Fix: deduplicate the validation set."""
    fraction = _pick(severity, 0.4, 1.0)
    faulty = _data(replace(base, checkpoint_step=150, val_every=10), val_batches=6, val_overlap=fraction)
    return Fault("train_val_overlap", faulty, _data(faulty, val_overlap=0.0), (VAL_LEAK,), "checkpoint",
                 f"{fraction:.0%} of validation rows copied from training; fix: deduplicate")


# --- healthy ----------------------------------------------------------------------------------------

HEALTHY_VARIANTS = {
    "mild": ("plain", "converged", "warmup_cosine", "val_tracked"),
    "severe": ("small_batch", "label_noise", "high_lr", "dropout"),   # noisy but fine
}


def healthy(base: RunConfig, variant: str) -> Fault:
    """A run with nothing wrong; the "severe" variants are noisy but fine."""
    runs = {
        "plain": base,
        "converged": replace(base, checkpoint_step=250),
        "warmup_cosine": replace(base, schedule=Schedule("warmup_cosine", warmup=20, total=300),
                                 total_steps=300, checkpoint_step=20),
        "val_tracked": _data(replace(base, val_every=10, checkpoint_step=20), val_batches=6),
        "small_batch": _data(base, batch_size=8, n_batches=24),
        "label_noise": _data(base, label_noise=0.2),
        "high_lr": replace(base, lr=base.lr * 2),
        "dropout": _model(base, dropout=0.3),
    }
    if variant == "converged" and FAMILIES[base.family].task == "lm":
        variant = "val_tracked"  # a language model converges to its entropy, a flat curve far above zero
    run = runs[variant]
    return Fault(HEALTHY, run, run, (NONE,), "checkpoint", f"healthy ({variant})")


INJECTIONS: dict[str, Callable[[RunConfig, str], Fault]] = {
    name: globals()[name] for name in CAUSES
}
