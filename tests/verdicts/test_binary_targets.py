"""A binary classifier (one logit, float 0/1 targets, BCEWithLogitsLoss): the loss of learning nothing is
its label's binary entropy, and the standard loss its outputs are held against is binary cross-entropy,
not the MSE a regressor's float targets get."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import triage
from tests._instrument_runs import run, session_of, train_and_triage
from triage.experiments.init_check import INIT_LOSS
from triage.experiments.levels import loss_levels
from triage.experiments.outputs import OUTPUT_CHECK
from triage.experiments.standard_loss import STANDARD_LOSS_SWAP

POSITIVES = 0.25


def _batches():
    """12 batches of 32: 10 features, a target that depends on two of them, a quarter positives."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(384, 10, generator=g)
    score = x[:, 0] + 0.8 * x[:, 1]
    y = (score > score.quantile(1 - POSITIVES)).float()
    return [(x[i:i + 32], y[i:i + 32]) for i in range(0, 384, 32)]


def _constant_losses() -> tuple[float, float]:
    """Predicting the snapshot's frequency of positives p for every example, scored (as triage scores
    levels) on the first 4 batches: (binary cross-entropy, squared error)."""
    p = float(torch.cat([y for _, y in _batches()]).mean())
    y = torch.cat([y for _, y in _batches()[:4]])
    q = float(y.mean())
    return -(q * math.log(p) + (1 - q) * math.log(1 - p)), float(((y - p) ** 2).mean())


def bce_logits(model, batch):
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x).squeeze(-1), y)


def double_sigmoid(model, batch):  # the bug: probabilities into a loss that applies the sigmoid again
    x, y = batch
    return F.binary_cross_entropy_with_logits(torch.sigmoid(model(x).squeeze(-1)), y)


def bce_on_probabilities(model, batch):  # the model ends in a Sigmoid: BCELoss on its probabilities
    x, y = batch
    return F.binary_cross_entropy(model(x).squeeze(-1), y)


def mse_on_labels(model, batch):
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


def binary_setup(loss_fn=bce_logits, lr=0.1, squash=False):
    torch.manual_seed(0)
    layers = [nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)] + ([nn.Sigmoid()] if squash else [])
    model = nn.Sequential(*layers)
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                        loss_fn=loss_fn, batches=_batches())


@pytest.mark.parametrize("loss_fn, squash", [(bce_logits, False), (bce_on_probabilities, True)],
                         ids=["logits", "probabilities"])
def test_learning_nothing_costs_the_binary_entropy_whether_the_loss_takes_logits_or_probabilities(loss_fn, squash):
    levels = loss_levels(session_of(lambda: binary_setup(loss_fn, squash=squash)))
    assert levels.kind == "binary"
    assert levels.nothing_learned == pytest.approx(_constant_losses()[0], rel=1e-4)  # not MSE's p(1 - p)


def test_under_mse_the_same_labels_cost_their_variance():
    levels = loss_levels(session_of(lambda: binary_setup(mse_on_labels)))
    assert levels.nothing_learned == pytest.approx(_constant_losses()[1], rel=1e-4)


@pytest.mark.parametrize("loss_fn, squash, rule", [
    (bce_logits, False, "binary_cross_entropy"),
    (bce_on_probabilities, True, "binary_cross_entropy_on_probabilities"),
], ids=["logits", "probabilities"])
def test_a_plain_binary_loss_is_its_own_standard(loss_fn, squash, rule):
    out = run(OUTPUT_CHECK, session_of(lambda: binary_setup(loss_fn, squash=squash)))
    assert out.standard_rule == rule
    assert out.loss_vs_standard == pytest.approx(1.0, rel=1e-4) and out.gradient_vs_standard < 1e-4


def test_a_sigmoid_before_bce_with_logits_sends_another_gradient():
    out = run(OUTPUT_CHECK, session_of(lambda: binary_setup(double_sigmoid)))
    assert out.standard_rule == "binary_cross_entropy" and out.gradient_vs_standard > 0.5


def test_a_plain_binary_run_at_too_low_a_learning_rate_gains_nothing_from_the_standard_loss():
    # Held against MSE, BCE's gradient differs and MSE "learned" in its own unit: a wrong wrong_loss.
    out = run(STANDARD_LOSS_SWAP, session_of(lambda: binary_setup(lr=1e-4)), steps=40)
    assert out.rule == "binary_cross_entropy" and out.fix_works is False


def test_an_init_far_from_sane_is_measured_against_the_binary_entropy():
    def blown_up():
        setup = binary_setup()
        with torch.no_grad():
            for layer in setup.model:
                if isinstance(layer, nn.Linear):
                    layer.weight.normal_(0, 3.0)
        return setup

    assert run(INIT_LOSS, session_of(binary_setup)).setup_init_vs_nothing < 1.5
    out = run(INIT_LOSS, session_of(blown_up))
    assert out.expected_loss is None  # no ln K: one logit
    assert out.setup_init_vs_nothing > 3


def test_triage_names_a_sigmoid_before_bce_with_logits(tmp_path):
    report = train_and_triage(tmp_path, lambda: binary_setup(double_sigmoid), steps=60)
    assert report.root_cause == "wrong_loss", report.path
    assert report.proof == "standard_loss" and "binary_cross_entropy" in report.fix
