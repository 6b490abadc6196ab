"""Barlow Twins redundancy-reduction self-supervised learning, LARS with a warmup-cosine schedule stepped per batch.

Written after facebookresearch/barlowtwins `main.py` (read through the code search): two augmented views of each
image go through a backbone and a projector (Linear without bias, BatchNorm1d, ReLU, then a last bias-free Linear),
the projections are normalised by a BatchNorm1d(affine=False), the empirical cross-correlation
`c = bn(z1).T @ bn(z2) / batch_size` is pushed to the identity: `on_diag = sum((diag(c) - 1)^2)`,
`off_diag = sum(offdiag(c)^2)`, `loss = on_diag + lambd * off_diag` (lambd 0.0051). The optimizer is the
original's own LARS (momentum 0.9, eta 0.001, trust ratio and weight decay skipped for 1-d parameters) over two
param groups, weights (ndim > 1) and biases/BN (ndim == 1), whose learning rates are `base * 0.2` and
`base * 0.0048` with `base = batch_size / 256`; the rate follows 10 epochs of linear warmup then a cosine to
`base * 0.001`, computed for every STEP (`max_steps = epochs * len(loader)`). As in ports that use a scheduler
object (solo-learn, lightly), the warmup-cosine is a `LambdaLR` over both groups, stepped every batch. The
checkpoint is written every epoch as in the original: `{"epoch", "model", "optimizer"}` plus `"scheduler"`
(`checkpoint.pth`). Here the images are scikit-learn's 8x8 digits, the backbone a small MLP (for the ResNet-50),
the projector 256-256, batch 128, 40 epochs of 14 steps; views are made by random shifts, pixel dropout,
contrast and noise.

The Barlow Twins loss does not fall to 0: with 256 projector dimensions the on-diagonal term starts near 256
(a fresh network's views are nearly uncorrelated after BN) and the redundancy term keeps it well above 0 for the
whole run; a healthy run drops it from ~200 to ~20-30 and still improves at the checkpoint. The owner watches the
loss and a k-NN probe on the backbone's features (labels are used by the probe only).

Runs
- healthy: the schedule counted in steps. Loss falls steadily; the checkpoint is the epoch-20 one of 40, still
  improving; k-NN accuracy of the features about 0.9.
- schedule_in_epochs_stepped_per_batch: the owner rewrote `adjust_learning_rate` as a `LambdaLR` lambda in
  EPOCHS (warmup 10, cosine over 40, as the paper states it) but kept stepping it every batch, as the original
  adjusts the rate per step. The warmup is over after 10 steps and the cosine after 40: from step 40 on both
  groups sit at 0.001 of the peak. The loss falls during those 40 steps and then plateaus far above the healthy
  curve. A schedule written in epochs but stepped every batch is a well-known mistake: the scheduler-pitfalls
  page https://runebook.dev/en/docs/pytorch/generated/torch.optim.lr_scheduler.lrscheduler/torch.optim.lr_scheduler.LRScheduler.step
  lists it ("you call scheduler.step() once per batch when you meant once per epoch ... the learning rate
  plummets to a very small value too quickly, and your model stops learning"). Root cause `lr_schedule_decayed`: the lambda counted in steps
  (`schedule_in_steps`) trains; the competing fix a user tries first, a 10x larger base learning rate
  (`lr_x10`), still leaves the rate at 1% of the intended peak after step 40 and the loss plateaued. The
  checkpoint is the epoch-30 one, long into the plateau.
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
    name="barlow_twins_lars",
    kind="redundancy-reduction self-supervised",
    original="facebookresearch/barlowtwins: main.py (BarlowTwins, LARS, adjust_learning_rate, off_diagonal)",
    runs={
        "healthy": Run(cause="healthy", story="Barlow Twins on digit views with LARS and warmup-cosine per step; "
                       "the loss falls from ~200 towards ~20 (its floor is far above 0); checkpoint at epoch 20 of 40."),
        "schedule_in_epochs_stepped_per_batch": Run(
            cause="lr_schedule_decayed",
            story="The Barlow loss dropped in the first few dozen steps and has been flat ever since, far above "
                  "where the paper's curves go. Raising the base learning rate 10x did not help.",
            fix="schedule_in_steps", competing=("lr_x10",)),
    },
)

BS, EPOCHS, LAMBD, LR_W, LR_B, WD = 128, 40, 0.0051, 0.2, 0.0048, 1e-6
CKPT_EPOCH = {"healthy": 20, "schedule_in_epochs_stepped_per_batch": 30}


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32).view(-1, 8, 8) / 16.0, torch.tensor(d.target)


def augment(x, g):
    """One random view: shift by up to 1 pixel, drop 15% of pixels, jitter contrast, add noise."""
    n = len(x)
    pad = F.pad(x, (1, 1, 1, 1))
    dx = torch.randint(0, 3, (n,), generator=g)
    dy = torch.randint(0, 3, (n,), generator=g)
    rows = (dy.view(n, 1) + torch.arange(8).view(1, 8))
    cols = (dx.view(n, 1) + torch.arange(8).view(1, 8))
    out = pad[torch.arange(n).view(n, 1, 1), rows.view(n, 8, 1), cols.view(n, 1, 8)]
    out = out * (torch.rand(n, 8, 8, generator=g) > 0.15)
    out = out * (0.7 + 0.6 * torch.rand(n, 1, 1, generator=g))
    out = out + 0.1 * torch.randn(n, 8, 8, generator=g)
    return ((out - 0.3) / 0.4).reshape(n, 64)


def epoch_batches(images, seed, epoch):
    """The loader of one epoch: shuffled, two views per image, drop_last."""
    g = torch.Generator().manual_seed(1000 * seed + epoch)
    perm = torch.randperm(len(images), generator=g)
    out = []
    for i in range(0, len(perm) - BS + 1, BS):
        x = images[perm[i:i + BS]]
        out.append((augment(x, g), augment(x, g)))
    return out


def off_diagonal(x):
    n, m = x.shape
    assert n == m
    return x.flatten()[:-1].view(n - 1, n + 1)[:, 1:].flatten()


class BarlowTwins(nn.Module):
    def __init__(self, sizes=(128, 256, 256)):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(),
                                      nn.Linear(256, sizes[0]), nn.BatchNorm1d(sizes[0]), nn.ReLU())
        layers = []
        for i in range(len(sizes) - 2):
            layers += [nn.Linear(sizes[i], sizes[i + 1], bias=False), nn.BatchNorm1d(sizes[i + 1]), nn.ReLU()]
        layers.append(nn.Linear(sizes[-2], sizes[-1], bias=False))
        self.projector = nn.Sequential(*layers)
        self.bn = nn.BatchNorm1d(sizes[-1], affine=False)

    def forward(self, y1, y2):
        z1 = self.projector(self.backbone(y1))
        z2 = self.projector(self.backbone(y2))
        c = self.bn(z1).T @ self.bn(z2)
        c = c / y1.shape[0]
        on_diag = (torch.diagonal(c) - 1).pow(2).sum()
        off_diag = off_diagonal(c).pow(2).sum()
        return on_diag + LAMBD * off_diag


class LARS(torch.optim.Optimizer):
    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                dp = p.grad
                if p.ndim > 1:  # weight decay and the trust ratio skip biases and norms
                    dp = dp.add(p, alpha=g["weight_decay"])
                    pn, un = torch.norm(p), torch.norm(dp)
                    q = torch.where(pn > 0, torch.where(un > 0, g["eta"] * pn / un, torch.ones_like(pn)),
                                    torch.ones_like(pn))
                    dp = dp.mul(q)
                st = self.state[p]
                if "mu" not in st:
                    st["mu"] = torch.zeros_like(p)
                st["mu"].mul_(g["momentum"]).add_(dp)
                p.add_(st["mu"], alpha=-g["lr"])


def make_lambda(steps_per_epoch, in_steps):
    unit = steps_per_epoch if in_steps else 1  # the fault: the lambda counts epochs but is stepped per batch
    max_steps, warmup = EPOCHS * unit, 10 * unit

    def lr_lambda(step):
        if step < warmup:
            return step / warmup
        q = 0.5 * (1 + math.cos(math.pi * min(step - warmup, max_steps - warmup) / (max_steps - warmup)))
        return q + 0.001 * (1 - q)

    return lr_lambda


def config(run, variant):
    in_steps = run == "healthy" or variant == "schedule_in_steps"
    scale = 10.0 if variant == "lr_x10" else 1.0
    return in_steps, scale


def build(run, variant, seed, steps_per_epoch):
    torch.manual_seed(seed)
    model = BarlowTwins()
    in_steps, scale = config(run, variant)
    weights = [p for p in model.parameters() if p.ndim > 1]
    biases = [p for p in model.parameters() if p.ndim == 1]
    base = BS / 256 * scale
    opt = LARS([{"params": weights, "lr": base * LR_W}, {"params": biases, "lr": base * LR_B}], lr=0.0,
               weight_decay=WD)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, make_lambda(steps_per_epoch, in_steps))
    return model, opt, sched


def loss_fn(model, batch):
    y1, y2 = batch
    return model(y1, y2)


@torch.no_grad()
def knn_accuracy(model, images, labels, seed):
    model.eval()
    x = ((images - 0.3) / 0.4).reshape(len(images), 64)
    f = F.normalize(model.backbone(x), dim=1)
    model.train()
    g = torch.Generator().manual_seed(7 + seed)
    perm = torch.randperm(len(x), generator=g)
    tr, te = perm[:1300], perm[1300:]
    sim = f[te] @ f[tr].T
    pred = labels[tr][sim.topk(5, dim=1).indices].mode(dim=1).values
    return float((pred == labels[te]).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    images, labels = _digits()
    steps_per_epoch = len(images) // BS
    model, opt, sched = build(run, variant, seed, steps_per_epoch)
    ckpt = Path(out_dir) / "checkpoint.pth"
    losses, epoch_loss = [], []
    for epoch in range(EPOCHS):
        for y1, y2 in epoch_batches(images, seed, epoch):
            opt.zero_grad()
            loss = model(y1, y2)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        epoch_loss.append(sum(losses[-steps_per_epoch:]) / steps_per_epoch)
        if epoch + 1 == CKPT_EPOCH[run]:
            torch.save({"epoch": epoch + 1, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict()}, ckpt)
            at_ckpt = {"epoch_loss": epoch_loss[-1], "lr_w": opt.param_groups[0]["lr"],
                       "knn": knn_accuracy(model, images, labels, seed)}
            break
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={**at_ckpt, "first": sum(losses[:5]) / 5, "loss_epoch3": epoch_loss[2],
                            "loss_5_before": epoch_loss[-6], "peak_lr_w": BS / 256 * LR_W * config(run, variant)[1],
                            "epochs": len(epoch_loss)})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    recent = (m["loss_5_before"] - m["epoch_loss"]) / m["loss_5_before"]
    # a plateau far above where a working schedule is by then (~80-90 at epochs 20-30)
    if recent < 0.03 and m["epoch_loss"] > 100 or m["epoch_loss"] > 150:
        return (f"Barlow loss {m['first']:.0f} at the start, {m['loss_epoch3']:.0f} at epoch 3, "
                f"{m['epoch_loss']:.0f} at epoch {m['epochs']} ({100 * recent:.1f}% lower than 5 epochs before); "
                f"k-NN accuracy {m['knn']:.2f}; weights' lr {m['lr_w']:.2e}")
    return None


def _setup(run):
    import triage

    images, _ = _digits()
    steps_per_epoch = len(images) // BS
    model, opt, sched = build(run, None, 0, steps_per_epoch)
    at = CKPT_EPOCH[run]
    batches = epoch_batches(images, 0, at) + epoch_batches(images, 0, at + 1) + epoch_batches(images, 0, at + 2)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn, batches=batches[:42],
                        total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_schedule_in_epochs_stepped_per_batch():
    return _setup("schedule_in_epochs_stepped_per_batch")
