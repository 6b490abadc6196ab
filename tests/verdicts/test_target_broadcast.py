"""A loss handed a prediction (B, 1) and a target (B,) (held-back gaussian_nll_regression): GaussianNLLLoss
broadcasts them to (B, B) without a word, every prediction is scored against every target of the batch, the
model learns the batch's spread and its loss still falls. It was called healthy."""

import torch
from torch import nn

import triage
from tests._instrument_runs import stock_checkpoint


def regression(view_target: bool):
    def setup():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1280, 8, generator=g)
        y = x @ torch.randn(8, generator=g) + 0.1 * torch.randn(1280, generator=g)  # (N,): the dataset's shape
        torch.manual_seed(0)
        body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        nll = nn.GaussianNLLLoss()

        def loss_fn(model, batch):
            inputs, target = batch
            out = model(inputs)
            mean, var = out[:, :1], nn.functional.softplus(out[:, 1:]) + 1e-3
            return nll(mean, target.view(-1, 1) if view_target else target, var)

        return triage.Setup(model=body, optimizer=torch.optim.Adam(body.parameters(), lr=1e-3), loss_fn=loss_fn,
                            batches=[(x[i:i + 32], y[i:i + 32]) for i in range(0, 1024, 32)],
                            val_batches=[(x[i:i + 32], y[i:i + 32]) for i in range(1024, 1280, 32)])
    return setup


def test_a_target_that_broadcasts_against_its_prediction_is_a_wrong_loss(tmp_path):
    path, _ = stock_checkpoint(tmp_path, regression(view_target=False), 200)
    report, _ = triage.run(regression(view_target=False), path, out=tmp_path / "report")
    assert (report.root_cause, report.path[-1]) == ("wrong_loss", "wrong_loss_broadcast")
    assert "gaussian_nll_loss: input (32, 1) against target (32,), broadcast to (32, 32)" in report.fix


def test_the_same_loss_with_the_target_in_the_predictions_shape_is_not(tmp_path):
    path, _ = stock_checkpoint(tmp_path, regression(view_target=True), 200)
    report, _ = triage.run(regression(view_target=True), path, out=tmp_path / "report")
    assert report.root_cause != "wrong_loss"
    assert report.experiment("labels").outcome["target_broadcast"] is None


def test_only_a_trailing_one_against_its_absence_counts_not_a_pairwise_loss_written_on_purpose():
    from triage.experiments.loss_inputs import paired_losses

    x, centres, y = torch.randn(8, 4), torch.randn(3, 4), torch.randn(8)
    with paired_losses() as found:
        nn.functional.mse_loss(x[:, None], centres[None].expand(8, 3, 4))  # same shapes: nothing to say
        nn.functional.mse_loss(x[:, None, :], centres[None, :, :])  # every example against every centre, on purpose
        nn.functional.mse_loss(y[:, None], y)  # (8, 1) against (8,): every prediction against every target
    assert found == ["mse_loss: input (8, 1) against target (8,), broadcast to (8, 8)"]
