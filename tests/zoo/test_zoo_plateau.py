"""The plateau / loop / data half of the fault zoo: each fault reproduces with stock PyTorch, each fix trains.

Faults are checked where a user would notice them: on the run resumed from the example's checkpoint.
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import importlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from _zoo import mean_loss, resume, train_plain, train_with_val  # noqa: E402

LN10 = math.log(10)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run faster on one thread than fighting for two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def stuck_run(name, tmp_path):
    """The example's faulty run, resumed from the checkpoint it wrote (written once per test)."""
    module = importlib.import_module(name)
    path = tmp_path / f"{name}.pt"
    if not path.exists():
        module.write_checkpoint(path)
    return module, resume(module.setup, path)


def fresh(setup_fn):
    torch.manual_seed(0)
    return setup_fn()


def head(losses, k=5):
    return float(np.mean(losses[:k]))


def tail(losses, k=5):
    return float(np.mean(losses[-k:]))


def rel_drop(losses):
    return 1 - tail(losses) / head(losses)


def without_user_step(setup):
    return setup.model_copy(update={"train_step": None})


PLATEAU_EXAMPLES = ["lr_too_low", "lr_too_low_gru", "no_gradient_flow", "frozen_parameters", "frozen_parameters_cnn",
                    "dead_relu", "dead_relu_cnn", "vanishing_gradients", "lr_schedule_decayed", "label_bug",
                    "wrong_loss", "loop_bug", "loop_bug_gru", "weight_decay_too_high", "clipping_too_aggressive",
                    "overfitting", "train_val_overlap"]


@pytest.mark.parametrize("name", PLATEAU_EXAMPLES)
def test_example_follows_the_zoo_contract(name):
    module = importlib.import_module(name)
    assert module.ROOT_CAUSE == name.split("_cnn")[0].split("_gru")[0]
    assert module.__doc__ and "Fix" in module.__doc__
    assert 8 <= len(module.setup().batches) <= 16


# --- lr_too_low ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["lr_too_low", "lr_too_low_gru"])
def test_lr_too_low_plateaus_and_lr_x10_makes_progress(name, tmp_path):
    module, run = stuck_run(name, tmp_path)
    stuck = train_plain(run, 60)
    assert rel_drop(stuck) < 0.08
    _, run = stuck_run(name, tmp_path)
    for group in run.optimizer.param_groups:  # these runs have no scheduler
        group["lr"] *= 10.0
    faster = train_plain(run, 40)
    assert rel_drop(faster) > 3 * max(rel_drop(stuck), 0.01)


@pytest.mark.parametrize("name", ["lr_too_low", "lr_too_low_gru"])
def test_lr_too_low_fix_trains(name):
    losses = train_plain(fresh(importlib.import_module(name).fixed_setup), 40)
    assert all(map(math.isfinite, losses)) and tail(losses) < 0.5 * head(losses)


# --- no_gradient_flow / frozen_parameters --------------------------------------------------------

def test_no_gradient_flow_encoder_gets_no_gradient(tmp_path):
    module, run = stuck_run("no_gradient_flow", tmp_path)
    run.optimizer.zero_grad(set_to_none=True)
    run.loss_fn(run.model, run.batches[0]).backward()
    assert all(p.grad is None for p in run.model.encoder.parameters())
    assert all(p.grad is not None for p in run.model.head.parameters())
    losses = train_plain(run, 60)
    assert rel_drop(losses) < 0.05 and tail(losses) > 1.5


def test_no_gradient_flow_fix_trains_every_parameter():
    run = fresh(importlib.import_module("no_gradient_flow").fixed_setup)
    run.loss_fn(run.model, run.batches[0]).backward()
    assert all(p.grad is not None for p in run.model.parameters())
    losses = train_plain(run, 40)
    assert tail(losses) < 0.5 * head(losses)


