"""lr_range_test: Leslie Smith's sweep from the checkpoint suggests an LR; the weights are handed back."""

import torch

from tests._instrument_runs import classifier_setup, digits, run, session_of
from triage.experiments.lr_range import LR_RANGE_TEST


def test_a_learning_rate_100x_too_low_gets_a_suggestion_far_above_it():
    out = run(LR_RANGE_TEST, session_of(lambda: classifier_setup(lr=0.01)))
    assert out.current_lr == 0.01
    assert out.suggested_ratio > 30
    assert out.diverged_at_lr is not None and out.diverged_at_lr > out.suggested_lr
    assert len(out.lrs) < 100  # stopped at divergence, before the sweep's end
    assert out.lrs == sorted(out.lrs)


def test_a_good_learning_rate_gets_a_suggestion_near_it():
    out = run(LR_RANGE_TEST, session_of(lambda: classifier_setup(lr=1.0)))
    assert 0.3 < out.suggested_ratio < 3


def test_the_suggestion_does_not_depend_on_where_the_sweep_starts():
    low = run(LR_RANGE_TEST, session_of(lambda: classifier_setup(lr=0.01)))
    high = run(LR_RANGE_TEST, session_of(lambda: classifier_setup(lr=1.0)))
    assert 1 / 3 < low.suggested_lr / high.suggested_lr < 3


def test_the_sweep_leaves_weights_and_lr_as_they_were():
    session = session_of(lambda: classifier_setup(lr=0.1))
    before = [p.detach().clone() for p in session.setup.model.parameters()]
    run(LR_RANGE_TEST, session, steps=20)
    assert all(torch.equal(a, b) for a, b in zip(before, session.setup.model.parameters()))
    assert session.setup.optimizer.param_groups[0]["lr"] == 0.1


def test_one_outlying_batch_does_not_end_the_sweep():
    # A spike the LR did not cause (batch 3 scaled x1000) must not read as a divergence at a tiny LR.
    batches = digits(8)
    batches[3] = (batches[3][0] * 1000, batches[3][1])
    out = run(LR_RANGE_TEST, session_of(lambda: classifier_setup(lr=0.01, batches=batches)))
    # Without the median filter the first visit of batch 3 (step 3, at lr 1e-6) ended the sweep.
    assert len(out.lrs) > 30
    assert out.diverged_at_lr is None or out.diverged_at_lr > 0.05
