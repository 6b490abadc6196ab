"""Learned image compression trained for rate-distortion (a Balle-style factorized-prior autoencoder): an analysis
transform with GDN, a quantised latent whose bits are counted under a learned entropy model, a synthesis transform
with inverse GDN, and the loss lambda * 255^2 * MSE + bits per pixel.

Written after InterDigitalInc/CompressAI. I read `examples/train.py` (read through the `search` tool, code corpus):
`RateDistortionLoss` (`bpp_loss = sum(log(likelihoods).sum() / (-log(2) * num_pixels))` over
`output["likelihoods"]`, `mse_loss = MSELoss(x_hat, target)`, `loss = lmbda * 255**2 * mse_loss + bpp_loss`),
`train_one_epoch` (zero_grad, `out_net = model(d)`, `criterion(out_net, d)["loss"].backward()`,
`clip_grad_norm_(model.parameters(), clip_max_norm)` with `--clip_max_norm 1.0` by default, `optimizer.step()`,
then the auxiliary optimizer of the EntropyBottleneck's quantiles), `test_epoch`, a
`ReduceLROnPlateau(optimizer, "min")` stepped once an epoch on the test loss, and `save_checkpoint` of
`{"epoch", "state_dict", "loss", "optimizer", "aux_optimizer", "lr_scheduler"}` to `checkpoint.pth.tar` every
epoch; and the way CompressAI's `GaussianConditional._likelihood` computes a likelihood of a noisy latent: the
symmetric form `upper = Phi((0.5 - |v|) / s)`, `lower = Phi((-0.5 - |v|) / s)` with `Phi(x) = 0.5 * erfc(-x / sqrt 2)`,
a `LowerBound(0.11)` on the scales and a `LowerBound(1e-9)` on the likelihood; the latent is `y + U(-0.5, 0.5)`
in training ("noise" mode) and `round(y)` at test time.
Here: sklearn's digits upsampled to 16x16 grey images (1500 train / 297 test), batch 16, an analysis transform
conv5x5/2 -> GDN -> conv5x5/2 (32 then 16 channels, a 4x4x16 latent), the mirror synthesis transform with
transposed convolutions and IGDN, and a fully factorized zero-mean Gaussian prior with one learned scale per latent
channel (a small own entropy model, so no quantiles and no auxiliary optimizer); Adam lr 1e-3 (CompressAI's
default is 1e-4 for far longer runs), lambda 0.01, clip 1.0, ReduceLROnPlateau on the test loss.

The loss never gets near 0: it is a rate (bits) plus a weighted distortion, and the two trade against each other:
the healthy run's test loss falls from ~4.9 (epoch 1) to ~3.1 (epoch 4) and keeps falling (~1.9 by epoch 12; test
PSNR 27 dB at 1.8 bpp at epoch 4, 29 dB at 1.1 bpp at epoch 12); the training loss of the first steps is ~70.

Runs
- healthy: as above; the checkpoint is the epoch-4 `checkpoint.pth.tar` (of 12), while it still improves.
- plateau_step_per_batch: the owner rewrote the loop to count iterations (as video/compression trainers built on
  CompressAI often do) and moved `lr_scheduler.step(...)` into the batch loop, feeding it each batch's training loss.
  `ReduceLROnPlateau(optimizer, "min")` (patience 10, factor 0.1) then counts *batches* without a new best loss:
  as soon as the per-batch loss is noisier than its progress (during epoch 2), every 11 batches cut the LR by 10x,
  and it is ~1e-8 by the end of epoch 2: the test loss freezes at ~3.7 (PSNR ~25 dB at 1.8 bpp) from epoch 3 to
  12, where the per-epoch scheduler reaches ~1.9. The same confusion on public trackers: pytorch/pytorch#2850
  (ReduceLROnPlateau is to be stepped after `validate()`, once an epoch, unlike the other schedulers),
  abhishekkrthakur/wtfml#7 (a scheduler called every batch; "using ReduceLROnPlateau which requires I pass a metric
  in step"), Lightning-AI/pytorch-lightning#1156 (ReduceLROnPlateau with `interval: "step"` stepped each batch).
  Root cause `lr_schedule_decayed`: the LR at the checkpoint (epoch 12) is ~1e-8 against its 1e-3 peak; stepping the
  scheduler once an epoch on the test loss, as `examples/train.py` does (`step_per_epoch`), trains. Competing fix a
  user tries first on a stalled loss: a 10x higher LR (`lr_1e-2`), which the scheduler cuts down just the same (its
  test loss freezes at ~2.8 from epoch 2 on).
- round_in_training: the owner quantises the latent with `torch.round(y)` in training as well as at test time
  ("the decoder should see what it will see at test time"). `round` has a zero derivative everywhere, so the
  analysis transform receives an all-zero gradient and never trains (its weights do not move at all); its random
  latents mostly round to 0, and the decoder can do no better than a blurry average digit: test PSNR ~11-12 dB
  at ~0.3 bpp after 12 epochs (healthy: 27 dB after 4). The same question on public trackers:
  Justin-Tan/generative-compression#51 ("tf.round is a non-differentiable operation, which will prevent the
  gradients from being backpropagated to the encoder part, resulting in the encoder parameters not being updated"),
  InterDigitalInc/CompressAI#3 (additive uniform noise "is used during training to make the bottlenecks
  differentiable"). Root cause `no_gradient_flow`: the encoder's parameters get no gradient (exactly zero); the
  additive uniform noise of CompressAI's "noise" mode (`uniform_noise`) trains. Competing fixes: a 10x higher LR
  (`lr_1e-2`) and a 10x larger lambda (`lmbda_0.1`, "weight distortion more"), neither of which gives the encoder a
  gradient.

Triage setup: the model, Adam, `loss_fn` = the RD loss's "loss" on an image batch, 48 training batches of the epoch
after the checkpoint, the test batches as `val_batches`, `grad_clip=1.0`, and the ReduceLROnPlateau with the interval
the run steps it at (`"epoch"`; `"step"` for plateau_step_per_batch).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
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
    name="learned_image_compression",
    kind="learned image compression (rate-distortion)",
    original="InterDigitalInc/CompressAI: examples/train.py (RateDistortionLoss, train_one_epoch, save_checkpoint) + "
             "compressai/entropy_models GaussianConditional._likelihood",
    runs={
        "healthy": Run(cause="healthy", story="Factorized-prior codec on 16x16 digits; test loss (lambda*255^2*MSE + "
                       "bpp) 4.9 -> 3.1 over 4 epochs and still falling, test PSNR 27 dB at 1.8 bpp; checkpoint "
                       "after epoch 4 of 12."),
        "plateau_step_per_batch": Run(
            cause="lr_schedule_decayed",
            story="The loss dropped for the first epoch or two, then froze: the test loss has not moved for 10 "
                  "epochs (PSNR 25 dB, the example reaches 29). A 10x higher LR did not help.",
            fix="step_per_epoch", competing=("lr_1e-2",)),
        "round_in_training": Run(
            cause="no_gradient_flow",
            story="The rate goes to ~0.3 bpp but the reconstructions stay a blurry average digit (test PSNR ~11 dB). "
                  "A higher LR and a larger lambda changed nothing.",
            fix="uniform_noise", competing=("lr_1e-2", "lmbda_0.1")),
    },
)

N, M, BS, TEST_BS = 32, 16, 16, 64
EPOCHS = 12
LR, LMBDA, CLIP = 1e-3, 0.01, 1.0
CKPT_EPOCH = {"healthy": 4}           # the faults: the last epoch before the symptom, or the end of the run


def make_data(seed: int):
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False).clamp(0, 1)
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(x)))
    return x[perm[:1500]], x[perm[1500:]]


def train_loader(train_x, seed: int, epoch: int):
    """DataLoader(shuffle=True, batch_size=16): a fresh order each epoch; a batch is an image tensor."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(train_x), generator=g)
    return [train_x[order[i:i + BS]] for i in range(0, len(train_x) - BS + 1, BS)]