def test_frozen_parameters_body_missing_from_optimizer(tmp_path):
    module, run = stuck_run("frozen_parameters", tmp_path)
    in_optimizer = {id(p) for g in run.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_optimizer for p in run.model.body.parameters())
    before = [p.detach().clone() for p in run.model.body.parameters()]
    losses = train_plain(run, 60)
    assert all(torch.equal(b, p) for b, p in zip(before, run.model.body.parameters()))
    assert rel_drop(losses) < 0.05 and tail(losses) > 1.5


def test_frozen_parameters_cnn_features_have_requires_grad_false(tmp_path):
    module, run = stuck_run("frozen_parameters_cnn", tmp_path)
    assert not any(p.requires_grad for p in run.model.features.parameters())
    losses = train_plain(run, 60)
    assert rel_drop(losses) < 0.05 and tail(losses) > 1.8


@pytest.mark.parametrize("name,steps", [("frozen_parameters", 40), ("frozen_parameters_cnn", 100)])
def test_frozen_parameters_fix_trains(name, steps):
    losses = train_plain(fresh(importlib.import_module(name).fixed_setup), steps)
    assert tail(losses) < 0.5 * head(losses)


# --- dead_relu ----------------------------------------------------------------------------------------

def never_active_fraction(model, batches):
    """Per ReLU module: the fraction of its units that are zero on every example of `batches`."""
    fired = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out, name=name: fired.setdefault(name, []).append(
        (out > 0).flatten(1).any(0))) for name, m in model.named_modules() if isinstance(m, torch.nn.ReLU)]
    with torch.no_grad():
        for x, _ in batches:
            model(x)
    for h in hooks:
        h.remove()
    return {name: 1 - torch.stack(v).any(0).float().mean().item() for name, v in fired.items()}


def test_dead_relu_units_never_fire_and_loss_is_flat(tmp_path):
    module, run = stuck_run("dead_relu", tmp_path)
    dead = never_active_fraction(run.model, run.batches)
    assert dead["3"] > 0.99 and dead["1"] > 0.3  # a fully dead layer cuts every path to the output
    losses = train_plain(run, 60)
    assert abs(rel_drop(losses)) < 0.02 and tail(losses) > 0.95 * LN10


def test_dead_relu_cnn_blowup_left_a_dead_layer(tmp_path):
    module, run = stuck_run("dead_relu_cnn", tmp_path)
    assert max(never_active_fraction(run.model, run.batches).values()) > 0.95
    losses = train_plain(run, 60)
    assert np.mean(losses) > 0.85 * LN10  # at chance: only the output bias still learns


@pytest.mark.parametrize("name", ["dead_relu", "dead_relu_cnn"])
def test_dead_relu_fix_trains(name):
    run = fresh(importlib.import_module(name).fixed_setup)
    assert max(never_active_fraction(run.model, run.batches).values()) < 0.5
    losses = train_plain(run, 40)
    assert tail(losses) < 0.5 * head(losses)


# --- vanishing_gradients ------------------------------------------------------------------------

def linear_grad_norms(setup):
    setup.optimizer.zero_grad(set_to_none=True)
    setup.loss_fn(setup.model, setup.batches[0]).backward()
    return [m.weight.grad.norm().item() for m in setup.model if isinstance(m, torch.nn.Linear)]


def test_vanishing_gradients_first_layers_get_tiny_gradients(tmp_path):
    module, run = stuck_run("vanishing_gradients", tmp_path)
    norms = linear_grad_norms(run)
    assert norms[0] < 1e-3 * norms[-1]
    losses = train_plain(run, 60)
    assert abs(rel_drop(losses)) < 0.03 and tail(losses) > 0.95 * LN10


def test_vanishing_gradients_fix_keeps_gradients_and_trains():
    run = fresh(importlib.import_module("vanishing_gradients").fixed_setup)
    norms = linear_grad_norms(run)
    assert norms[0] > 1e-2 * norms[-1]
    losses = train_plain(run, 40)
    assert tail(losses) < 0.7 * head(losses)


# --- lr_schedule_decayed --------------------------------------------------------------------------

