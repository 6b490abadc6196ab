"""The divergence half of the fault zoo: each example's fault reproduces with a stock loop, and its fix trains.

Assertions are what a user would check by hand: NaN or not, how far the loss rose or fell, grad norms.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import _zoo  # noqa: E402

STEPS = 40
LN10 = math.log(10)


def example(name: str):
    return importlib.import_module(name)


def build(setup_fn, **changes):
    torch.manual_seed(0)
    setup = setup_fn()
    return setup.model_copy(update=changes) if changes else setup


def train(setup_fn, steps: int = STEPS, **changes) -> list[float]:
    return _zoo.train_plain(build(setup_fn, **changes), steps)


def scale_lr(setup, factor: float):
    for group in setup.optimizer.param_groups:
        group["lr"] *= factor
    return setup


def start_end(losses: list[float]) -> tuple[float, float]:
    """Median loss of the first and of the last fifth of the steps."""
    k = max(1, len(losses) // 5)
    return float(np.median(losses[:k])), float(np.median(losses[-k:]))


def assert_trains(losses: list[float], steps: int = STEPS, factor: float = 0.5):
    assert len(losses) == steps and all(math.isfinite(x) for x in losses), losses
    start, end = start_end(losses)
    assert end < factor * start, f"loss went {start:.3g} -> {end:.3g}"


def grad_norms(setup, steps: int) -> tuple[list[float], list[float]]:
    """Like train_plain (fp32, the setup's clip), also recording the global grad norm before clipping."""
    losses, norms = [], []
    for step in range(steps):
        setup.optimizer.zero_grad()
        loss = setup.loss_fn(setup.model, setup.batches[step % len(setup.batches)])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(setup.model.parameters(), setup.grad_clip or math.inf)))
        setup.optimizer.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]) or not math.isfinite(norms[-1]):
            break
    return losses, norms


