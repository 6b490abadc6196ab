"""A Fourier-feature MLP at too high a frequency scale (the twelfth round's coordinate MLP: scale 20 on a 32x32
sampling): it fits its training points exactly and predicts the points between them worse than their mean
would. Memorised before the checkpoint, its validation does not rise over a replay's 40 steps, and it went to
healthy. Training far under the loss of learning nothing, validation above it (scored on the validation points)
and targets that follow their inputs: it overfits."""

import math

import torch
from torch import nn

import triage

POINTS = 32


class FourierFeatures(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.register_buffer("B", torch.randn(1, 64, generator=torch.Generator().manual_seed(1)) * scale)
        self.net = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, x):
        z = 2 * math.pi * x @ self.B
        return self.net(torch.cat([z.sin(), z.cos()], 1))


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def triaged(tmp_path, scale: float):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2 * POINTS, 1, generator=g)
    y = torch.sin(2 * math.pi * x) + 0.1 * torch.randn(2 * POINTS, 1, generator=g)
    train = [(x[i:i + 8], y[i:i + 8]) for i in range(0, POINTS, 8)]
    val = [(x[i:i + 8], y[i:i + 8]) for i in range(POINTS, 2 * POINTS, 8)]

    def setup() -> triage.Setup:
        torch.manual_seed(0)
        model = FourierFeatures(scale)
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=mse,
                            batches=train * 10, val_batches=val)

    run = setup()
    for step in range(2000):
        run.optimizer.zero_grad()
        mse(run.model, train[step % len(train)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=2000)
    return triage.run(setup, checkpoint, out=tmp_path / "report")[0]


def test_a_model_that_predicts_held_out_points_worse_than_a_constant_overfits(tmp_path):
    report = triaged(tmp_path, scale=100.0)
    val_check = report.experiment("val_check").outcome
    assert val_check["level_ratio"] < 0.01 and val_check["val_start"] > val_check["val_nothing_level"]
    assert (report.root_cause, report.path[-1]) == ("overfitting", "overfitting_at_checkpoint"), report.path


def test_the_same_model_at_a_scale_the_sampling_supports_is_healthy(tmp_path):
    report = triaged(tmp_path, scale=1.0)
    assert report.root_cause == "healthy", report.path
