"""EDSR-style single-image super-resolution (x2): residual blocks without BatchNorm, a PixelShuffle upsampler,
an L1 loss on 0..255 pixel values, PSNR against the bicubic baseline.

Written after sanghyun-son/EDSR-PyTorch. I read `src/trainer.py` (`Trainer.train`: per batch `zero_grad`,
`sr = model(lr, 0)`, `loss = self.loss(sr, hr)` (L1 by default, `--loss 1*L1`), optional `clip_grad_value_`,
`optimizer.step()`; and ONE `self.optimizer.schedule()` after the batch loop, i.e. the scheduler is stepped once
per epoch), the model (`src/model/edsr.py` / `common.py`: `MeanShift` sub/add of the DIV2K RGB mean on a
0..255 `rgb_range`, head conv, `ResBlock`s of conv-ReLU-conv times `res_scale` with no BatchNorm, body conv,
`Upsampler` = conv to 4*n_feats + `nn.PixelShuffle(2)`, tail conv) and `utility.make_optimizer` (Adam,
betas (0.9, 0.999), eps 1e-8, lr 1e-4, a MultiStepLR on epoch milestones, gamma 0.5). Also TevenLeScao/
super-resolution's `edsr_trainer.py` (MultiStepLR stepped per epoch). Here: 32x32 HR patches of synthetic
textures (oriented gratings, sharp-edged rectangles and disks, noise), LR made by antialiased bicubic x0.5 as in
DIV2K's bicubic track, batch 16, 4 residual blocks of 32 features. The checkpoint is one file
`{"epoch", "step", "model", "optimizer", "scheduler", "loss_log"}` (EDSR keeps model/optimizer/log in one
experiment folder; here they are one dict).

The L1 loss is on 0..255 values and its floor is far from 0: x2 super-resolution cannot recover the detail
that bicubic downsampling removed (the healthy run's L1 is still ~6 grey levels when it is checkpointed, and
falls slowly; its PSNR is still a little under bicubic's at the checkpoint and rising ~1 dB an epoch). A loss that "stays high" is the nature of this task, not a fault; PSNR above bicubic is the
figure that says whether it learns.

Runs
- healthy: Adam lr 5e-4 (EDSR's default is 1e-4 for 300k iterations; this short run uses 5x), MultiStepLR
  (milestones=[200 epochs], gamma 0.5) stepped once per epoch as in `Trainer.train`; 256 steps (4 epochs of 64
  batches), checkpoint at step 192 (end of epoch 3) while validation PSNR is still rising.
- scheduler_stepped_per_batch: the owner wanted a faster decay for a small dataset and wrote
  `ExponentialLR(gamma=0.95)` ("5% per epoch"), and, porting the loop to an iteration-based script (the way
  BasicSR-style trainers count iterations), moved `scheduler.step()` inside the batch loop. The LR is multiplied
  by 0.95 every batch: 0.95^64 = 0.04 after one epoch, 5e-5 of its peak at the step-192 checkpoint. The loss drops for the
  first few dozen steps and then freezes; validation PSNR stops moving. The same bug in a super-resolution
  repository: Lornatang/SRGAN-PyTorch#1 "Learning rate scheduler is working incorrect" (StepLR meant per epoch,
  called at each training step, "the learning rate is quickly becoming zero... does not seem to train"; moving
  `scheduler.step()` after the epoch fixed it); also pytorch/pytorch#3814 ("Scheduler should step after the end
  of each epoch, not after every iteration").
  Root cause `lr_schedule_decayed`: the LR at the checkpoint is ~0 against its peak; stepping the scheduler
  once per epoch (`step_per_epoch`) trains. Competing fix a user tries first: a 10x higher base LR
  (`lr_x10`, 5e-3), which the per-batch decay crushes just the same (5e-5 of 5e-3 is still nothing).
  The checkpoint is taken at step 192 (end of epoch 3), once the plateau shows. The symptom: validation PSNR
  gains under 0.3 dB over the second half of the run (the healthy run gains ~2 dB there).
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
    name="edsr_super_resolution",
    kind="super-resolution",
    original="sanghyun-son/EDSR-PyTorch: src/trainer.py (Trainer.train) + src/model/edsr.py, common.py, utility.py",
    runs={
        "healthy": Run(cause="healthy", story="EDSR x2 on 32x32 texture patches, L1 on 0..255 pixels, Adam 5e-4; "
                       "the L1 stays around 5-6 grey levels (x2 SR has a floor far from 0) but validation PSNR "
                       "keeps rising by ~1 dB an epoch at the epoch-3 checkpoint."),
        "scheduler_stepped_per_batch": Run(
            cause="lr_schedule_decayed",
            story="I switched to ExponentialLR(0.95) and call scheduler.step() in the batch loop. The L1 loss "
                  "dropped for a few dozen steps and then froze; PSNR is barely above bicubic. Raising the "
                  "learning rate 10x changed nothing.",
            fix="step_per_epoch", competing=("lr_x10",)),
    },
)

SCALE, RGB_RANGE, PATCH, BS = 2, 255.0, 32, 16
N_TRAIN, N_VAL = 1024, 128
STEPS_PER_EPOCH = N_TRAIN // BS           # 64
EPOCHS = 4
LR = 5e-4
N_RESBLOCKS, N_FEATS, RES_SCALE = 4, 32, 1.0
DIV2K_MEAN = (0.4488, 0.4371, 0.4040)


# ----------------------------------------------------------------------------------------------- data
def _textures(n, g):
    yy, xx = torch.meshgrid(torch.linspace(0, 1, PATCH), torch.linspace(0, 1, PATCH), indexing="ij")
    imgs = torch.zeros(n, 3, PATCH, PATCH)
    for i in range(n):
        img = 0.5 * torch.rand(3, 1, 1, generator=g) + 0.25 * torch.ones(3, PATCH, PATCH)
        for _ in range(2):   # oriented gratings
            th = torch.rand(1, generator=g) * math.pi
            f = 1.5 + 4 * torch.rand(1, generator=g)
            ph = torch.rand(1, generator=g) * 2 * math.pi
            col = torch.rand(3, 1, 1, generator=g) - 0.5
            img = img + 0.35 * col * torch.sin(2 * math.pi * f * (xx * torch.cos(th) + yy * torch.sin(th)) + ph)
        for _ in range(3):   # sharp-edged rectangles and disks
            cx, cy, r = torch.rand(3, generator=g)
            col = torch.rand(3, 1, 1, generator=g) - 0.5
            if torch.rand(1, generator=g) < 0.5:
                m = ((xx - cx).abs() < 0.25 * r + 0.05) & ((yy - cy).abs() < 0.2 * r + 0.05)
            else:
                m = ((xx - cx) ** 2 + (yy - cy) ** 2) < (0.25 * r + 0.05) ** 2
            img = torch.where(m, img + 0.6 * col, img)
        img = img + 0.01 * torch.randn(3, PATCH, PATCH, generator=g)
        imgs[i] = img.clamp(0, 1)
    return imgs * RGB_RANGE


def _degrade(hr):
    lr = F.interpolate(hr, scale_factor=1 / SCALE, mode="bicubic", align_corners=False, antialias=True)
    return lr.clamp(0, RGB_RANGE).round()


def make_data(seed):
    g = torch.Generator().manual_seed(5200 + seed)
    hr = _textures(N_TRAIN + N_VAL, g).round()
    lr = _degrade(hr)
    return (lr[:N_TRAIN], hr[:N_TRAIN]), (lr[N_TRAIN:], hr[N_TRAIN:])


def batches_for_epoch(ds, epoch, seed):
    lr, hr = ds
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(lr), generator=g)
    out = []
    for i in range(0, len(lr), BS):
        idx = order[i:i + BS]
        l, h = lr[idx], hr[idx]
        if torch.rand(1, generator=g) < 0.5:                 # EDSR's augment: flips
            l, h = l.flip(-1), h.flip(-1)
        out.append((l, h))
    return out


# ----------------------------------------------------------------------------------------------- model
class MeanShift(nn.Conv2d):
    def __init__(self, rgb_range, sign=-1):
        super().__init__(3, 3, kernel_size=1)
        self.weight.data = torch.eye(3).view(3, 3, 1, 1)
        self.bias.data = sign * rgb_range * torch.tensor(DIV2K_MEAN)
        for p in self.parameters():
            p.requires_grad = False


class ResBlock(nn.Module):
    def __init__(self, n_feats, res_scale):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(n_feats, n_feats, 3, padding=1), nn.ReLU(True),
                                  nn.Conv2d(n_feats, n_feats, 3, padding=1))
        self.res_scale = res_scale

    def forward(self, x):
        return x + self.body(x) * self.res_scale


class Upsampler(nn.Sequential):
    def __init__(self, scale, n_feats):
        super().__init__(nn.Conv2d(n_feats, 4 * n_feats, 3, padding=1), nn.PixelShuffle(2))


class EDSR(nn.Module):
    def __init__(self, n_resblocks=N_RESBLOCKS, n_feats=N_FEATS, scale=SCALE, res_scale=RES_SCALE):
        super().__init__()
        self.sub_mean = MeanShift(RGB_RANGE, -1)
        self.add_mean = MeanShift(RGB_RANGE, +1)
        self.head = nn.Sequential(nn.Conv2d(3, n_feats, 3, padding=1))
        self.body = nn.Sequential(*[ResBlock(n_feats, res_scale) for _ in range(n_resblocks)],
                                  nn.Conv2d(n_feats, n_feats, 3, padding=1))
        self.tail = nn.Sequential(Upsampler(scale, n_feats), nn.Conv2d(n_feats, 3, 3, padding=1))

    def forward(self, x):
        x = self.sub_mean(x)
        x = self.head(x)
        res = self.body(x)
        res = res + x
        x = self.tail(res)
        return self.add_mean(x)


def loss_fn(model, batch):
    lr, hr = batch
    return F.l1_loss(model(lr), hr)


def psnr(sr, hr):
    sr = sr.clamp(0, RGB_RANGE).round()
    mse = ((sr - hr) / RGB_RANGE).pow(2).mean(dim=(1, 2, 3))
    return float((-10 * torch.log10(mse)).mean())


def bicubic_psnr(ds):
    lr, hr = ds
    up = F.interpolate(lr, scale_factor=SCALE, mode="bicubic", align_corners=False)
    return psnr(up, hr)


# ----------------------------------------------------------------------------------------------- config
def config(run, variant):
    lr = LR
    if variant == "lr_x10":
        lr = 10 * LR
    per_batch = run == "scheduler_stepped_per_batch" and variant != "step_per_epoch"
    return lr, per_batch


def build(run, variant=None, seed=0):
    torch.manual_seed(seed)
    model = EDSR()
    lr, _ = config(run, variant)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.999),
                           eps=1e-8)
    if run == "healthy":
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[200], gamma=0.5)
    else:
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.95)
    return model, opt, sched


@torch.no_grad()
def evaluate(model, ds):
    model.eval()
    lr, hr = ds
    sr = model(lr)
    out = float(F.l1_loss(sr, hr)), psnr(sr, hr)
    model.train()
    return out


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_ds, val_ds = make_data(seed)
    model, opt, sched = build(run, variant, seed)
    _, per_batch = config(run, variant)
    ckpt_step = 192
    ckpt = Path(out_dir) / "edsr_x2_latest.pt"
    losses, val_l1, val_psnr, log = [], [], [], []
    step = 0
    psnr_at_ckpt = None
    for epoch in range(EPOCHS):
        model.train()
        for batch in batches_for_epoch(train_ds, epoch, seed):
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            if per_batch:
                sched.step()
            step += 1
            losses.append(loss.item())
            if step % 32 == 0:
                l1, p = evaluate(model, val_ds)
                val_l1.append(l1)
                val_psnr.append(p)
                log.append({"step": step, "val_l1": l1, "psnr": p, "lr": opt.param_groups[0]["lr"]})
            if step == ckpt_step:
                psnr_at_ckpt = val_psnr[-1]
                torch.save({"epoch": epoch, "step": step, "model": model.state_dict(),
                            "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                            "loss_log": list(losses)}, ckpt)
        if not per_batch:
            sched.step()
    base = bicubic_psnr(val_ds)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_l1,
                   metrics={"bicubic_psnr": base, "psnr_final": val_psnr[-1], "psnr_ckpt": psnr_at_ckpt,
                            "psnr_step64": val_psnr[1], "lr_final": opt.param_groups[0]["lr"],
                            "gain_last_half": val_psnr[-1] - val_psnr[len(val_psnr) // 2 - 1]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    gain = m["psnr_final"] - m["bicubic_psnr"]
    late = m["gain_last_half"]
    if gain < -3.0 or late < 0.3:
        return (f"PSNR {m['psnr_final']:.2f} dB after {len(trained.train_losses)} steps, {gain:+.2f} dB over "
                f"bicubic ({m['bicubic_psnr']:.2f} dB); +{late:.2f} dB over the last half of the run, "
                f"L1 {trained.train_losses[0]:.1f} -> {trained.train_losses[-1]:.1f}, lr now {m['lr_final']:.1e}")
    return None


def _setup(run):
    import triage

    train_ds, val_ds = make_data(0)
    model, opt, sched = build(run, None, 0)
    vl, vh = val_ds
    per_batch = run != "healthy"
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches_for_epoch(train_ds, 0, 0),
                        val_batches=[(vl[i:i + 32], vh[i:i + 32]) for i in range(0, len(vl), 32)],
                        scheduler=sched, scheduler_interval="step" if per_batch else "epoch",
                        steps_per_epoch=STEPS_PER_EPOCH, total_steps=EPOCHS * STEPS_PER_EPOCH)


def setup_healthy():
    return _setup("healthy")


def setup_scheduler_stepped_per_batch():
    return _setup("scheduler_stepped_per_batch")
