"""Mixture density network (Bishop 1994) on the inverse-sine problem: a Gaussian mixture over y given x.

Written after tonyduan/mixture-density-network (`mdn/models.py`: a `MixtureDensityNetwork(dim_in, dim_out,
n_components)` made of a `CategoricalNetwork` for the mixing logits and a `MixtureDiagNormalNetwork` for the
means and log standard deviations; `loss = -logsumexp(log_pi + normal.log_prob(y))`; `examples/ex_1d.py`
trains it with Adam on Bishop's toy inverse problem). I read its README, the model file and the numerical-
stability PR #4 (ELU+1 instead of exp for sigma; logits for pi). Here the mixing logits go through
`log_softmax`, the scales through `exp` of the predicted log-sigma (as the original did before that PR).
Mini-batches of `(x, y)` tensors, Adam, a periodic checkpoint every 50 steps in the PyTorch "general
checkpoint" format `{"step", "model_state_dict", "optimizer_state_dict", "loss"}`.

The task is multi-valued: x = y + 0.3 sin(2 pi y) + noise, and y must be predicted from x; a single Gaussian
cannot fit it, a 5-component mixture can. The negative log-likelihood of a continuous density is NOT bounded
below by 0: once the components are narrow and right the loss is negative (the healthy run ends between -1.0 and -1.3).
Healthy runs called faulty because their loss is "impossible" are what this program's healthy run tests.

Runs
- healthy: Adam lr 1e-3, 1000 steps of batch 128; checkpoint at step 400, already below zero and still falling.
- adam_lr_too_high: the owner copied lr=0.05 from a Keras MDN blog post with a different parameterisation.
  With exp(log_sigma), a step that pulls a component's log-sigma far down makes 1/sigma^2 blow up on the
  points that component does not cover: the loss spikes to 20-1e4 again and again, the validation NLL stays
  positive (1 to 10), and in most runs the loss goes to NaN after a few hundred steps (keras-team/keras#2586 "Mixture Density Network quickly gets to nan loss"; keras#1061; tonyduan PR #4).
  Root cause `lr_too_high`: lr x0.1 (`lr_0.005`) trains to a negative NLL with no NaN. Competing fix a user
  tries first: gradient clipping at 1.0 (`clip_grad_1`), which leaves it (Adam's step size does not depend on
  the gradient's scale, so clipping does not shorten the steps that collapse sigma). The checkpoint is the last
  periodic one (every 50 steps) with finite weights before the NaN, or the step-1000 one where the run ends
  unstable without a NaN.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="mixture_density_network",
    kind="probabilistic",
    original="tonyduan/mixture-density-network: mdn/models.py (MixtureDensityNetwork) + examples/ex_1d.py",
    runs={
        "healthy": Run(cause="healthy", story="5-component MDN on Bishop's inverse-sine data, Adam 1e-3; the NLL "
                       "goes below zero (a density, not a probability) and is still falling at the step-400 "
                       "checkpoint."),
        "adam_lr_too_high": Run(
            cause="lr_too_high",
            story="I used lr=0.05 from a blog post; the MDN loss jumps to huge values and then NaN after a couple "
                  "of hundred steps (or it just keeps spiking). Clipping gradients did not help.",
            fix="lr_0.005", competing=("clip_grad_1",)),
    },
)

N_COMP, BS, STEPS, N_TRAIN, N_VAL, CKPT_EVERY = 5, 128, 1000, 6400, 1024, 50


def make_data(seed):
    g = torch.Generator().manual_seed(4100 + seed)
    n = N_TRAIN + N_VAL
    y = torch.rand(n, 1, generator=g)
    x = y + 0.3 * torch.sin(2 * math.pi * y) + 0.04 * torch.randn(n, 1, generator=g)
    x = (x - 0.5) / 0.3
    return (x[:N_TRAIN], y[:N_TRAIN]), (x[N_TRAIN:], y[N_TRAIN:])


class MixtureDensityNetwork(nn.Module):
    def __init__(self, dim_in=1, dim_out=1, n_components=N_COMP, hidden=64):
        super().__init__()
        self.n = n_components
        self.pi_network = nn.Sequential(nn.Linear(dim_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                        nn.Tanh(), nn.Linear(hidden, n_components))
        self.normal_network = nn.Sequential(nn.Linear(dim_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                            nn.Tanh(), nn.Linear(hidden, 2 * n_components * dim_out))

    def forward(self, x):
        log_pi = F.log_softmax(self.pi_network(x), dim=-1)
        mu, log_sigma = self.normal_network(x).chunk(2, dim=-1)
        return log_pi, mu, log_sigma

    def loss(self, x, y):
        log_pi, mu, log_sigma = self(x)
        sigma = torch.exp(log_sigma)
        z = (y - mu) / sigma
        log_prob = -0.5 * z * z - log_sigma - 0.5 * math.log(2 * math.pi)
        return -torch.logsumexp(log_pi + log_prob, dim=-1).mean()


def loss_fn(model, batch):
    x, y = batch
    return model.loss(x, y)


def batches_for_epoch(ds, epoch, seed):
    x, y = ds
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 100 + epoch))
    return [(x[order[i:i + BS]], y[order[i:i + BS]]) for i in range(0, len(x), BS)]


def config(run, variant):
    lr = 1e-3 if run == "healthy" else 0.05
    if variant == "lr_0.005":
        lr = 0.005
    clip = 1.0 if variant == "clip_grad_1" else None
    return lr, clip


def build(run, variant, seed=0):
    torch.manual_seed(seed)
    model = MixtureDensityNetwork()
    lr, clip = config(run, variant)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    return model, opt, clip


@torch.no_grad()
def val_nll(model, ds):
    return float(model.loss(*ds))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_ds, val_ds = make_data(seed)
    model, opt, clip = build(run, variant, seed)
    ckpt = Path(out_dir) / "mdn_checkpoint.pt"
    losses, vals = [], []
    nan_step = None
    step = 0
    epoch = 0
    while step < STEPS and nan_step is None:
        for batch in batches_for_epoch(train_ds, epoch, seed):
            loss = loss_fn(model, batch)
            if not torch.isfinite(loss):
                nan_step = step
                losses.append(float("nan"))
                break
            opt.zero_grad()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            losses.append(loss.item())
            step += 1
            finite = all(torch.isfinite(p).all() for p in model.parameters())
            if step % CKPT_EVERY == 0 and finite and (run != "healthy" or step <= 400):
                torch.save({"step": step, "model_state_dict": model.state_dict(),
                            "optimizer_state_dict": opt.state_dict(), "loss": loss.item()}, ckpt)
            if step % 100 == 0:
                vals.append(val_nll(model, val_ds))
            if step >= STEPS:
                break
        epoch += 1
    final_val = val_nll(model, val_ds) if nan_step is None else float("nan")
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"nan_step": -1 if nan_step is None else nan_step, "val_nll": final_val,
                            "max_loss": max((l for l in losses if l == l), default=float("nan"))})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["nan_step"] >= 0:
        return (f"loss went to NaN at step {int(m['nan_step'])} (largest finite loss before it "
                f"{m['max_loss']:.3g}, first loss {trained.train_losses[0]:.3f})")
    if not m["val_nll"] < 0.0:
        return (f"validation NLL {m['val_nll']:.3f} after {len(trained.train_losses)} steps (never below zero), "
                f"train loss spiked to {m['max_loss']:.3g} from a first loss of {trained.train_losses[0]:.3f}")
    return None


def _setup(run):
    import triage

    train_ds, val_ds = make_data(0)
    model, opt, _ = build(run, None, 0)
    xs, ys = val_ds
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn,
                        batches=batches_for_epoch(train_ds, 0, 0),
                        val_batches=[(xs[i:i + 256], ys[i:i + 256]) for i in range(0, len(xs), 256)],
                        total_steps=STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_adam_lr_too_high():
    return _setup("adam_lr_too_high")
