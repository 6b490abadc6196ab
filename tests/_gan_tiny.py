"""A tiny GAN on 2-D Gaussian data: two networks, two Adam optimizers, the run's own alternating step."""

import torch
from torch import nn
import triage

def real_batches(n=8, size=64):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(size, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0]),) for _ in range(n)]

bce = nn.functional.binary_cross_entropy_with_logits

def gan_losses(model, real):
    z = torch.randn(real.shape[0], 4)
    fake = model["G"](z)
    d_real, d_fake = model["D"](real), model["D"](fake.detach())
    d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
    g_out = model["D"](fake)
    g_loss = bce(g_out, torch.ones_like(g_out))
    return d_loss, g_loss

def gan_step(model, optimizers, batch):
    model.train()
    (real,) = batch
    d_loss, _ = gan_losses(model, real)
    optimizers["D"].zero_grad(); d_loss.backward(); optimizers["D"].step()
    _, g_loss = gan_losses(model, real)
    optimizers["G"].zero_grad(); g_loss.backward(); optimizers["G"].step()
    return d_loss.detach() + g_loss.detach()

def gan_loss(model, batch):  # both networks' losses: every parameter gets a gradient from it
    d_loss, g_loss = gan_losses(model, batch[0])
    return d_loss + g_loss

def gan_setup(lr=2e-4 * 1e4, lr_d=None):
    torch.manual_seed(0)
    model = nn.ModuleDict({"G": nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)),
                           "D": nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))})
    lrs = {"G": lr, "D": lr if lr_d is None else lr_d}
    optimizers = {name: torch.optim.Adam(model[name].parameters(), lr=lrs[name], betas=(0.5, 0.999))
                  for name in ("G", "D")}
    return triage.Setup(model=model, optimizers=optimizers, loss_fn=gan_loss, train_step=gan_step,
                        batches=real_batches())
