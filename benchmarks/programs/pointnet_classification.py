"""PointNet classification of synthetic point clouds, with the feature-transform regulariser and a StepLR.

What it does: eight kinds of 3-D shape surfaces (sphere, cube, cylinder, cone, torus, square plate, square
pyramid, capsule) are sampled as 128-point clouds in code, randomly rotated about the up axis, scaled,
jittered, centred and normalised into the unit sphere as the ModelNet loaders do. A PointNet (input T-Net,
shared per-point MLP as Conv1d + BatchNorm, a 32x32 feature T-Net, symmetric max pooling, an FC head with
dropout) is trained with `nll_loss` on `log_softmax` outputs plus 0.001 times the feature-transform
regulariser ||I - A A^T||, Adam (lr 1e-3, weight decay 1e-4) and StepLR(step_size=20, gamma=0.5) stepped once
per epoch, evaluated on a held-out test set every epoch.

Public originals read (with the `search` tool, code corpus): fxia22/pointnet.pytorch (`pointnet/model.py`:
STN3d, STNkd, PointNetfeat with `feature_transform`, `feature_transform_regularizer`; `utils/train_classification.py`:
`loss = F.nll_loss(pred, target); if opt.feature_transform: loss += feature_transform_regularizer(trans_feat)
* 0.001`, Adam betas (0.9, 0.999), `StepLR(step_size=20, gamma=0.5)` stepped per epoch: the gamma used here) and yanx27/Pointnet_Pointnet2_pytorch
(`train_classification.py`: Adam lr 0.001 weight decay 1e-4, `StepLR(step_size=20, gamma=0.7)`, checkpoint
dict with `epoch`, `instance_acc`, `model_state_dict`, `optimizer_state_dict`; `models/pointnet_cls.py`
`get_loss`: nll + 0.001 * mat_diff_loss). Sizes are shrunk (conv widths 32/64/256, 128 points) to fit a CPU.

The loss is handed to triage as named terms: the regulariser is `auxiliary_terms=("mat_diff",)`.

Runs
- healthy: the scheduler stepped once an epoch (`Setup(scheduler_interval="epoch", steps_per_epoch=15)`);
  checkpoint at the end of epoch 12 of a planned 200, train loss still falling.
- scheduler_per_batch (cause `lr_schedule_decayed`): the owner moved `scheduler.step()` into the batch loop
  (next to `optimizer.step()`, as in the PyTorch >= 1.1 warning about the call order) while keeping
  `step_size=20` meant in epochs. The LR is multiplied by 0.5 every 20 *iterations*: after 12 epochs of 15
  batches it is 1e-3 x 0.5^9 ~ 2e-6 and falling, and the loss flattens well above where the healthy run
  is; the owner sees "the loss stopped improving after epoch 3". Real: hazdzz/stgcn issue #18 ("the
  position of scheduler.step() ... leads to the learning-rate decrease too fast"), pytorch/tutorials PR #640
  ("scheduler.step() per epoch not per batch"). The decisive experiment is the scheduler's LR at the
  checkpoint, ~0 against its peak: `lr_schedule_decayed`. Fix (`step_per_epoch`): step the scheduler once an
  epoch. Competing: training twice as long (`more_epochs`: the LR is ~0, nothing moves) and dropping the
  feature-transform regulariser (`no_mat_diff_reg`, the suspect a PointNet user blames for a stuck loss).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="pointnet_classification",
    kind="point-cloud",
    original="fxia22/pointnet.pytorch utils/train_classification.py + pointnet/model.py; "
             "yanx27/Pointnet_Pointnet2_pytorch train_classification.py",
    runs={
        "healthy": Run(cause="healthy", story=(
            "PointNet with feature transform on 8 synthetic shape classes, Adam 1e-3, StepLR(20, 0.5) per "
            "epoch; at epoch 12 the train loss is still falling and test accuracy climbing.")),
        "scheduler_per_batch": Run(
            cause="lr_schedule_decayed",
            story=("I call scheduler.step() right after optimizer.step() in the batch loop; the loss dropped for "
                   "two or three epochs and then stopped moving, test accuracy stuck well below what it "
                   "should reach; training longer did not help."),
            fix="step_per_epoch", competing=("more_epochs", "no_mat_diff_reg")),
    },
)

NUM_CLASSES = 8
NUM_POINTS = 64
BATCH = 32
N_TRAIN = 480            # 15 batches an epoch
N_TEST = 256
EPOCHS = 12              # epochs to the checkpoint
PLANNED_EPOCHS = 200
LR = 1e-3
MAT_DIFF_SCALE = 0.001


# ----------------------------------------------------------------------------------------------- the data
def _surface(kind: int, n: int, g: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, generator=g)
    v = torch.rand(n, generator=g)
    two_pi = 2 * math.pi
    if kind == 0:    # sphere
        z = 2 * u - 1
        r = torch.sqrt(1 - z ** 2)
        return torch.stack([r * torch.cos(two_pi * v), r * torch.sin(two_pi * v), z], 1)
    if kind == 1:    # cube surface
        p = torch.rand(n, 3, generator=g) * 2 - 1
        face = torch.randint(0, 3, (n,), generator=g)
        sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
        p[torch.arange(n), face] = sign
        return p
    if kind == 2:    # cylinder (side and caps)
        side = u < 0.7
        ang = two_pi * v
        r = torch.where(side, torch.ones(n), torch.sqrt(torch.rand(n, generator=g)))
        z = torch.where(side, torch.rand(n, generator=g) * 2 - 1, torch.sign(torch.rand(n, generator=g) - 0.5))
        return torch.stack([r * torch.cos(ang), r * torch.sin(ang), z], 1)
    if kind == 3:    # cone
        h = torch.sqrt(u)
        return torch.stack([h * torch.cos(two_pi * v), h * torch.sin(two_pi * v), 1 - 2 * h], 1)
    if kind == 4:    # torus
        a, b = two_pi * u, two_pi * v
        return torch.stack([(1 + 0.35 * torch.cos(b)) * torch.cos(a), (1 + 0.35 * torch.cos(b)) * torch.sin(a),
                            0.35 * torch.sin(b)], 1) / 1.35
    if kind == 5:    # thin square plate
        return torch.stack([u * 2 - 1, v * 2 - 1, (torch.rand(n, generator=g) - 0.5) * 0.1], 1)
    if kind == 6:    # square pyramid (4 faces and the base)
        t = torch.sqrt(u)                       # height fraction from the apex
        side = torch.randint(0, 4, (n,), generator=g)
        s = (v * 2 - 1) * t
        x = torch.where(side < 2, s, torch.where(side == 2, t, -t))
        y = torch.where(side >= 2, s, torch.where(side == 0, t, -t))
        return torch.stack([x, y, 1 - 2 * t], 1)
    # capsule: a cylinder with hemispherical ends
    ang = two_pi * v
    zc = u * 2.0 - 1.0
    r = torch.where(zc.abs() < 0.5, torch.ones(n), torch.sqrt((1 - (2 * (zc.abs() - 0.5)) ** 2).clamp_min(0)))
    return torch.stack([0.6 * r * torch.cos(ang), 0.6 * r * torch.sin(ang), zc * 1.3], 1)


def make_clouds(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n clouds [n, 3, NUM_POINTS] (channels first, as PointNet's Conv1d reads them) and their labels."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    clouds = []
    for k in labels.tolist():
        p = _surface(k, NUM_POINTS, g)
        p = p * (0.75 + 0.5 * torch.rand(1, 3, generator=g))           # anisotropic scale
        th = 2 * math.pi * torch.rand(1, generator=g).item()             # rotation about the up axis
        rot = torch.tensor([[math.cos(th), -math.sin(th), 0.0], [math.sin(th), math.cos(th), 0.0], [0, 0, 1.0]])
        p = p @ rot.T + 0.03 * torch.randn(NUM_POINTS, 3, generator=g)    # jitter
        p = p - p.mean(0, keepdim=True)                                  # pc_normalize: centre ...
        p = p / p.norm(dim=1).max()                                      # ... and fit in the unit sphere
        clouds.append(p.T)
    return torch.stack(clouds), labels


def batches_of(x: torch.Tensor, y: torch.Tensor, order: torch.Tensor | None = None):
    idx = order if order is not None else torch.arange(len(x))
    return [(x[idx[i:i + BATCH]], y[idx[i:i + BATCH]]) for i in range(0, len(idx) - BATCH + 1, BATCH)]


# ---------------------------------------------------------------------------------------------- the model
class STNkd(nn.Module):
    """The T-Net: a k x k transform regressed from the cloud, initialised at the identity by its bias."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k
        self.conv1, self.conv2, self.conv3 = nn.Conv1d(k, 32, 1), nn.Conv1d(32, 64, 1), nn.Conv1d(64, 128, 1)
        self.fc1, self.fc2, self.fc3 = nn.Linear(128, 64), nn.Linear(64, 32), nn.Linear(32, k * k)
        self.bn1, self.bn2, self.bn3 = nn.BatchNorm1d(32), nn.BatchNorm1d(64), nn.BatchNorm1d(128)
        self.bn4, self.bn5 = nn.BatchNorm1d(64), nn.BatchNorm1d(32)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.relu(self.bn3(self.conv3(x)))
        x = torch.max(x, 2)[0]
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.fc2(x)))
        x = self.fc3(x)
        iden = torch.eye(self.k, dtype=x.dtype, device=x.device).flatten()
        return (x + iden).view(-1, self.k, self.k)


