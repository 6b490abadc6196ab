"""Gradient per loss term where the run names no auxiliary term (the eighth round's miss): a VQ-VAE returns
{"recon_error", "vq_loss"}. Without the straight-through estimator (`x + (q - x).detach()`), the quantized
codes carry no gradient back, and the encoder is trained by the commitment term alone while the
reconstruction reads it through the nearest-code choice; the reconstruction stalls at the data's variance.
It was called healthy (low): no weight is without gradient, and its loss has no level. Each term read in
turn as the auxiliary one, the one that alone trains a fifth of the weights or more, which the others read,
is the fault; the codebook, trained by its own term alone by design, is not."""

import torch
import torch.nn.functional as F
from torch import nn

import triage

CODES, DIM = 32, 8


class VQVAE(nn.Module):
    def __init__(self, straight_through: bool, codes: int = CODES):
        super().__init__()
        self.straight_through = straight_through
        self.encoder = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, DIM),
                                     nn.Tanh())
        self.codebook = nn.Embedding(codes, DIM)
        nn.init.uniform_(self.codebook.weight, -1 / codes, 1 / codes)  # as the original
        self.decoder = nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, 64))

    def forward(self, x):
        z = self.encoder(x)
        q = self.codebook(torch.cdist(z, self.codebook.weight).argmin(1))
        vq_loss = F.mse_loss(q, z.detach()) + 0.25 * F.mse_loss(z, q.detach())  # codebook + commitment
        if self.straight_through:
            q = z + (q - z).detach()
        return vq_loss, self.decoder(q)


def loss_fn(model, batch):
    vq_loss, recon = model(batch)
    return {"recon_error": F.mse_loss(recon, batch) / batch.var(), "vq_loss": vq_loss}


def images(seed: int, n: int):
    """64-pixel "images": a few smooth patterns mixed at random, plus noise, of about unit scale."""
    patterns = torch.randn(6, 64, generator=torch.Generator().manual_seed(5)).cumsum(1) / 4
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g) @ patterns + 0.1 * torch.randn(n, 64, generator=g)
    return x / 2.28


def factory(straight_through: bool, codes: int = CODES):
    def setup():
        torch.manual_seed(0)
        model = VQVAE(straight_through, codes)
        x, vx = images(0, 4096), images(1, 512)
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=loss_fn,
                            batches=[x[i:i + 128] for i in range(0, 4096, 128)],
                            val_batches=[vx[i:i + 128] for i in range(0, 512, 128)])
    return setup


def triaged(straight_through: bool, tmp_path):
    setup = factory(straight_through)
    run = setup()
    for step in range(300):
        run.optimizer.zero_grad()
        terms = run.loss_fn(run.model, run.batches[step % len(run.batches)])
        (terms["recon_error"] + terms["vq_loss"]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=300)
    return triage.run(setup, checkpoint, out=tmp_path / "report")[0]


def test_a_quantizer_without_the_straight_through_estimator_is_no_gradient_flow(tmp_path):
    report = triaged(straight_through=False, tmp_path=tmp_path)
    assert (report.root_cause, report.confidence) == ("no_gradient_flow", "medium")
    flow = report.experiment("flow").outcome
    assert flow["auxiliary_terms"] == ["vq_loss"] and not flow["auxiliary_declared"]
    assert {"encoder.0.weight", "encoder.4.weight"} <= set(flow["objective_missed"])


def test_the_same_quantizer_with_it_has_no_gradient_fault(tmp_path):
    """With the estimator, the codebook alone is trained by its own term (by design, under 1% of the weights):
    no gradient fault. (This small replica at its LR is then called lr_too_low: a x10 LR trains it faster.)"""
    report = triaged(straight_through=True, tmp_path=tmp_path)
    assert report.root_cause != "no_gradient_flow" and "no_gradient_flow_objective" not in report.path
    flow = report.experiment("flow").outcome
    assert flow["objective_missed"] == ["codebook.weight"] and flow["objective_missed_fraction"] < 0.01


def test_a_gans_terms_under_two_optimizers_are_each_its_own_networks_objective():
    """A GAN returning {"critic", "generator"}: the generator term alone trains the generator, which the critic
    term reads through a detached sample, by design (the eighth round's first re-walk called a healthy WGAN-GP
    no_gradient_flow before several optimizers were left out)."""
    from tests._gan_tiny import gan_losses, gan_setup
    from tests._instrument_runs import run as run_experiment, session_of
    from triage.experiments.gradient_flow import GRADIENT_FLOW

    def setup():
        made = gan_setup(lr=2e-4)
        return made.model_copy(update={"loss_fn": lambda m, b: dict(zip(("critic", "generator"), gan_losses(m, b[0])))})

    flow = run_experiment(GRADIENT_FLOW, session_of(setup))
    assert flow.auxiliary_terms == [] and flow.objective_missed == []


def flow_of(setup):
    from tests._instrument_runs import run as run_experiment, session_of
    from triage.experiments.gradient_flow import GRADIENT_FLOW

    return run_experiment(GRADIENT_FLOW, session_of(setup))


def objective_misses(flow) -> bool:
    from triage.walk.playbook.conditions import parse_condition

    return parse_condition("objective_misses(f)").value(lambda node, field: getattr(flow, field))


def test_a_codebook_larger_than_the_encoder_is_no_fault_with_the_estimator():
    """8192 codes: the codebook is most of the weights, trained by its own term alone and read by the
    reconstruction through the nearest-code choice, by design: the reconstruction's gradient still reaches the
    encoder's first layer (review, helper-27)."""
    flow = flow_of(factory(straight_through=True, codes=8192))
    assert flow.objective_missed in ([], ["codebook.weight"]) and objective_misses(flow) is False


def test_an_actor_critics_critic_read_through_a_detached_advantage_is_no_fault():
    """One optimizer, {"policy", "value", "entropy"}: the critic is trained by the value term alone and the
    policy term reads it through the detached advantage, by design (review, helper-27)."""
    class ActorCritic(nn.Module):
        def __init__(self):
            super().__init__()
            self.actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
            self.critic = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 1))

        def forward(self, states):
            return self.actor(states), self.critic(states).squeeze(-1)

    def loss_fn(model, batch):
        states, actions, returns = batch
        logits, values = model(states)
        dist = torch.distributions.Categorical(logits=logits)
        advantage = returns - values.detach()
        return {"policy": -(dist.log_prob(actions) * advantage).mean(), "value": F.mse_loss(values, returns),
                "entropy": -0.01 * dist.entropy().mean()}

    def setup():
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        model = ActorCritic()
        batches = [(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g),
                    torch.randn(64, generator=g)) for _ in range(8)]
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=7e-4), loss_fn=loss_fn,
                            batches=batches)

    flow = flow_of(setup)
    assert flow.objective_reaches_input is True and objective_misses(flow) is False
