"""SimSiam (stop-gradient Siamese self-supervision) on augmented 8x8 digits, after facebookresearch/simsiam.

What it does
------------
Self-supervised pre-training of a small encoder on scikit-learn's bundled digits (8x8 images, no labels used
for training). Each image is augmented twice in code (random 1-pixel translation, contrast/brightness
jitter, Gaussian noise, random erasing of a patch: a small stand-in for the original's RandomResizedCrop /
ColorJitter / blur). The encoder is an MLP backbone plus SimSiam's projector (three layers, each followed
by BatchNorm, the last BN without affine), the predictor a bottleneck MLP (Linear-BN-ReLU-Linear). The loss
is SimSiam's symmetrised negative cosine similarity,
    L = -0.5 * (cos(p1, stopgrad(z2)) + cos(p2, stopgrad(z1))),
so it is negative by nature, with a floor of -1 that a healthy run approaches but never needs to reach. The
optimizer is SGD (momentum 0.9, weight decay 1e-4) at init_lr = base_lr * batch_size / 256 on two param
groups, the encoder's and the predictor's (`fix_lr`: the predictor keeps init_lr, "--fix-pred-lr"), and
`adjust_learning_rate` sets a half-cosine LR by hand once an epoch. The checkpoint is main_simsiam's
`save_checkpoint({'epoch', 'arch', 'state_dict', 'optimizer'})`, written after each epoch.

Public original
---------------
facebookresearch/simsiam `main_simsiam.py` (TwoCropsTransform, `criterion = nn.CosineSimilarity(dim=1)`,
`loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5`, `init_lr = args.lr * args.batch_size
/ 256`, the `fix_lr` param group, `adjust_learning_rate` per epoch, the checkpoint dict) and
`simsiam/builder.py` (projector with BN after every layer, `self.encoder.fc[6].bias.requires_grad = False`
for the BN-ended projector, predictor bottleneck, `return p1, p2, z1.detach(), z2.detach()`). Read with the
`search` tool. (The brief allowed BYOL or SimSiam; this is SimSiam, the stop-gradient branch.)

Triage setup: the checkpoint's step is its `epoch` with `steps_per_epoch` given; no scheduler object (the LR is
set by hand each epoch and saved in the optimizer's groups); the snapshot is the augmented pairs of the
epochs after the checkpoint, as the DataLoader gives them: `([x1, x2], label)` with the label unused by the
loss. The collapse measure is read on held-out digits: the per-channel std of the l2-normalised projector
output z (SimSiam's own collapse monitor; about 1/sqrt(64) = 0.125 when healthy, towards 0 when collapsed)
and the effective rank of z.

Runs
----
healthy: the run as main_simsiam writes it, 50 epochs of 11 steps. The loss falls from about -0.07 to about
    -0.74 (never near -1); z's std stays at 1/sqrt(d) and the held-out kNN accuracy on z stays near 0.9 (a
    random encoder already scores about 0.95 on these easy digits: the point of the check is that it does not
    collapse). Checkpoint after epoch 15 (LR still high, loss still falling).

no_stop_gradient (cause `wrong_loss`): the user wrote the model's forward as `return p1, p2, z1, z2` (no
    `.detach()`), as several re-implementations did (lightly-ai/lightly issue #559 "The gradient of
    projection haven't been detached in this implementation of SimSiam"; PatrickHua/SimSiam issues #22 and
    #39 ask where the stop-gradient is). Without it the objective has a trivial minimiser: both branches
    agree by emitting the same vector for every input, and the loss drops to -1 within an epoch or two while
    the representation collapses (the SimSiam paper's Fig. 2; facebookresearch/simsiam issues #29 and #40,
    "loss collapses to -1 very quickly"). The fault is the objective as written (the stop-gradient is part of
    SimSiam's loss, D(p1, stopgrad(z2))), and restoring it is the fix: `wrong_loss`. Competing fixes: the
    one answered in those threads, "try larger batch size and smaller learning rate" (leftthomas/SimSiam#1),
    as batch 256 instead of 128, and turning off --fix-pred-lr (the predictor's constant LR is the other
    knob main_simsiam exposes); both still collapse. (A 10x smaller LR only delays the collapse past this
    run's 50 epochs in some seeds, so it is not used as a competing fix.)
    Symptom: the last epoch's loss below -0.85 (healthy: -0.74) or held-out kNN accuracy on z below 0.80
    (healthy: 0.87 to 0.92; collapsed: 0.64 to 0.77). Checkpoint after epoch 8, once the loss is below the
    healthy run's and the kNN accuracy has fallen.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import triage

if __package__ in (None, ""):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

BATCH = 128
BASE_LR = 0.4
MOMENTUM = 0.9
WD = 1e-4
EPOCHS = 50
CKPT_EPOCH = {"healthy": 15, "no_stop_gradient": 8}
DIM, PRED_DIM, HID = 64, 16, 128

PROGRAM = Program(
    name="byol_ema",
    kind="self-supervised-ema",
    original="facebookresearch/simsiam main_simsiam.py + simsiam/builder.py",
    runs={
        "healthy": Run(
            cause="healthy",
            story="SimSiam pre-training on augmented digits: the negative-cosine loss falls from about -0.1 "
                  "towards -0.9 (its floor is -1) and the projector output keeps its spread across channels. "
                  "Checkpoint mid-run.",
        ),
        "no_stop_gradient": Run(
            cause="wrong_loss",
            story="My SimSiam forward returns z1, z2 without .detach(). The loss dives towards -1 and the "
                  "embeddings collapse: nearest-neighbour accuracy on held-out digits falls from 0.95 to "
                  "about 0.7. A larger batch (what the issue threads advise) and turning off --fix-pred-lr "
                  "did not help.",
            fix="stop_gradient",
            competing=("larger_batch", "no_fix_pred_lr"),
        ),
    },
)


# ----------------------------------------------------------------------------------------------- data
def digits(seed: int):
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32) / 16.0          # N x 8 x 8
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    n = x.size(0)
    padded = F.pad(x, (1, 1, 1, 1))
    dx = torch.randint(0, 3, (n,), generator=g)
    dy = torch.randint(0, 3, (n,), generator=g)
    rows = (dy[:, None] + torch.arange(8)[None, :])                  # n x 8
    cols = (dx[:, None] + torch.arange(8)[None, :])
    out = padded[torch.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
    contrast = 0.6 + 0.8 * torch.rand(n, 1, 1, generator=g)
    bright = 0.2 * (torch.rand(n, 1, 1, generator=g) - 0.5)
    out = out * contrast + bright + 0.1 * torch.randn(out.shape, generator=g)
    er = torch.rand(n, generator=g) < 0.5                            # random erasing of a 3x3 patch
    ex = torch.randint(0, 6, (n,), generator=g)
    ey = torch.randint(0, 6, (n,), generator=g)
    mask = torch.ones_like(out)
    for i in torch.nonzero(er).flatten().tolist():
        mask[i, ey[i]:ey[i] + 3, ex[i]:ex[i] + 3] = 0
    return (out * mask).reshape(n, 64)


def epoch_batches(x: torch.Tensor, y: torch.Tensor, epoch: int, seed: int, batch: int = BATCH):
    """One epoch of the two-crop DataLoader (shuffle, drop_last): a list of ([x1, x2], label)."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(x), generator=g)
    out = []
    for i in range(0, len(x) - batch + 1, batch):
        idx = perm[i:i + batch]
        out.append(([augment(x[idx], g), augment(x[idx], g)], y[idx]))
    return out