def test_lr_schedule_decayed_lr_is_near_zero_after_an_early_drop(tmp_path):
    module, run = stuck_run("lr_schedule_decayed", tmp_path)
    history = torch.load(tmp_path / "lr_schedule_decayed.pt", weights_only=True)["history"]
    assert history[-1] < 0.75 * history[0]  # the early drop
    assert run.optimizer.param_groups[0]["lr"] < 1e-3 * module.PEAK_LR
    assert run.total_steps > 10 * len(history)
    losses = train_plain(run, 60)
    assert abs(rel_drop(losses)) < 0.05 and tail(losses) > 1.0


def test_lr_schedule_decayed_fix_keeps_learning():
    run = fresh(importlib.import_module("lr_schedule_decayed").fixed_setup)
    losses = train_plain(run, 80)
    assert run.optimizer.param_groups[0]["lr"] > 0.9 * importlib.import_module("lr_schedule_decayed").PEAK_LR
    assert tail(losses) < 0.5  # the faulty schedule stalls near 1.4


# --- label_bug ------------------------------------------------------------------------------------------

def test_label_bug_labels_unrelated_and_loss_at_chance(tmp_path):
    module, run = stuck_run("label_bug", tmp_path)
    true_labels = torch.cat([y for _, y in fresh(module.fixed_setup).batches])
    labels = torch.cat([y for _, y in run.batches])
    assert (labels == true_labels).float().mean() < 0.2  # ~1 in 10 by chance
    losses = train_plain(run, 60)
    assert tail(losses, 10) > 0.9 * LN10


def test_label_bug_fix_trains():
    losses = train_plain(fresh(importlib.import_module("label_bug").fixed_setup), 80)
    assert tail(losses) < 0.5 * LN10


# --- wrong_loss -----------------------------------------------------------------------------------------

def test_wrong_loss_double_softmax_plateaus_above_its_floor(tmp_path):
    module, run = stuck_run("wrong_loss", tmp_path)
    assert isinstance(run.model[-1], torch.nn.Softmax)
    losses = train_plain(run, 60)
    assert min(losses) > module.DOUBLE_SOFTMAX_FLOOR > 1.4
    assert abs(rel_drop(losses)) < 0.05


def test_wrong_loss_fix_goes_below_the_floor():
    module = importlib.import_module("wrong_loss")
    losses = train_plain(fresh(module.fixed_setup), 150)
    assert tail(losses) < 0.5 * module.DOUBLE_SOFTMAX_FLOOR


# --- loop_bug ---------------------------------------------------------------------------------------------

def test_loop_bug_zero_grad_misplaced_never_moves_weights(tmp_path):
    module, run = stuck_run("loop_bug", tmp_path)
    before = [p.detach().clone() for p in run.model.parameters()]
    losses = train_plain(run, 60)
    assert all(torch.equal(b, p) for b, p in zip(before, run.model.parameters()))
    assert abs(rel_drop(losses)) < 0.03
    _, run = stuck_run("loop_bug", tmp_path)
    reference = train_plain(without_user_step(run), 40)  # the stock loop on the same checkpoint trains
    assert tail(reference) < 0.5 * head(reference)


def test_loop_bug_gru_without_zero_grad_stalls_where_the_stock_loop_trains(tmp_path):
    module, run = stuck_run("loop_bug_gru", tmp_path)
    user = train_plain(run, 60)
    _, run = stuck_run("loop_bug_gru", tmp_path)
    reference = train_plain(without_user_step(run), 60)
    assert tail(user, 10) > 1.2  # no better than where it began (ln 4 ~ 1.39)
    assert tail(reference, 10) < 0.6 * tail(user, 10)


@pytest.mark.parametrize("name", ["loop_bug", "loop_bug_gru"])
def test_loop_bug_fixed_train_step_trains(name):
    run = fresh(importlib.import_module(name).fixed_setup)
    assert run.train_step is not None
    losses = train_plain(run, 40)
    assert tail(losses) < 0.5 * head(losses)


# --- weight_decay_too_high -----------------------------------------------------------------------------

