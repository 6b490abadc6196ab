"""DCGAN on sklearn's 8x8 digits: a transposed-conv generator against a conv discriminator, BCE, two Adams.

Follows pytorch/examples dcgan/main.py (read: Generator = ConvTranspose2d + BatchNorm2d + ReLU blocks ending in Tanh;
Discriminator = Conv2d + LeakyReLU(0.2) (+ BatchNorm2d) ending in a 1-channel conv and Sigmoid; `weights_init`
drawing conv weights from N(0, 0.02) and BatchNorm weights from N(1, 0.02); `criterion = nn.BCELoss()`;
`optimizerD/optimizerG = optim.Adam(..., lr=0.0002, betas=(0.5, 0.999))`; the alternating loop: (1) netD.zero_grad(),
errD_real on a real batch with label 1 and backward, fake = netG(noise), errD_fake on netD(fake.detach()) with label
0 and backward, optimizerD.step(); (2) netG.zero_grad(), errG on netD(fake) with label 1, backward,
optimizerG.step(); the per-epoch `torch.save(netG.state_dict(), ...)` / netD). Scaled to 8x8 digits in [-1, 1]
(nz=16, 16 feature maps). The owner keeps one checkpoint per epoch {'epoch', 'step', 'model' (G and D as one module),
'optimizer': {'G': ..., 'D': ...}}. Sample quality is measured as a Frechet distance between the pixel
statistics (mean and covariance of the 64 pixels) of 1000 generated and all real digits.

Runs
- healthy: the example's loop. Its summed loss is flat by nature (errD ~1.0-1.4 and errG ~0.7-1.5 hover while the
  samples improve); the pixel-space Frechet distance falls from ~40 to ~15. Checkpoint: epoch 5 of 10, samples still
  improving.
- no_zero_grad_d: the owner refactored the loop and dropped `netD.zero_grad()` (the example calls it at the start
  of every D update; without it the discriminator's .grad keeps every earlier D gradient AND the gradient that
  errG.backward() pushes through D into its weights; the GAN loop's zero_grad pitfalls are spelled out in
  tarepan.hatenablog.com/entry/2020/10/22/143519 "G's backward accumulates D's .grad -> call netD.zero_grad()
  before D's update", and the PyTorch DCGAN tutorial's training section). D's update then follows the running
  sum of all its past gradients: it saturates, and the generator's samples stop improving (Frechet distance
  ~45, three times the healthy run's, with errD ~2 and errG ~0.3). Root cause: loop_bug (the loop itself; adding the zero_grad removes
  the symptom). Competing fix a user tries first: a 10x lower learning rate for both networks (the usual GAN
  "instability" advice): the gradients still accumulate and the samples stay bad (Frechet distance ~35). Checkpoint: epoch 5.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="dcgan",
    kind="generative",
    original="pytorch/examples: dcgan/main.py",
    runs={
        "healthy": Run(cause="healthy", story="DCGAN on 8x8 digits as in the example; the losses hover (a GAN at its "
                                              "equilibrium) while samples improve; checkpoint at epoch 5 of 10."),
        "no_zero_grad_d": Run(
            cause="loop_bug",
            story="After refactoring the training loop the generated digits stopped improving after a few epochs: "
                  "D's loss collapses, samples are blobs. I had dropped netD.zero_grad().",
            fix="zero_grad_d",
            competing=("lr_x0.1",),
        ),
    },
)

NZ = 16
NGF = 16
NDF = 16
BATCH = 64
EPOCHS = 10
CKPT_EPOCH = 5
real_label, fake_label = 1.0, 0.0


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(NZ, NGF * 2, 2, 1, 0, bias=False),      # 2x2
            nn.BatchNorm2d(NGF * 2), nn.ReLU(True),
            nn.ConvTranspose2d(NGF * 2, NGF, 4, 2, 1, bias=False),     # 4x4
            nn.BatchNorm2d(NGF), nn.ReLU(True),
            nn.ConvTranspose2d(NGF, 1, 4, 2, 1, bias=False),           # 8x8
            nn.Tanh(),
        )

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, NDF, 4, 2, 1, bias=False),                    # 4x4
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF, NDF * 2, 4, 2, 1, bias=False),              # 2x2
            nn.BatchNorm2d(NDF * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(NDF * 2, 1, 2, 1, 0, bias=False),                # 1x1
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x).view(-1, 1).squeeze(1)


class GAN(nn.Module):
    """netG and netD held together so one checkpoint and one Setup carry both."""

    def __init__(self):
        super().__init__()
        self.netG = Generator()
        self.netD = Discriminator()


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def make_data():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 8.0 - 1.0   # [0, 16] -> [-1, 1]
    return TensorDataset(x, torch.tensor(d.target))


def _build(seed, variant):
    torch.manual_seed(seed)
    gan = GAN()
    gan.apply(weights_init)
    lr = 0.0002 * 5 * (0.1 if variant == "lr_x0.1" else 1.0)   # 1e-3: the small nets train in 10 short epochs
    optimizerD = torch.optim.Adam(gan.netD.parameters(), lr=lr, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(gan.netG.parameters(), lr=lr, betas=(0.5, 0.999))
    return gan, optimizerG, optimizerD


def make_train_step(zero_grad_d: bool):
    criterion = nn.BCELoss()

    def train_step(gan, optimizers, batch):
        netG, netD = gan.netG, gan.netD
        optimizerD, optimizerG = optimizers["D"], optimizers["G"]
        real_cpu = batch[0]
        batch_size = real_cpu.size(0)
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        if zero_grad_d:
            netD.zero_grad()
        label = torch.full((batch_size,), real_label)
        output = netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        noise = torch.randn(batch_size, NZ, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()
        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        return errD + errG, errD.item(), errG.item()

    return train_step


def gan_loss(gan, batch):
    """errD + errG on one batch: every network gets a gradient (for Setup.loss_fn)."""
    criterion = nn.BCELoss()
    real = batch[0]
    n = real.size(0)
    fake = gan.netG(torch.randn(n, NZ, 1, 1))
    errD = criterion(gan.netD(real), torch.ones(n)) + criterion(gan.netD(fake.detach()), torch.zeros(n))
    errG = criterion(gan.netD(fake), torch.ones(n))
    return errD + errG


def pixel_fd(gan, real: torch.Tensor, seed: int) -> float:
    """Frechet distance between Gaussians fitted to the 64 pixels of real and generated digits."""
    from scipy import linalg

    g = torch.Generator().manual_seed(seed + 123)
    gan.eval()
    with torch.no_grad():
        fake = gan.netG(torch.randn(1000, NZ, 1, 1, generator=g)).view(1000, -1).double().numpy()
    gan.train()
    r = real.view(len(real), -1).double().numpy()
    mu1, mu2 = r.mean(0), fake.mean(0)
    s1, s2 = np.cov(r, rowvar=False), np.cov(fake, rowvar=False)
    covmean = linalg.sqrtm(s1 @ s2)
    if np.iscomplexobj(covmean):
        covmean = covmean.real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1 + s2 - 2 * covmean))


def _zero_grad_d(run, variant):
    return run != "no_zero_grad_d" or variant == "zero_grad_d"


def _loader(ds, seed, epoch):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return DataLoader(ds, batch_size=BATCH, shuffle=True, drop_last=True, generator=g)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    ds = make_data()
    gan, optimizerG, optimizerD = _build(seed, variant)
    step_fn = make_train_step(_zero_grad_d(run, variant))
    optimizers = {"G": optimizerG, "D": optimizerD}
    ckpt = out_dir / "checkpoint.pt"
    losses, fds = [], []
    errDs, errGs = [], []
    step = 0
    for epoch in range(EPOCHS):
        for i, batch in enumerate(_loader(ds, seed, epoch)):
            loss, errD, errG = step_fn(gan, optimizers, batch)
            losses.append(loss.item())
            errDs.append(errD)
            errGs.append(errG)
            step += 1
        if epoch == 0:
            fds.append(pixel_fd(gan, ds.tensors[0], seed))
        if epoch + 1 == CKPT_EPOCH:
            torch.save({"epoch": epoch + 1, "step": step, "model": gan.state_dict(),
                        "optimizer": {"G": optimizerG.state_dict(), "D": optimizerD.state_dict()}}, ckpt)
    fd = pixel_fd(gan, ds.tensors[0], seed)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"fd_first": fds[0], "fd_final": fd, "errD_tail": float(np.mean(errDs[-50:])),
                            "errG_tail": float(np.mean(errGs[-50:])), "steps": step})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if not m["fd_final"] < 25:
            return f"healthy GAN failed: pixel Frechet distance {m['fd_first']:.1f} -> {m['fd_final']:.1f}"
        return None
    if m["fd_final"] != m["fd_final"] or m["fd_final"] > 25:
        return (f"samples stopped improving: pixel Frechet distance {m['fd_first']:.1f} -> {m['fd_final']:.1f} after "
                f"{m['steps']} steps (a working run: ~15); errD {m['errD_tail']:.2f}, errG {m['errG_tail']:.2f}")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    ds = make_data()
    gan, optimizerG, optimizerD = _build(0, None)
    step_fn = make_train_step(_zero_grad_d(run, None))
    batches = []
    for epoch in range(CKPT_EPOCH, CKPT_EPOCH + 2):
        batches += [(x, y) for x, y in _loader(ds, 0, epoch)]

    def train_step(model, optimizers, batch):
        return step_fn(model, optimizers, batch)[0]

    steps_per_epoch = len(ds) // BATCH
    return triage.Setup(model=gan, optimizers={"G": optimizerG, "D": optimizerD}, loss_fn=gan_loss,
                        batches=batches, train_step=train_step, total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_no_zero_grad_d():
    return _setup("no_zero_grad_d")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            if r == "healthy" and v is not None:
                continue
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 2) for k, x in tr.metrics.items()},
                      symptom(r, tr))
