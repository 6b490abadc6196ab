"""A trunk frozen by mistake, found at the end of a cosine schedule (the fourth round's multitask run: a
fine-tuning notebook's "freeze the backbone" line kept on a randomly initialised encoder). Unfrozen at the
LR the schedule has brought the run down to (1% of its peak), the encoder barely moves in 120 steps, and a
higher LR for the heads alone (x31623) was taken for the cause: lr_too_low. Unfrozen at the schedule's
peak, against the peak LR with the encoder still frozen, the unfreezing is what trains."""

import math

import torch
import torch.nn.functional as F
from torch import nn

import triage

STEPS, LR = 480, 1e-3


def data(seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 6, generator=g)
    mix = torch.randn(6, 20, generator=torch.Generator().manual_seed(99)) / math.sqrt(6)
    x = torch.tanh(z @ mix) + 0.1 * torch.randn(n, 20, generator=g)
    f = torch.stack([torch.sin(2 * z[:, 0]) + z[:, 1] * z[:, 2], z[:, 3] ** 2 - 1 + torch.cos(2 * z[:, 4]),
                     z[:, 5].abs() - z[:, 0] * z[:, 4]], 1)
    segment = (f @ torch.randn(3, 4, generator=torch.Generator().manual_seed(98)) * 1.5).argmax(1)
    spend = f[:, 0] * 0.8 - f[:, 1] * 0.6 + 0.5 * f[:, 2] * f[:, 0]
    return [{"features": x[i:i + 64], "segment": segment[i:i + 64], "spend": spend[i:i + 64]}
            for i in range(0, n, 64)]


class Heads(nn.Module):
    """A shared encoder and a head per task (hard parameter sharing)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                     nn.Linear(256, 64), nn.ReLU())
        self.decoders = nn.ModuleDict({"segment": nn.Linear(64, 4), "spend": nn.Linear(64, 1)})

    def forward(self, x):
        h = self.encoder(x)
        return {task: head(h) for task, head in self.decoders.items()}


def loss_fn(model, batch):
    out = model(batch["features"])
    return F.cross_entropy(out["segment"], batch["segment"]) + 0.5 * F.mse_loss(out["spend"].squeeze(-1),
                                                                                 batch["spend"])


def setup():
    torch.manual_seed(0)
    model = Heads()
    for q in model.encoder.parameters():  # "freeze the backbone, train the heads": the backbone is random
        q.requires_grad_(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS, eta_min=LR * 0.01)
    return triage.Setup(model=model, optimizer=optimizer, scheduler=scheduler, total_steps=STEPS, loss_fn=loss_fn,
                        batches=data(0, 3072), val_batches=data(1, 1024))


def test_a_trunk_frozen_by_mistake_late_in_a_cosine_schedule_is_frozen_parameters(tmp_path):
    run = setup()
    for step in range(STEPS):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
        run.scheduler.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, scheduler=run.scheduler,
                                        step=STEPS)
    report, _ = triage.run(setup, checkpoint, out=tmp_path / "report")
    assert report.root_cause == "frozen_parameters"
    assert report.proof == "unfreeze_at_peak"
    at_peak, frozen = report.experiment("unfreeze_at_peak").outcome, report.experiment("peak_lr_frozen").outcome
    assert at_peak["loss_end"] < 0.8 * frozen["loss_end"]