def test_loader(test_x):
    return [test_x[i:i + TEST_BS] for i in range(0, len(test_x), TEST_BS)]


class GDN(nn.Module):
    """Generalized divisive normalization (Balle et al.): x / sqrt(beta + gamma * x^2); inverse: times."""

    def __init__(self, ch: int, inverse: bool = False):
        super().__init__()
        self.inverse = inverse
        self.beta = nn.Parameter(torch.ones(ch))
        self.gamma = nn.Parameter(0.1 * torch.eye(ch))

    def forward(self, x):
        beta = self.beta.clamp(min=1e-6)
        gamma = self.gamma.clamp(min=0.0)
        norm = torch.sqrt(F.conv2d(x * x, gamma[:, :, None, None], beta))
        return x * norm if self.inverse else x / norm


class LowerBound(torch.autograd.Function):
    """CompressAI's ops.LowerBound: max(x, bound), letting gradients through that push x up."""

    @staticmethod
    def forward(ctx, x, bound: float):
        ctx.save_for_backward(x)
        ctx.bound = bound
        return x.clamp(min=bound)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        pass_through = (x >= ctx.bound) | (grad < 0)
        return pass_through.type(grad.dtype) * grad, None


class FactorizedGaussian(nn.Module):
    """A zero-mean Gaussian per latent channel with a learned scale; returns the (noisy/rounded) latent and its
    likelihoods."""

    def __init__(self, ch: int, quant: str):
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(ch))
        self.quant = quant

    def quantize(self, y):
        if self.training and self.quant == "noise":
            return y + torch.empty_like(y).uniform_(-0.5, 0.5)
        return torch.round(y)

    def likelihood(self, y_hat):
        """CompressAI's GaussianConditional._likelihood (zero mean): the symmetric erfc form, both lower bounds."""
        scale = LowerBound.apply(self.log_scale.exp()[None, :, None, None], 0.11)
        values = y_hat.abs()
        upper = 0.5 * torch.erfc(-(0.5 - values) / scale / math.sqrt(2.0))
        lower = 0.5 * torch.erfc(-(-0.5 - values) / scale / math.sqrt(2.0))
        return LowerBound.apply(upper - lower, 1e-9)

    def forward(self, y):
        y_hat = self.quantize(y)
        return y_hat, self.likelihood(y_hat)