def weight_norm(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).norm().item()


def test_weight_decay_too_high_collapses_weights(tmp_path):
    module = importlib.import_module("weight_decay_too_high")
    assert weight_norm(resume(module.setup, module.write_checkpoint(tmp_path / "wd.pt")).model) \
        < 0.2 * weight_norm(fresh(module.setup).model)
    _, run = stuck_run("weight_decay_too_high", tmp_path)
    losses = train_plain(run, 60)
    assert tail(losses) > 0.95 * LN10


def test_weight_decay_x01_and_fix_train(tmp_path):
    module = importlib.import_module("weight_decay_too_high")
    run = fresh(module.setup)
    for group in run.optimizer.param_groups:
        group["weight_decay"] *= 0.1
    assert tail(train_plain(run, 100)) < 0.6 * LN10
    assert tail(train_plain(fresh(module.fixed_setup), 40)) < 0.3 * LN10


# --- clipping_too_aggressive ----------------------------------------------------------------------------

def test_clipping_too_aggressive_norm_always_far_above_threshold(tmp_path):
    module, run = stuck_run("clipping_too_aggressive", tmp_path)
    norms = []
    for batch in run.batches:
        run.optimizer.zero_grad(set_to_none=True)
        run.loss_fn(run.model, batch).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(run.model.parameters(), float("inf")).item())
    assert min(norms) > 100 * run.grad_clip
    _, run = stuck_run("clipping_too_aggressive", tmp_path)
    losses = train_plain(run, 60)
    assert abs(rel_drop(losses)) < 0.05


def test_clipping_fix_trains():
    losses = train_plain(fresh(importlib.import_module("clipping_too_aggressive").fixed_setup), 40)
    assert tail(losses) < 0.3 * head(losses)


# --- overfitting ------------------------------------------------------------------------------------------

def test_overfitting_history_and_replay_show_val_rising(tmp_path):
    module = importlib.import_module("overfitting")
    path = module.write_checkpoint(tmp_path / "overfitting.pt")
    history = torch.load(path, weights_only=True)["history"]
    val = [h["val_loss"] for h in history]
    best = int(np.argmin(val))
    assert best < len(val) - 5 and val[-1] > 1.15 * val[best]
    assert history[-1]["loss"] < 0.1 * history[best]["loss"] + 0.05  # train kept falling
    log = train_with_val(resume(module.setup, path), 60, 10)
    assert log[-1]["val_loss"] > log[0]["val_loss"] and log[-1]["loss"] < log[0]["loss"]


def test_overfitting_fix_keeps_val_down():
    module = importlib.import_module("overfitting")
    faulty_best = min(h["val_loss"] for h in train_with_val(fresh(module.setup), 60, 10))
    log = train_with_val(fresh(module.fixed_setup), 120, 20)
    val = [h["val_loss"] for h in log]
    assert val[-1] < 1.05 * min(val) and val[-1] < 0.7 * faulty_best


# --- train_val_overlap -------------------------------------------------------------------------------------

def duplicates(train_batches, val_batches):
    train_rows = {tuple(row.tolist()) for x, _ in train_batches for row in x}
    return sum(tuple(row.tolist()) in train_rows for x, _ in val_batches for row in x)


def test_train_val_overlap_val_holds_train_copies_and_looks_better(tmp_path):
    module, run = stuck_run("train_val_overlap", tmp_path)
    total = sum(len(x) for x, _ in run.val_batches)
    assert duplicates(run.batches, run.val_batches) >= 0.4 * total
    clean_val = fresh(module.fixed_setup).val_batches
    assert mean_loss(run, run.val_batches) < 0.9 * mean_loss(run, clean_val)


def test_train_val_overlap_fix_has_no_duplicates():
    run = fresh(importlib.import_module("train_val_overlap").fixed_setup)
    assert duplicates(run.batches, run.val_batches) == 0
    losses = train_plain(run, 40)
    assert tail(losses) < 0.3 * head(losses)