def first_nonfinite_module(model: torch.nn.Module, batch) -> str | None:
    """The first module, in execution order, whose output holds a NaN or Inf."""
    found = []

    def hook(name):
        def check(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            if not found and isinstance(out, torch.Tensor) and not torch.isfinite(out).all():
                found.append(name)
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad():
            model(batch[0])
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


# --- nonfinite_data ------------------------------------------------------------------------------

def test_nonfinite_data_has_nan_inputs_and_the_run_nans_on_that_batch():
    m = example("nonfinite_data")
    setup = build(m.setup)
    bad = [i for i, (x, y) in enumerate(setup.batches) if not torch.isfinite(x).all()]
    assert bad == [m.BAD_BATCH]
    losses = _zoo.train_plain(setup, STEPS)
    assert len(losses) == m.BAD_BATCH + 1 and math.isnan(losses[-1])
    assert all(math.isfinite(x) for x in losses[:-1])
    assert any(torch.isnan(p).any() for p in setup.model.parameters())  # one step poisons the weights


def test_nonfinite_data_fixed_imputes_and_trains():
    m = example("nonfinite_data")
    setup = build(m.fixed_setup)
    assert all(torch.isfinite(x).all() for x, _ in setup.batches)
    assert_trains(_zoo.train_plain(setup, STEPS), factor=0.3)


# --- lr_too_high (MLP and transformer) -----------------------------------------------------------

@pytest.mark.parametrize("name", ["lr_too_high", "lr_too_high_transformer"])
def test_lr_too_high_diverges(name):
    losses = train(example(name).setup)
    assert max(losses) > 3 * losses[0]  # the loss leaps far above where it started
    fixed_end = start_end(train(example(name).fixed_setup))[1]
    assert start_end(losses)[1] > 5 * fixed_end  # and ends far above where the fixed run gets


@pytest.mark.parametrize("name", ["lr_too_high", "lr_too_high_transformer"])
def test_lr_too_high_fixed_by_a_tenth_of_the_lr(name):
    m = example(name)
    assert m.FIXED_LR == pytest.approx(m.FAULTY_LR / 10)
    losses = train(m.fixed_setup)
    assert_trains(losses, factor=0.2)
    assert max(losses) < 1.2 * losses[0]  # no spike above the start


# --- exploding_gradients --------------------------------------------------------------------------

def test_exploding_gradients_spike_and_the_run_never_settles_even_at_a_tenth_of_the_lr():
    m = example("exploding_gradients")
    losses, norms = grad_norms(build(m.setup), STEPS)
    assert max(norms) > 20 * sorted(norms)[len(norms) // 2]  # the glitch steps tower over the rest
    assert start_end(losses)[1] > 0.9 * LN10  # and the run stays at chance
    for factor in (0.1, 0.01):
        slow_losses, _ = grad_norms(scale_lr(build(m.setup), factor), STEPS)
        assert start_end(slow_losses)[1] > 0.8 * LN10  # a lower lr is too slow to learn between glitches


def test_exploding_gradients_fixed_by_clipping_at_1():
    m = example("exploding_gradients")
    setup = build(m.fixed_setup)
    assert setup.grad_clip == 1.0
    losses, norms = grad_norms(setup, STEPS)
    assert max(norms) > 10  # the glitch gradients are still ~15x the others; only their steps are bounded
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert start_end(losses)[1] < 0.2 * losses[0]


# --- fp16_overflow --------------------------------------------------------------------------------

def test_fp16_overflow_nan_under_fp16_only():
    m = example("fp16_overflow")
    setup = build(m.setup)
    assert setup.precision == "fp16"
    assert max(float(x.max()) for x, _ in setup.batches) > torch.finfo(torch.float16).max
    losses = _zoo.train_plain(setup, STEPS)
    assert not math.isfinite(losses[-1]) and len(losses) == 1
    assert_trains(train(m.setup, precision="fp32"), factor=0.3)


def test_fp16_overflow_fixed_by_bf16():
    m = example("fp16_overflow")
    assert build(m.fixed_setup).precision == "bf16"
    assert_trains(train(m.fixed_setup), factor=0.3)


# --- numerical_instability ------------------------------------------------------------------------

def test_numerical_instability_nan_at_low_lr_with_clipping_in_a_named_module():
    m = example("numerical_instability")
    for setup in (build(m.setup), scale_lr(build(m.setup), 0.1), build(m.setup, grad_clip=1.0)):
        assert setup.optimizer.param_groups[0]["lr"] <= 1e-3
        losses = _zoo.train_plain(setup, STEPS)
        assert len(losses) == m.FIRST_PADDED_BATCH + 1 and math.isnan(losses[-1])
    setup = build(m.setup)
    assert all(torch.isfinite(x.float()).all() for x, _ in setup.batches)  # the data are clean
    assert first_nonfinite_module(setup.model, setup.batches[m.FIRST_PADDED_BATCH]) == "encoder.blocks.1.norm"
    assert first_nonfinite_module(setup.model, setup.batches[0]) is None


def test_numerical_instability_fixed_by_eps():
    m = example("numerical_instability")
    setup = build(m.fixed_setup)
    assert first_nonfinite_module(setup.model, setup.batches[m.FIRST_PADDED_BATCH]) is None
    assert_trains(_zoo.train_plain(setup, STEPS), factor=0.3)


# --- bad_initialization ---------------------------------------------------------------------------

def activation_scales(model: torch.nn.Sequential, x: torch.Tensor) -> list[float]:
    scales = []
    with torch.no_grad():
        for layer in model:
            x = layer(x)
            if isinstance(layer, torch.nn.Linear):
                scales.append(float(x.std()))
    return scales


def test_bad_initialization_starts_far_above_ln_k_with_exploding_activations():
    m = example("bad_initialization")
    setup = build(m.setup)
    x, _ = setup.batches[0]
    scales = activation_scales(setup.model, x)
    assert scales[-1] > 1e3 * scales[0]  # activations grow with depth
    losses = _zoo.train_plain(setup, STEPS)
    assert losses[0] > 1000 * LN10
    assert min(x for x in losses if math.isfinite(x)) > 100 * LN10  # 40 steps do not recover it


def test_bad_initialization_fixed_by_default_init():
    m = example("bad_initialization")
    setup = build(m.fixed_setup)
    x, _ = setup.batches[0]
    scales = activation_scales(setup.model, x)
    assert scales[-1] < 10 * scales[0]
    losses = _zoo.train_plain(setup, STEPS)
    assert abs(losses[0] - LN10) < 0.2 * LN10
    assert_trains(losses, factor=0.5)


# --- bad_batch ------------------------------------------------------------------------------------

def test_bad_batch_is_an_outlier_and_the_run_spikes_at_it():
    m = example("bad_batch")
    setup = build(m.setup)
    with torch.no_grad():
        batch_losses = [float(setup.loss_fn(setup.model, b)) for b in setup.batches]
    others = np.median([v for i, v in enumerate(batch_losses) if i != m.BAD_BATCH])
    assert int(np.argmax(batch_losses)) == m.BAD_BATCH and batch_losses[m.BAD_BATCH] > 10 * others
    losses = _zoo.train_plain(setup, STEPS)
    assert all(x < 1.2 * losses[0] for x in losses[:m.BAD_BATCH])  # fine up to the bad batch
    assert max(losses[m.BAD_BATCH:m.BAD_BATCH + 2]) > 20 * losses[0]  # the spike
    assert start_end(losses)[1] > 0.8 * LN10  # and the run never recovers (chance level)


def test_bad_batch_fixed_by_dropping_it():
    m = example("bad_batch")
    assert len(build(m.fixed_setup).batches) == len(build(m.setup).batches) - 1
    losses = train(m.fixed_setup)
    assert_trains(losses, factor=0.3)
    assert max(losses) < 1.1 * losses[0]


# --- healthy --------------------------------------------------------------------------------------

HEALTHY = ["healthy_mlp", "healthy_cnn", "healthy_transformer"]
CHECKPOINT_STEP = 5


def relu_dead_fraction(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Fraction of ReLU units (channels for conv maps) that output zero on every example of the batch."""
    dead, total = [], []

    def hook(module, inputs, output):
        alive = (output > 0).flatten(2).any(-1) if output.dim() > 2 else (output > 0)  # (B, units)
        dead.append(int((~alive.any(0)).sum()))
        total.append(alive.shape[1])

    handles = [mod.register_forward_hook(hook) for mod in model.modules() if isinstance(mod, torch.nn.ReLU)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return sum(dead) / max(1, sum(total))


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_runs_keep_training_after_the_checkpoint(name):
    m = example(name)
    setup = build(m.setup)
    classes = 10 if name != "healthy_transformer" else 4
    losses = _zoo.train_plain(setup, CHECKPOINT_STEP + STEPS)
    assert abs(losses[0] - math.log(classes)) < 0.15 * math.log(classes)  # sane init loss
    after = losses[CHECKPOINT_STEP:]  # what a replay from the checkpoint sees
    assert_trains(after, factor=0.5)
    best, worst_rise = after[0], 0.0
    for x in after[1:]:
        worst_rise, best = max(worst_rise, x - best), min(best, x)
    assert worst_rise < 0.5 * after[0]  # no spikes
    assert relu_dead_fraction(setup.model, setup.batches[0][0]) < 0.1


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_fixed_setup_is_the_same_run(name):
    m = example(name)
    assert train(m.fixed_setup, 10) == train(m.setup, 10)


# --- every example writes a checkpoint triage can load ------------------------------------------

EXAMPLES = ["nonfinite_data", "lr_too_high", "lr_too_high_transformer", "exploding_gradients", "fp16_overflow",
            "numerical_instability", "bad_initialization", "bad_batch", *HEALTHY]


@pytest.mark.parametrize("name", EXAMPLES)
def test_checkpoint_is_written_before_the_weights_go_bad(name, tmp_path):
    m = example(name)
    path = m.write_checkpoint(tmp_path / f"{name}.pt")
    state = torch.load(path, weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert m.ROOT_CAUSE and m.__doc__
