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


def _binary_setup(head: nn.Module, loss):
    import torch

    import triage

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = (x[:, :3] > 0).float()  # three independent yes/no targets
    trained = nn.Sequential(nn.Linear(8, 3), head)
    with torch.no_grad():  # a model that already separates them well
        trained[0].weight.zero_()
        trained[0].weight[:, :3] = 8 * torch.eye(3)
        trained[0].bias.zero_()
    batches = [(x[i:i + 64], y[i:i + 64]) for i in range(0, 256, 64)]
    return lambda: triage.Setup(model=trained, optimizer=torch.optim.SGD(trained.parameters(), lr=0.1),
                                loss_fn=lambda m, b: loss(m(b[0]), b[1]), batches=batches)


def test_sigmoid_outputs_into_a_loss_that_applies_sigmoid_again_are_caught():
    out = run(OUTPUT_CHECK, session_of(_binary_setup(nn.Sigmoid(), nn.functional.binary_cross_entropy_with_logits)))
    assert out.squashed and not out.looks_like_probabilities
    assert out.unsquash_ratio < 0.5


def test_sigmoid_outputs_into_bce_are_left_alone():
    out = run(OUTPUT_CHECK, session_of(_binary_setup(nn.Sigmoid(), nn.functional.binary_cross_entropy)))
    assert out.squashed and out.unsquash_ratio is None  # BCE refuses scores: it wanted probabilities