class PointNetCls(nn.Module):
    def __init__(self, k: int = NUM_CLASSES, feat: int = 16):
        super().__init__()
        self.stn = STNkd(3)
        self.conv1, self.bn1 = nn.Conv1d(3, feat, 1), nn.BatchNorm1d(feat)
        self.fstn = STNkd(feat)
        self.conv2, self.bn2 = nn.Conv1d(feat, 64, 1), nn.BatchNorm1d(64)
        self.conv3, self.bn3 = nn.Conv1d(64, 256, 1), nn.BatchNorm1d(256)
        self.fc1, self.bn4 = nn.Linear(256, 128), nn.BatchNorm1d(128)
        self.fc2, self.bn5 = nn.Linear(128, 64), nn.BatchNorm1d(64)
        self.dropout = nn.Dropout(p=0.3)
        self.fc3 = nn.Linear(64, k)

    def forward(self, x):
        trans = self.stn(x)
        x = torch.bmm(x.transpose(2, 1), trans).transpose(2, 1)
        x = F.relu(self.bn1(self.conv1(x)))
        trans_feat = self.fstn(x)
        x = torch.bmm(x.transpose(2, 1), trans_feat).transpose(2, 1)
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.bn3(self.conv3(x))
        x = torch.max(x, 2)[0]                                     # the symmetric function
        x = F.relu(self.bn4(self.fc1(x)))
        x = F.relu(self.bn5(self.dropout(self.fc2(x))))
        return F.log_softmax(self.fc3(x), dim=1), trans, trans_feat