class FactorizedPrior(nn.Module):
    def __init__(self, quant: str = "noise"):
        super().__init__()
        self.g_a = nn.Sequential(nn.Conv2d(1, N, 5, 2, 2), GDN(N), nn.Conv2d(N, M, 5, 2, 2))
        self.g_s = nn.Sequential(nn.ConvTranspose2d(M, N, 5, 2, 2, output_padding=1), GDN(N, inverse=True),
                                 nn.ConvTranspose2d(N, 1, 5, 2, 2, output_padding=1))
        self.entropy = FactorizedGaussian(M, quant)

    def forward(self, x):
        y = self.g_a(x)
        y_hat, y_likelihoods = self.entropy(y)
        return {"x_hat": self.g_s(y_hat), "likelihoods": {"y": y_likelihoods}}


class RateDistortionLoss(nn.Module):
    def __init__(self, lmbda: float):
        super().__init__()
        self.mse = nn.MSELoss()
        self.lmbda = lmbda

    def forward(self, output, target):
        n, _, h, w = target.size()
        out = {"bpp_loss": sum(torch.log(lk).sum() / (-math.log(2) * n * h * w)
                               for lk in output["likelihoods"].values()),
               "mse_loss": self.mse(output["x_hat"], target)}
        out["loss"] = self.lmbda * 255 ** 2 * out["mse_loss"] + out["bpp_loss"]
        return out


def config(run: str, variant: str | None):
    per_batch = run == "plateau_step_per_batch" and variant != "step_per_epoch"
    quant = "round" if run == "round_in_training" and variant != "uniform_noise" else "noise"
    lr = {"lr_1e-4": 1e-4, "lr_1e-2": 1e-2}.get(variant, LR)
    lmbda = 0.1 if variant == "lmbda_0.1" else LMBDA
    clip = 0.1 if variant == "clip_0.1" else CLIP
    return per_batch, quant, lr, lmbda, clip


def build(run: str, seed: int, variant: str | None):
    per_batch, quant, lr, lmbda, clip = config(run, variant)
    torch.manual_seed(seed)
    net = FactorizedPrior(quant)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    lr_scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "min")
    return net, optimizer, lr_scheduler, RateDistortionLoss(lmbda), clip, per_batch


def make_loss_fn(criterion):
    def loss_fn(model, batch):
        return criterion(model(batch), batch)["loss"]

    return loss_fn


