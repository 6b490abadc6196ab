"""Levels of an output with several columns per target (issue 33, class 8: a floor only where measured).
A quantile forecaster predicts three quantiles of each step: the target in every column is a perfect
prediction where its pinball loss scores it 0, so a loss that goes under 0 has a wrong sign. A
mean-and-variance head's Gaussian NLL does not score "the target in both columns" 0: no floor is claimed."""

import torch
from torch import nn

import triage
from triage.experiments.levels import loss_levels
from triage.load.session import session_from_factory

QUANTILES = (0.1, 0.5, 0.9)


def pinball(pred, target, typo=False):
    losses = []
    for i, q in enumerate(QUANTILES):
        e = target - pred[..., i]
        # the typo: (1 - q) for (q - 1); above the target a forecast then costs a negative amount
        losses.append(torch.max((1 - q) * e, q * e) if typo else torch.max((q - 1) * e, q * e))
    return torch.stack(losses, -1).mean()


def forecasts(n=8, steps=6):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        x = torch.randn(32, 16, generator=g)
        y = x[:, :steps] * 0.5 + 0.2 * torch.randn(32, steps, generator=g)
        out.append((x, y))
    return out


class QuantileHead(nn.Module):
    def __init__(self, steps=6):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, steps * len(QUANTILES)))
        self.steps = steps

    def forward(self, x):
        return self.net(x).reshape(x.shape[0], self.steps, len(QUANTILES))


def quantile_setup(typo=False):
    torch.manual_seed(0)
    model = QuantileHead()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=lambda m, b: pinball(m(b[0]), b[1], typo), batches=forecasts())


def test_a_pinball_loss_on_three_quantiles_has_its_floor_measured_at_zero():
    levels = loss_levels(session_from_factory(quantile_setup))
    assert levels.kind == "regression" and levels.floor == 0.0 and levels.constant > 0.1


def test_the_stock_typo_goes_below_zero_and_is_called_a_wrong_loss(tmp_path):
    s = quantile_setup(typo=True)
    for step in range(200):
        s.optimizer.zero_grad()
        loss = s.loss_fn(s.model, s.batches[step % 8])
        loss.backward()
        s.optimizer.step()
    assert loss.item() < 0  # a pinball loss never is
    report, _ = triage.run(lambda: quantile_setup(typo=True), None, out=tmp_path / "typo")
    assert (report.root_cause, report.path[-1]) == ("wrong_loss", "wrong_loss_below_floor")
    report, _ = triage.run(quantile_setup, None, out=tmp_path / "fixed")
    assert report.root_cause != "wrong_loss"


def test_a_mean_and_variance_head_gets_no_floor_from_the_target_in_both_columns():
    def gaussian_setup():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

        def nll(m, b):
            out = m(b[0])
            return nn.functional.gaussian_nll_loss(out[:, 0], b[1][:, 0], out[:, 1].exp())
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters()), loss_fn=nll,
                            batches=[(x, y[:, :1]) for x, y in forecasts()])

    levels = loss_levels(session_from_factory(gaussian_setup))
    assert levels.floor is None
