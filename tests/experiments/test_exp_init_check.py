"""init_loss: the loss at init against ln(K), and activation growth with depth."""

import math

import torch
from torch import nn

from tests._instrument_runs import classifier_setup, digits, run, session_of
from triage.experiments.init_check import INIT_LOSS


def _deep_mlp(init_std=None):
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    if init_std is not None:
        for m in model:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=init_std)
    return model


def test_weights_with_std_5_give_an_init_loss_far_above_ln_k_that_default_init_does_not():
    out = run(INIT_LOSS, session_of(lambda: classifier_setup(model=_deep_mlp(init_std=5.0))))
    assert out.num_classes == 10
    assert math.isclose(out.expected_loss, math.log(10))
    assert out.setup_init_ratio > 10
    assert 0.8 < out.default_init_ratio < 1.3
    # Activations explode with depth at the bad init, not at the default one.
    assert out.activation_std_growth_setup > 100
    assert out.activation_std_growth_default < 3
    # No checkpoint was loaded: the checkpoint's weights are setup()'s init.
    assert math.isclose(out.loss_checkpoint, out.loss_setup_init, rel_tol=1e-5)


def test_a_default_init_stays_near_ln_k():
    out = run(INIT_LOSS, session_of(lambda: classifier_setup(model=_deep_mlp())))
    assert 0.8 < out.setup_init_ratio < 1.3
    assert 0.8 < out.default_init_ratio < 1.3
    assert out.activation_std_growth_setup < 3


def test_regression_has_no_expected_loss():
    batches = [(x, x[:, :1].clone()) for x, _ in digits(2)]

    def factory():
        model = nn.Linear(64, 1)
        return classifier_setup(batches=batches, model=model,
                                loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))

    out = run(INIT_LOSS, session_of(factory))
    assert out.num_classes is None and out.expected_loss is None and out.setup_init_ratio is None
    assert math.isfinite(out.loss_setup_init)
    assert out.activation_std_growth_setup is None  # a single layer has no depth to grow over


def test_the_checkpoint_model_is_left_as_it_was():
    session = session_of(lambda: classifier_setup(model=nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32),
                                                                      nn.ReLU(), nn.Linear(32, 10))))
    before = {k: v.clone() for k, v in session.setup.model.state_dict().items()}
    run(INIT_LOSS, session)
    after = session.setup.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # BatchNorm running stats included