# ---------------------------------------------------------------------------------------------- model
class SimSiam(nn.Module):
    def __init__(self, stop_gradient: bool = True):
        super().__init__()
        self.stop_gradient = stop_gradient
        self.encoder = nn.Sequential(                                  # backbone + 3-layer projector
            nn.Linear(64, HID, bias=False), nn.BatchNorm1d(HID), nn.ReLU(inplace=True),
            nn.Linear(HID, HID, bias=False), nn.BatchNorm1d(HID), nn.ReLU(inplace=True),
            nn.Linear(HID, DIM, bias=False), nn.BatchNorm1d(DIM, affine=False))
        self.predictor = nn.Sequential(
            nn.Linear(DIM, PRED_DIM, bias=False), nn.BatchNorm1d(PRED_DIM), nn.ReLU(inplace=True),
            nn.Linear(PRED_DIM, DIM))

    def forward(self, x1, x2):
        z1 = self.encoder(x1)
        z2 = self.encoder(x2)
        p1 = self.predictor(z1)
        p2 = self.predictor(z2)
        if self.stop_gradient:
            return p1, p2, z1.detach(), z2.detach()
        return p1, p2, z1, z2                                          # the fault: no stop-gradient


criterion = nn.CosineSimilarity(dim=1)


def loss_fn(model: SimSiam, batch):
    images, _ = batch
    p1, p2, z1, z2 = model(x1=images[0], x2=images[1])
    return -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5


def build(run: str, variant: str | None, batch: int = BATCH):
    model = SimSiam(stop_gradient=(run != "no_stop_gradient" or variant == "stop_gradient"))
    base_lr = BASE_LR * (0.1 if variant == "lower_lr" else 1.0)
    init_lr = base_lr * batch / 256
    optim_params = [{"params": model.encoder.parameters(), "fix_lr": False},
                    {"params": model.predictor.parameters(), "fix_lr": variant != "no_fix_pred_lr"}]
    optimizer = torch.optim.SGD(optim_params, init_lr, momentum=MOMENTUM, weight_decay=WD)
    return model, optimizer, init_lr


def adjust_learning_rate(optimizer, init_lr, epoch, epochs):
    cur_lr = init_lr * 0.5 * (1. + math.cos(math.pi * epoch / epochs))
    for param_group in optimizer.param_groups:
        if param_group.get("fix_lr"):
            param_group["lr"] = init_lr
        else:
            param_group["lr"] = cur_lr


