"""A regressor's kNN target check on sets padded each batch to its own largest set (the ninth round's
DeepSets, batches bucketed by set size): the flattened examples differ in width from batch to batch, and the
check raised (the label checks were lost). The examples of the width most of them share are read."""

import torch
from torch import nn

import triage
from tests._instrument_runs import run as run_experiment, session_of
from triage.experiments.labels import LABEL_CHECK


def padded_sets(aligned: bool):
    """Sets of 2-6 "digits" (a one-hot of 10 with noise), the target their digit sum; each batch holds sets of
    one size (bucketed), padded with zeros to it."""
    g = torch.Generator().manual_seed(0)
    batches = []
    for b in range(40):
        size = 2 + b % 5
        digits = torch.randint(0, 10, (32, size), generator=g)
        x = torch.nn.functional.one_hot(digits, 10).float() + 0.1 * torch.randn(32, size, 10, generator=g)
        y = digits.sum(1).float()
        if not aligned:
            y = y[torch.randperm(32, generator=g)]
        batches.append((x, y))
    return batches


class DeepSets(nn.Module):
    def __init__(self):
        super().__init__()
        self.phi, self.rho = nn.Sequential(nn.Linear(10, 32), nn.ReLU()), nn.Linear(32, 1)

    def forward(self, x):
        return self.rho(self.phi(x).sum(1)).squeeze(-1)


def correlation(aligned: bool):
    def setup():
        torch.manual_seed(0)
        model = DeepSets()
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3),
                            loss_fn=lambda m, b: (m(b[0]) - b[1]).abs().mean(), batches=padded_sets(aligned))
    return run_experiment(LABEL_CHECK, session_of(setup)).knn_target_correlation


def test_sets_padded_per_batch_are_read_by_their_most_common_width():
    assert correlation(aligned=True) > 0.3 and abs(correlation(aligned=False)) < 0.1
