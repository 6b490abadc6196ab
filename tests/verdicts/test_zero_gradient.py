"""A latent rounded in training (the twelfth round's learned image compression, whose author rounded the latent
where training adds uniform noise): torch.round's gradient is zero everywhere, so the encoder gets a gradient of
exactly zero, never None, and only the decoder trains; the loss stalls. The gradient check read `.grad is None`
alone, and no candidate fix trains: the run went to healthy (low). Half of the trainable weights with a
gradient of exactly zero on each of 8 batches, and no dead units to explain it, is a measured cause."""

import torch
from torch import nn

import triage
from tests._instrument_runs import digits


class RoundedAutoencoder(nn.Module):
    def __init__(self, noise: bool):
        super().__init__()
        self.noise = noise
        self.encoder = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64))

    def forward(self, x):
        y = self.encoder(x / 16)
        y = y + torch.empty_like(y).uniform_(-0.5, 0.5) if self.noise else torch.round(y)
        return self.decoder(y)


def reconstruction(model, batch):
    x, _ = batch
    return ((model(x) - x / 16) ** 2).mean()


def triaged(tmp_path, noise: bool):
    def setup() -> triage.Setup:
        torch.manual_seed(0)
        model = RoundedAutoencoder(noise)
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                            loss_fn=reconstruction, batches=digits(16, 64))

    run = setup()
    for step in range(400):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=400)
    return triage.run(setup, checkpoint, out=tmp_path / "report")[0]


def test_weights_behind_a_rounding_get_exactly_zero_gradient_and_that_is_the_cause(tmp_path):
    report = triaged(tmp_path, noise=False)
    zeroed = report.experiment("zeroed_after_all").outcome  # the gradient over 8 batches
    assert zeroed["no_grad_fraction"] == 0 and set(zeroed["zero_grad"]) >= {
        "encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias"}
    assert (report.root_cause, report.confidence) == ("no_gradient_flow", "medium"), report.path


def test_the_same_model_trained_through_uniform_noise_is_not(tmp_path):
    report = triaged(tmp_path, noise=True)
    assert report.experiment("flow").outcome["zero_grad"] == []
    assert report.root_cause != "no_gradient_flow"