def feature_transform_regularizer(trans: torch.Tensor) -> torch.Tensor:
    d = trans.size(1)
    eye = torch.eye(d, dtype=trans.dtype, device=trans.device)[None]
    return torch.mean(torch.norm(torch.bmm(trans, trans.transpose(2, 1)) - eye, dim=(1, 2)))


def make_loss(mat_diff_scale: float = MAT_DIFF_SCALE):
    def loss_fn(model, batch):
        points, target = batch
        pred, _, trans_feat = model(points)
        return {"nll": F.nll_loss(pred, target),
                "mat_diff": feature_transform_regularizer(trans_feat) * mat_diff_scale}
    return loss_fn


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = PointNetCls()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    return model, optimizer, scheduler


# ---------------------------------------------------------------------------------------------- training
def _config(run: str, variant: str | None) -> dict:
    cfg = {"per_batch": run == "scheduler_per_batch", "epochs": EPOCHS, "mat_diff": MAT_DIFF_SCALE}
    if variant == "step_per_epoch":
        cfg["per_batch"] = False
    elif variant == "more_epochs":
        cfg["epochs"] = 2 * EPOCHS
    elif variant == "no_mat_diff_reg":
        cfg["mat_diff"] = 0.0
    elif variant is not None:
        raise ValueError(f"unknown variant {variant!r}")
    return cfg


