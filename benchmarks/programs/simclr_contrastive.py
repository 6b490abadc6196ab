"""SimCLR: two augmented views per image, an encoder + projection head, the NT-Xent (InfoNCE) loss.

Follows sthalles/SimCLR (simclr.py `info_nce_loss` and `train`, models/resnet_simclr.py): the backbone's `fc`
replaced by a projection MLP; both views in one batch of 2N; features L2-normalised, the 2N x 2N similarity matrix
with its diagonal removed, the positive of each row moved to column 0 and `CrossEntropyLoss` against label 0 on
logits / temperature (0.07); `Adam(lr=3e-4, weight_decay=1e-4)`; `CosineAnnealingLR(T_max=len(train_loader))`
stepped once an epoch after the first 10 epochs; checkpoints `{'epoch', 'arch', 'state_dict', 'optimizer'}`.
torchvision is unavailable: images are scikit-learn's bundled 8x8 digits, the ResNet a small conv net, and the
augmentations (random shift, random intensity scaling, pixel noise, random erasing of a 3x3 patch) are written in
torch. The fp16 GradScaler of the original is left out (CPU).

Runs
- healthy: the whole network trains; checkpoint at epoch 3 of 8 while the loss still falls.
- backbone_left_frozen: the user's notebook ran the repo's linear-evaluation cell first -- it sets
  `requires_grad = False` on every parameter whose name is not `fc.weight`/`fc.bias` -- and then started
  pre-training in the same session. Only the last projection layer learns; the conv encoder stays at its random
  init and the NT-Xent loss stalls far above the healthy run's. Root cause: frozen_parameters (the fix is to
  unfreeze the encoder). Competing fix a user tries first: a 10x higher LR (the one trainable layer cannot make
  random features augmentation-invariant). The checkpoint is the epoch-4 one, once the stall shows.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="simclr_contrastive",
    kind="self-supervised",
    original="sthalles/SimCLR: simclr.py (info_nce_loss, train) + models/resnet_simclr.py",
    runs={
        "healthy": Run(cause="healthy", story="SimCLR on digits; the NT-Xent loss falls; checkpoint at epoch 3 "
                                              "of 6."),
        "backbone_left_frozen": Run(
            cause="frozen_parameters",
            story="I ran the linear-eval cell (freeze all but fc) before pre-training in the same notebook; the "
                  "contrastive loss barely moves.",
            fix="unfreeze",
            competing=("lr_x10",),
        ),
    },
)

BATCH = 64           # N images -> 2N views
EPOCHS = 8
TEMPERATURE = 0.07
N_VIEWS = 2


def load_images(seed):
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().images, dtype=torch.float32).unsqueeze(1) / 16.0
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(7000 + seed))
    return x[perm[:768]]


def augment(x, g):
    n = len(x)
    dx, dy = torch.randint(-1, 2, (2,), generator=g).tolist()
    out = torch.roll(x, shifts=(dy, dx), dims=(2, 3))
    out = out * (0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=g))
    out = out + 0.15 * torch.randn(out.shape, generator=g)
    i, j = torch.randint(0, 6, (2,), generator=g).tolist()
    erase = torch.rand(n, generator=g) < 0.5
    out[erase, :, i:i + 3, j:j + 3] = 0.0
    return out


def epoch_batches(images, seed, epoch):
    g = torch.Generator().manual_seed(seed * 100 + epoch)
    perm = torch.randperm(len(images), generator=g)
    out = []
    for s in range(0, len(images), BATCH):
        x = images[perm[s:s + BATCH]]
        out.append(torch.cat([augment(x, g), augment(x, g)]))    # the two views, stacked as in the repo
    return out


class ResNetSimCLR(nn.Module):
    def __init__(self, out_dim=32):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 64), nn.ReLU())
        self.fc = nn.Linear(64, out_dim)

    def forward(self, x):
        return self.fc(self.backbone(x))


def info_nce_loss(features, batch_size):
    labels = torch.cat([torch.arange(batch_size) for _ in range(N_VIEWS)], dim=0)
    labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
    features = F.normalize(features, dim=1)
    similarity_matrix = torch.matmul(features, features.T)
    mask = torch.eye(labels.shape[0], dtype=torch.bool)
    labels = labels[~mask].view(labels.shape[0], -1)
    similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)
    positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)
    negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)
    logits = torch.cat([positives, negatives], dim=1) / TEMPERATURE
    labels = torch.zeros(logits.shape[0], dtype=torch.long)
    return logits, labels


criterion = nn.CrossEntropyLoss()


def simclr_loss(model, images):
    features = model(images)
    logits, labels = info_nce_loss(features, images.shape[0] // N_VIEWS)
    return criterion(logits, labels)


def _build(run, seed, variant):
    torch.manual_seed(seed)
    model = ResNetSimCLR()
    if run == "backbone_left_frozen" and variant != "unfreeze":
        # the linear-evaluation cell, run earlier in the same notebook session
        for name, param in model.named_parameters():
            if name not in ["fc.weight", "fc.bias"]:
                param.requires_grad = False
    lr = 3e-4 * (10 if variant == "lr_x10" else 1) * 3
    optimizer = torch.optim.Adam(model.parameters(), lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=16, eta_min=0, last_epoch=-1)
    return model, optimizer, scheduler


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    images = load_images(seed)
    model, optimizer, scheduler = _build(run, seed, variant)
    ckpt_epoch = 3 if run == "healthy" else 4
    ckpt = out_dir / f"checkpoint_{ckpt_epoch:04d}.pth.tar"
    losses, top1 = [], []
    for epoch_counter in range(EPOCHS):
        model.train()
        for images_2n in epoch_batches(images, seed, epoch_counter):
            loss = simclr_loss(model, images_2n)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        if epoch_counter >= 10:   # warmup for the first 10 epochs, as in the repo (never reached here)
            scheduler.step()
        if epoch_counter + 1 == ckpt_epoch:
            torch.save({"epoch": epoch_counter + 1, "arch": "convnet_small", "state_dict": model.state_dict(),
                        "optimizer": optimizer.state_dict()}, ckpt)
    n = len(images) // BATCH
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"first_epoch": sum(losses[:n]) / n, "last_epoch": sum(losses[-n:]) / n})


def symptom(run: str, trained: Trained) -> str | None:
    a, b = trained.metrics["first_epoch"], trained.metrics["last_epoch"]
    if b > 0.9 * float(torch.log(torch.tensor(2.0 * BATCH - 1))):
        return (f"NT-Xent loss stalled near chance: {a:.2f} in epoch 1 -> {b:.2f} in epoch {EPOCHS} "
                f"(ln(2N-1) = {torch.log(torch.tensor(2.0 * BATCH - 1)):.2f})")
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    images = load_images(0)
    model, optimizer, scheduler = _build(run, 0, None)
    start = 3 if run == "healthy" else 4
    batches = []
    for e in range(start, start + 4):
        batches += epoch_batches(images, 0, e)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=simclr_loss, batches=batches[:48])


def setup_healthy():
    return _setup("healthy")


def setup_backbone_left_frozen():
    return _setup("backbone_left_frozen")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 2) for x in tr.train_losses[::16]])