@torch.no_grad()
def collapse_stats(model: SimSiam, x_val: torch.Tensor) -> tuple[float, float]:
    was = model.training
    model.eval()
    z = F.normalize(model.encoder(x_val.reshape(len(x_val), 64)), dim=1)
    model.train(was)
    std = z.std(dim=0).mean().item()
    s = torch.linalg.svdvals(z - z.mean(0))
    p = s / s.sum()
    erank = math.exp(-(p * torch.log(p + 1e-12)).sum().item())
    return std, erank


@torch.no_grad()
def knn_accuracy(model: SimSiam, x_tr, y_tr, x_val, y_val, k: int = 10) -> float:
    """kNN (cosine, k=10) accuracy of the held-out digits on the normalised projector output z."""
    was = model.training
    model.eval()
    f_tr = F.normalize(model.encoder(x_tr.reshape(len(x_tr), 64)), dim=1)
    f_val = F.normalize(model.encoder(x_val.reshape(len(x_val), 64)), dim=1)
    model.train(was)
    idx = (f_val @ f_tr.T).topk(k, dim=1).indices
    votes = torch.zeros(len(x_val), 10).scatter_add_(1, y_tr[idx], torch.ones(len(x_val), k))
    return (votes.argmax(1) == y_val).float().mean().item()


# ---------------------------------------------------------------------------------------------- train
def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    batch = 256 if variant == "larger_batch" else BATCH
    model, optimizer, init_lr = build(run, variant, batch)
    (x_tr, y_tr), (x_val, y_val) = digits(seed)
    knn0 = knn_accuracy(model, x_tr, y_tr, x_val, y_val)
    losses, epoch_loss = [], []
    ckpt = out_dir / "checkpoint.pth.tar"
    for epoch in range(EPOCHS):
        adjust_learning_rate(optimizer, init_lr, epoch, EPOCHS)
        model.train()
        running = []
        for images, _ in epoch_batches(x_tr, y_tr, epoch, seed, batch):
            p1, p2, z1, z2 = model(x1=images[0], x2=images[1])
            loss = -(criterion(p1, z2).mean() + criterion(p2, z1).mean()) * 0.5
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            running.append(loss.item())
        epoch_loss.append(float(np.mean(running)))
        if epoch + 1 == CKPT_EPOCH[run]:
            torch.save({"epoch": epoch + 1, "arch": "mlp64", "state_dict": model.state_dict(),
                        "optimizer": optimizer.state_dict()}, ckpt)
            std_ck, erank_ck = collapse_stats(model, x_val)
            knn_ck = knn_accuracy(model, x_tr, y_tr, x_val, y_val)
    std, erank = collapse_stats(model, x_val)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"knn": knn_accuracy(model, x_tr, y_tr, x_val, y_val), "knn_ckpt": knn_ck,
                            "knn_init": knn0, "z_std": std, "z_erank": erank, "z_std_ckpt": std_ck, "z_erank_ckpt": erank_ck,
                            "loss_last_epoch": epoch_loss[-1], "loss_epoch2": epoch_loss[1],
                            "loss_min": min(losses)})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if not all(math.isfinite(v) for v in m.values()):
        return f"training went non-finite: {m}"
    if m["loss_last_epoch"] < -0.85 or m["knn"] < 0.80:
        return (f"representation collapsed: loss {m['loss_last_epoch']:.3f} over the last epoch (floor -1; "
                f"a healthy run sits near -0.74), held-out kNN accuracy on z {m['knn']:.3f} (at init "
                f"{m['knn_init']:.3f}, healthy about 0.87-0.92), normalised z per-channel std {m['z_std']:.3f} "
                f"(1/sqrt({DIM}) = {1 / math.sqrt(DIM):.3f} when healthy), effective rank {m['z_erank']:.1f}")
    return None


# ---------------------------------------------------------------------------------------------- setup
def _setup(run: str) -> triage.Setup:
    torch.manual_seed(0)
    model, optimizer, _ = build(run, None)
    (x_tr, y_tr), _ = digits(0)
    ck = CKPT_EPOCH[run]
    snap = []
    epoch = ck
    while len(snap) < 40:
        snap += epoch_batches(x_tr, y_tr, epoch, 0)
        epoch += 1
    steps_per_epoch = len(x_tr) // BATCH
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=snap[:42],
                        steps_per_epoch=steps_per_epoch, total_steps=EPOCHS * steps_per_epoch)


def setup_healthy() -> triage.Setup:
    return _setup("healthy")


def setup_no_stop_gradient() -> triage.Setup:
    return _setup("no_stop_gradient")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        t = time.perf_counter()
        tr = train(r, Path("/tmp/simsiam_out") / r)
        print(r, round(time.perf_counter() - t, 2), "s", {k: round(v, 3) for k, v in tr.metrics.items()},
              symptom(r, tr))
