"""Focal loss on an imbalanced 3-class problem, with class-balanced resampling (a WeightedRandomSampler).

Written after kaidic/LDAM-DRW (`losses.py`: `focal_loss(input_values, gamma)` takes the per-example cross-entropy,
`p = torch.exp(-input_values)`, and returns `((1 - p) ** gamma * input_values).mean()`, with `FocalLoss(weight,
gamma)` wrapping `F.cross_entropy(..., reduction='none')`; `cifar_train.py`: `--loss_type Focal`, `--train_rule
Resample` (an imbalanced-dataset sampler), SGD momentum 0.9 with weight decay 2e-4, `adjust_learning_rate` setting
every param group's lr once per epoch with a linear warm-up over the first 5 epochs, and `save_checkpoint({'epoch',
'arch', 'state_dict', 'best_acc1', 'optimizer'})` to `ckpt.pth.tar` at each epoch's end). I also read
clcarwin/focal_loss_pytorch `focalloss.py`, which takes `pt` from `logpt.data.exp()` (detached).
Here the data is tabular, not CIFAR: 12 raw (unstandardised) features whose per-row magnitude is log-normal, like
transaction amounts; classes 90% / 8% / 2%; a 12-64-64-3 MLP; the minority classes are resampled to balance with
`torch.utils.data.WeightedRandomSampler(1 / class_count[y], num_samples=len(train), replacement=True)`; batch 128
(40 batches an epoch); the metric is balanced accuracy on a held-out split (its prevalence is not resampled).

Runs
- healthy: gamma = 2 (the paper's default), base lr 0.02 with the 5-epoch warm-up, 30 epochs. The focal loss is
  tiny by nature (easy examples are down-weighted by (1-p)^2, so it sits around 1e-2 to 1e-4 while the balanced
  accuracy climbs to 0.83-0.99 by epoch 30); the checkpoint is the epoch-10 one, still improving.
- focal_gamma_half_nan: the owner swept gamma and tried gamma = 0.5 (the paper's table lists 0.5). After 60-90
  steps the loss turns NaN and every weight after it. Cause: `(1 - p) ** 0.5` has an infinite derivative at p = 1;
  once any example is fitted with a logit margin above ~17 in fp32, `p = exp(-ce)` rounds to exactly 1.0 and the
  backward of the power gives inf * 0 = NaN for the whole batch. This is a known report of exactly this:
  liuyuisanai/Focal-Loss#11 "When gamma set below 1, loss will go to nan", clcarwin/focal_loss_pytorch#13,
  kaidic/LDAM-DRW#17 (gamma=0.5 NaN with this very focal_loss), kornia/kornia#918 "NaN gradients on backward pass
  with focal loss" (0 < gamma < 1, fixed by adding eps inside the power), fizyr/keras-retinanet#706.
  Root cause `numerical_instability`: a NaN in fp32, at any LR, made by one op (the pow in the loss); the fix is
  numerical, `(1 - p + 1e-6) ** gamma` (variant `focal_eps`, kornia's fix), which trains to the healthy accuracy.
  Competing fixes a user tries first: lr x0.1 (`lr_0.002`: the margins grow more slowly, the NaN still comes, a few
  hundred steps later) and gradient clipping at 1.0 (`clip_grad_1`: clipping a NaN gradient gives NaN). The
  checkpoint is the last per-epoch one with finite weights before the NaN (epoch 1, step 40).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="focal_loss_imbalanced",
    kind="imbalanced classification (focal loss + resampling)",
    original="kaidic/LDAM-DRW: losses.py (FocalLoss / focal_loss) + cifar_train.py (--loss_type Focal, "
             "--train_rule Resample, adjust_learning_rate warm-up, save_checkpoint)",
    runs={
        "healthy": Run(cause="healthy", story="Focal loss gamma=2 with class-balanced resampling on a 90/8/2 "
                       "tabular problem; the loss is tiny by nature and the balanced accuracy climbs past 0.8 (chance 0.33). "
                       "Checkpoint at epoch 10, still improving."),
        "focal_gamma_half_nan": Run(
            cause="numerical_instability",
            story="I tried gamma=0.5 instead of 2 and the loss went to NaN in the second epoch, every time. "
                  "Lowering the learning rate only postponed it and gradient clipping did nothing.",
            fix="focal_eps", competing=("lr_0.002", "clip_grad_1")),
    },
)

N_TRAIN, N_VAL, N_FEAT, BATCH, EPOCHS, WARMUP = 5120, 1024, 12, 128, 30, 5
MOMENTUM, WEIGHT_DECAY = 0.9, 2e-4


def make_data(seed):
    g = torch.Generator().manual_seed(7300 + seed)
    n = N_TRAIN + N_VAL
    y = torch.multinomial(torch.tensor([0.90, 0.08, 0.02]), n, replacement=True, generator=g)
    centers = torch.randn(3, N_FEAT, generator=g)
    x = centers[y] + torch.randn(n, N_FEAT, generator=g)
    x = x * torch.exp(0.5 * torch.randn(n, 1, generator=g))        # raw magnitudes: log-normal per row
    return (x[:N_TRAIN], y[:N_TRAIN]), (x[N_TRAIN:], y[N_TRAIN:])


def focal_loss(input_values, gamma, eps=0.0):
    p = torch.exp(-input_values)
    return ((1 - p + eps) ** gamma * input_values).mean()


class FocalLoss(nn.Module):
    def __init__(self, weight=None, gamma=0.0, eps=0.0):
        super().__init__()
        assert gamma >= 0
        self.gamma, self.weight, self.eps = gamma, weight, eps

    def forward(self, input, target):
        return focal_loss(F.cross_entropy(input, target, reduction="none", weight=self.weight), self.gamma,
                          self.eps)


def make_model():
    return nn.Sequential(nn.Linear(N_FEAT, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


def config(run, variant):
    gamma = 2.0 if run == "healthy" else 0.5
    lr = 0.02
    eps = 1e-6 if variant == "focal_eps" else 0.0
    if variant == "lr_0.002":
        lr = 0.002
    clip = 1.0 if variant == "clip_grad_1" else None
    return gamma, lr, eps, clip


def build(run, variant=None, seed=0):
    torch.manual_seed(seed)
    gamma, lr, eps, clip = config(run, variant)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    criterion = FocalLoss(gamma=gamma, eps=eps)
    return model, optimizer, criterion, lr, clip


def train_loader(train_ds, seed):
    x, y = train_ds
    class_count = torch.bincount(y, minlength=3).float()
    weights = (1.0 / class_count)[y].double()
    sampler = WeightedRandomSampler(weights, num_samples=len(y), replacement=True,
                                    generator=torch.Generator().manual_seed(seed))
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, sampler=sampler)


def adjust_learning_rate(optimizer, epoch, base_lr):
    epoch = epoch + 1
    lr = base_lr * epoch / WARMUP if epoch <= WARMUP else base_lr
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


@torch.no_grad()
def balanced_accuracy(model, ds):
    x, y = ds
    logits = model(x)
    if not torch.isfinite(logits).all():
        return float("nan")
    pred = logits.argmax(1)
    return float(sum(((pred == y) & (y == c)).sum() / (y == c).sum() for c in range(3)) / 3)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_ds, val_ds = make_data(seed)
    model, optimizer, criterion, base_lr, clip = build(run, variant, seed)
    loader = train_loader(train_ds, seed)
    ckpt = Path(out_dir) / "ckpt.pth.tar"
    losses, vals = [], []
    nan_step, step, best_acc1 = None, 0, 0.0
    for epoch in range(EPOCHS):
        adjust_learning_rate(optimizer, epoch, base_lr)
        model.train()
        for x, y in loader:
            output = model(x)
            loss = criterion(output, y)
            optimizer.zero_grad()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            step += 1
            losses.append(loss.item())
            if nan_step is None and not (torch.isfinite(loss) and all(torch.isfinite(p).all()
                                                                     for p in model.parameters())):
                nan_step = step
                break
        if nan_step is not None:
            break
        acc = balanced_accuracy(model, val_ds)
        vals.append(acc)
        best_acc1 = max(best_acc1, acc)
        if run != "healthy" or epoch + 1 <= 10:
            torch.save({"epoch": epoch + 1, "arch": "mlp", "state_dict": model.state_dict(),
                        "best_acc1": best_acc1, "optimizer": optimizer.state_dict()}, ckpt)
    final = balanced_accuracy(model, val_ds) if nan_step is None else float("nan")
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=[],
                   metrics={"nan_step": -1 if nan_step is None else nan_step, "balanced_acc": final,
                            "steps": step})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["nan_step"] >= 0:
        step = int(m["nan_step"])
        return (f"loss/weights went to NaN at step {step} (epoch {(step - 1) // (N_TRAIN // BATCH)}), "
                f"first loss {trained.train_losses[0]:.3f}")
    if not m["balanced_acc"] >= 0.70:
        return f"val balanced accuracy only {m['balanced_acc']:.3f} after {int(m['steps'])} steps"
    return None


def _setup(run):
    import triage

    train_ds, val_ds = make_data(0)
    model, optimizer, criterion, base_lr, _ = build(run, None, 0)
    batches = list(train_loader(train_ds, 0))
    xv, yv = val_ds
    val_batches = [(xv[i:i + BATCH], yv[i:i + BATCH]) for i in range(0, len(xv), BATCH)]

    def loss_fn(model, batch):
        x, y = batch
        return criterion(model(x), y)

    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        val_batches=val_batches, total_steps=EPOCHS * (N_TRAIN // BATCH))


def setup_healthy():
    return _setup("healthy")


def setup_focal_gamma_half_nan():
    return _setup("focal_gamma_half_nan")
