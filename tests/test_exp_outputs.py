"""output_check: what the model outputs — scores, probabilities or log-probabilities."""

import math

from torch import nn

from tests._instrument_runs import classifier_setup, mlp, run, session_of
from triage.experiments.outputs import OUTPUT_CHECK


def _outcome(model):
    return run(OUTPUT_CHECK, session_of(lambda: classifier_setup(model=model)))


def test_a_softmax_head_outputs_probabilities_and_its_loss_sits_on_the_floor():
    out = _outcome(nn.Sequential(mlp(), nn.Softmax(dim=-1)))
    assert out.looks_like_probabilities and not out.looks_like_log_probabilities
    assert 0 <= out.output_min and out.output_max <= 1
    assert math.isclose(out.probability_ce_floor, math.log(math.e + 9) - 1)
    # cross_entropy on probabilities is stuck near ln(K), far above what logits could reach
    assert out.loss_floor_ratio > 1.4


def test_raw_logits_are_neither():
    out = _outcome(mlp())
    assert out.has_output and out.output_dim == 10
    assert not out.looks_like_probabilities and not out.looks_like_log_probabilities


def test_a_log_softmax_head_outputs_log_probabilities():
    out = _outcome(nn.Sequential(mlp(), nn.LogSoftmax(dim=-1)))
    assert out.looks_like_log_probabilities and not out.looks_like_probabilities
    assert out.output_max <= 0