@torch.no_grad()
def test_epoch(model, criterion, batches):
    model.eval()
    loss = mse = bpp = 0.0
    n = 0
    for d in batches:
        out = criterion(model(d), d)
        k = len(d)
        loss, mse, bpp, n = loss + k * float(out["loss"]), mse + k * float(out["mse_loss"]), bpp + k * float(out["bpp_loss"]), n + k
    model.train()
    return loss / n, mse / n, bpp / n


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_x, test_x = make_data(seed)
    tests = test_loader(test_x)
    net, optimizer, lr_scheduler, criterion, clip, per_batch = build(run, seed, variant)
    last = CKPT_EPOCH.get(run, EPOCHS)
    ckpt = Path(out_dir) / "checkpoint.pth.tar"
    losses, vals, psnrs, bpps, nan_step, step = [], [], [], [], None, 0
    enc0 = [p.detach().clone() for p in net.g_a.parameters()]
    for epoch in range(last):
        net.train()
        for d in train_loader(train_x, seed, epoch):
            optimizer.zero_grad()
            out = criterion(net(d), d)
            out["loss"].backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            optimizer.step()
            losses.append(out["loss"].item())
            step += 1
            if per_batch:                 # the owner's iteration-based loop: the plateau scheduler on each batch
                lr_scheduler.step(losses[-1])
            if not math.isfinite(losses[-1]):
                nan_step = step
                break
        if nan_step is not None:          # the owner stops the run; the last epoch's checkpoint is on disk
            break
        loss, mse, bpp = test_epoch(net, criterion, tests)
        vals.append(loss)
        psnrs.append(-10 * math.log10(max(mse, 1e-12)))
        bpps.append(bpp)
        if not per_batch:
            lr_scheduler.step(loss)
        torch.save({"epoch": epoch, "state_dict": net.state_dict(), "loss": loss, "optimizer": optimizer.state_dict(),
                    "lr_scheduler": lr_scheduler.state_dict()}, ckpt)
    enc_moved = max(float((p.detach() - q).abs().max()) for p, q in zip(net.g_a.parameters(), enc0))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"nan_step": nan_step if nan_step is not None else -1, "steps": step,
                            "epochs_done": len(vals), "psnr": psnrs[-1] if psnrs else float("nan"),
                            "bpp": bpps[-1] if bpps else float("nan"), "first": float(np.mean(losses[:5])),
                            "encoder_change": enc_moved, "lr_final": optimizer.param_groups[0]["lr"],
                            "lr_peak": config(run, variant)[2]})


def symptom(run: str, trained: Trained) -> str | None:
    m, v = trained.metrics, trained.val_losses
    if m["psnr"] < 17.0:
        return (f"test PSNR {m['psnr']:.1f} dB at {m['bpp']:.2f} bpp after {m['epochs_done']} epochs (train loss "
                f"{m['first']:.1f} -> {np.mean(trained.train_losses[-20:]):.1f}); analysis transform weights moved "
                f"at most {m['encoder_change']:.1e}")
    half = len(v) // 2
    gain = (v[half - 1] - v[-1]) / v[half - 1]
    if gain < 0.03:
        return (f"test RD loss {v[0]:.2f} -> {v[half - 1]:.2f} by epoch {half}, then {v[-1]:.2f} at epoch {len(v)} "
                f"({100 * gain:.1f}% better over the second half); test PSNR {m['psnr']:.1f} dB at {m['bpp']:.2f} "
                f"bpp; lr now {m['lr_final']:.1e} (peak {m['lr_peak']:.0e})")
    return None


def _setup(run: str):
    import triage

    train_x, test_x = make_data(0)
    net, optimizer, lr_scheduler, criterion, clip, per_batch = build(run, 0, None)
    at = CKPT_EPOCH.get(run, EPOCHS)
    batches = train_loader(train_x, 0, at)[:48]
    return triage.Setup(model=net, optimizer=optimizer, loss_fn=make_loss_fn(criterion), batches=batches,
                        val_batches=test_loader(test_x), scheduler=lr_scheduler,
                        scheduler_interval="step" if per_batch else "epoch",
                        steps_per_epoch=len(train_x) // BS, grad_clip=clip, total_steps=EPOCHS * (len(train_x) // BS))


def setup_healthy():
    return _setup("healthy")


def setup_plateau_step_per_batch():
    return _setup("plateau_step_per_batch")


def setup_round_in_training():
    return _setup("round_in_training")