def _evaluate(model, test_batches) -> tuple[float, float]:
    model.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for points, target in test_batches:
            pred, _, _ = model(points)
            loss += float(F.nll_loss(pred, target, reduction="sum"))
            correct += int((pred.argmax(1) == target).sum())
            n += len(target)
    model.train()
    return loss / n, correct / n


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = _config(run, variant)
    x_train, y_train = make_clouds(N_TRAIN, seed)
    test_batches = batches_of(*make_clouds(N_TEST, 1000 + seed))
    model, optimizer, scheduler = build(seed)
    loss_fn = make_loss(cfg["mat_diff"])
    shuffle = torch.Generator().manual_seed(seed)

    epoch_losses, val_losses, accs = [], [], []
    for epoch in range(cfg["epochs"]):
        model.train()
        total = []
        for points, target in batches_of(x_train, y_train, torch.randperm(N_TRAIN, generator=shuffle)):
            optimizer.zero_grad()
            terms = loss_fn(model, (points, target))
            loss = terms["nll"] + terms["mat_diff"]
            loss.backward()
            optimizer.step()
            if cfg["per_batch"]:
                scheduler.step()          # the fault: StepLR(step_size=20) stepped every iteration
            total.append(float(terms["nll"].detach()))
        if not cfg["per_batch"]:
            scheduler.step()
        epoch_losses.append(sum(total) / len(total))
        val_loss, acc = _evaluate(model, test_batches)
        val_losses.append(val_loss)
        accs.append(acc)
    ckpt = out_dir / "last_model.pth"
    torch.save({"epoch": cfg["epochs"], "instance_acc": accs[-1], "model_state_dict": model.state_dict(),
                "optimizer_state_dict": optimizer.state_dict()}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=epoch_losses, val_losses=val_losses,
                   metrics={"test_acc": accs[-1], "lr": optimizer.param_groups[0]["lr"]})


def symptom(run: str, trained: Trained) -> str | None:
    losses = trained.train_losses
    e = len(losses)
    mid = losses[e // 2]
    if losses[-1] > 0.9 * mid:
        return (f"train loss {mid:.3f} at epoch {e // 2 + 1} -> {losses[-1]:.3f} at epoch {e} (flat), "
                f"test accuracy {trained.metrics['test_acc']:.1%}; lr now {trained.metrics['lr']:.1e}")
    return None


# ---------------------------------------------------------------------------------------------- setups
def _setup(per_batch: bool):
    import triage

    model, optimizer, scheduler = build(0)
    x_train, y_train = make_clouds(N_TRAIN, 0)
    g = torch.Generator().manual_seed(7)
    train_batches = []
    while len(train_batches) < 48:                      # a few shuffled epochs: 48 batches
        train_batches += batches_of(x_train, y_train, torch.randperm(N_TRAIN, generator=g))
    train_batches = train_batches[:48]
    kwargs = dict(model=model, optimizer=optimizer, scheduler=scheduler, loss_fn=make_loss(),
                  auxiliary_terms=("mat_diff",), batches=train_batches,
                  val_batches=batches_of(*make_clouds(N_TEST, 1000)), steps_per_epoch=N_TRAIN // BATCH)
    if per_batch:
        return triage.Setup(**kwargs, scheduler_interval="step", total_steps=PLANNED_EPOCHS * (N_TRAIN // BATCH))
    return triage.Setup(**kwargs, scheduler_interval="epoch", total_steps=PLANNED_EPOCHS * (N_TRAIN // BATCH))


def setup_healthy():
    return _setup(per_batch=False)


def setup_scheduler_per_batch():
    return _setup(per_batch=True)


if __name__ == "__main__":
    import sys
    import time
    run = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    t = time.perf_counter()
    tr = train(run, Path("/tmp/pointnet_out"), seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0,
               variant=sys.argv[3] if len(sys.argv) > 3 else None)
    print(f"{time.perf_counter() - t:.1f} s", [round(x, 3) for x in tr.train_losses],
          [round(x, 3) for x in tr.val_losses], tr.metrics)
    print(symptom(run, tr))
