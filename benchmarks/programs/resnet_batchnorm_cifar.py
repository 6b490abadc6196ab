"""A small CIFAR-style ResNet with BatchNorm on sklearn's 8x8 digits, trained the pytorch/examples imagenet way.

Follows pytorch/examples imagenet/main.py (read: `train()` starts with `model.train()`, `validate()` with
`model.eval()` under `torch.no_grad()`; `criterion = nn.CrossEntropyLoss()`; `torch.optim.SGD(model.parameters(),
args.lr, momentum=0.9, weight_decay=...)`; a scheduler stepped once per epoch after train and validate;
`save_checkpoint({'epoch': epoch + 1, 'arch': ..., 'state_dict': model.state_dict(), 'best_acc1': best_acc1,
'optimizer': optimizer.state_dict(), 'scheduler': scheduler.state_dict()}, is_best)`) and kuangliu/pytorch-cifar's
ResNet (BasicBlock: conv3x3-BN-ReLU-conv3x3-BN + shortcut with a 1x1 conv + BN when the shape changes; lr 0.1,
momentum 0.9, weight_decay 5e-4; CosineAnnealingLR stepped per epoch). Scaled to 8x8 digits (1 channel, 10
classes), widths 16/32, nesterov momentum, 10 epochs, batch 64.

Runs
- healthy: cross-entropy from 2.3 to ~0.002, val acc ~0.99. Checkpoint: epoch 4 of 10 (checkpoint.pth.tar), still
  improving.
- eval_mode_train: the owner moved the per-epoch validation into the training function and dropped the
  `model.train()` at the top of `train()` (pytorch/examples calls it every epoch precisely because `validate()`
  leaves the model in eval mode). From epoch 2 on, every training step runs BatchNorm in eval mode: it
  normalises with the running statistics frozen at the end of epoch 1, and no longer re-centres the activations
  as the weights move. At lr 0.1 the un-normalised residual stream grows and the loss goes to NaN within the
  second epoch (val accuracy collapses to chance). Forgetting to switch back
  with model.train() after model.eval() is the classic mode bug (e.g. the "Train vs Eval Mode" chapter of the
  CNN companion book, mcklay.github.io/cnn-companion-book/chapter16: "If you forget to switch ... the model
  will behave unpredictably"). Root cause: loop_bug (the loop trains the model in eval mode; putting
  model.train() back removes the symptom). Competing fix a user tries first: a lower learning rate, 0.03 instead of
  0.1 (the loss still goes to NaN a few steps into epoch 2). Gradient clipping at 1.0 would also keep this run
  finite; it is not offered as the competing fix because it masks the fault rather than failing to. Checkpoint: the last one written before the NaN, checkpoint.pth.tar of epoch 1 (saved
  after validate(), so the model it was taken from sat in eval mode).
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
    name="resnet_batchnorm_cifar",
    kind="vision",
    original="pytorch/examples: imagenet/main.py (+ kuangliu/pytorch-cifar models/resnet.py)",
    runs={
        "healthy": Run(cause="healthy", story="Small ResNet on digits, SGD nesterov + cosine per epoch; loss 2.3 -> "
                                              "~0.002; checkpoint at epoch 4 of 10 while still improving."),
        "eval_mode_train": Run(
            cause="loop_bug",
            story="In epoch 2 the training loss went to NaN; validation accuracy collapsed. I had "
                  "moved validate() and removed model.train() from train().",
            fix="model_train",
            competing=("lr_x0.3",),
        ),
    },
)

BATCH = 64
EPOCHS = 10
LR = 0.1


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, block=BasicBlock, num_blocks=(2, 2), num_classes=10):
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._make_layer(block, 16, num_blocks[0], 1)
        self.layer2 = self._make_layer(block, 32, num_blocks[1], 2)
        self.linear = nn.Linear(32, num_classes)

    def _make_layer(self, block, planes, n, stride):
        layers = []
        for s in [stride] + [1] * (n - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer2(self.layer1(out))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def make_data(seed: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    x = (x - 0.3) / 0.37                                  # transforms.Normalize(mean, std)
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    tr, va = perm[:1400], perm[1400:]
    return (x[tr], y[tr]), (x[va], y[va])


def _batches(x, y, seed, epoch):
    g = torch.Generator().manual_seed(seed * 100 + epoch)
    perm = torch.randperm(len(x), generator=g)
    return [(x[perm[i:i + BATCH]], y[perm[i:i + BATCH]]) for i in range(0, len(x), BATCH)]


def _build(seed, variant):
    torch.manual_seed(seed)
    model = ResNet()
    lr = LR * (0.3 if variant == "lr_x0.3" else 1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)
    return model, optimizer, scheduler


criterion = nn.CrossEntropyLoss()


def loss_fn(model, batch):
    images, target = batch
    return criterion(model(images), target)


def _calls_train(run, variant):
    return run != "eval_mode_train" or variant == "model_train"


def _ckpt_epoch(run):
    return 4 if run == "healthy" else 1


def validate(model, x, y):
    model.eval()
    with torch.no_grad():
        out = model(x)
        return float(criterion(out, y)), float((out.argmax(1) == y).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    (xtr, ytr), (xva, yva) = make_data(seed)
    model, optimizer, scheduler = _build(seed, variant)
    calls_train = _calls_train(run, variant)
    ckpt = out_dir / "checkpoint.pth.tar"
    losses, val_losses, epoch_losses = [], [], []
    best_acc1 = 0.0
    model.train()                      # the model starts in training mode either way
    for epoch in range(EPOCHS):
        # train(train_loader, model, criterion, optimizer, epoch)
        if calls_train:
            model.train()
        el = []
        for images, target in _batches(xtr, ytr, seed, epoch):
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            el.append(loss.item())
        epoch_losses.append(sum(el) / len(el))
        # acc1 = validate(val_loader, model, criterion)
        vl, acc1 = validate(model, xva, yva)
        val_losses.append(vl)
        scheduler.step()
        best_acc1 = max(acc1, best_acc1)
        if epoch + 1 == _ckpt_epoch(run):
            torch.save({"epoch": epoch + 1, "arch": "resnet_small", "state_dict": model.state_dict(),
                        "best_acc1": best_acc1, "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, ckpt)
    metrics = {"epoch1": epoch_losses[0], "best_epoch_loss": min(epoch_losses), "last_epoch": epoch_losses[-1],
               "val_acc": acc1, "best_acc1": best_acc1}
    bad = [i for i, v in enumerate(losses) if v != v or abs(v) == float("inf")]
    if bad:
        metrics["nonfinite_step"] = bad[0]
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["last_epoch"] > 0.1 or m["val_acc"] < 0.95:
            return f"healthy ResNet failed: loss {m['epoch1']:.2f} -> {m['last_epoch']:.2f}, val acc {m['val_acc']:.2f}"
        return None
    last = m["last_epoch"]
    if "nonfinite_step" in m:
        return (f"train loss went to NaN at step {m['nonfinite_step']:.0f} (epoch 2; epoch 1's mean loss was "
                f"{m['epoch1']:.2f}); val acc {m['val_acc']:.2f}")
    if last != last or last > 0.1 or m["val_acc"] < 0.95:
        return (f"train loss {m['epoch1']:.2f} (epoch 1) -> best {m['best_epoch_loss']:.2f} -> {last:.3g} at the last "
                f"epoch; val acc {m['val_acc']:.2f} (best {m['best_acc1']:.2f})")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    (xtr, ytr), (xva, yva) = make_data(0)
    model, optimizer, scheduler = _build(0, None)
    calls_train = _calls_train(run, None)
    e = _ckpt_epoch(run)
    batches = _batches(xtr, ytr, 0, e) + _batches(xtr, ytr, 0, e + 1)
    val = [(xva[i:i + 128], yva[i:i + 128]) for i in range(0, len(xva), 128)]
    steps_per_epoch = len(_batches(xtr, ytr, 0, 0))

    def train_step(model, optimizer, batch):
        if calls_train:
            model.train()
        images, target = batch
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    if not calls_train:
        model.eval()          # where the loop left it: validate() ran last
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches, val_batches=val,
                        scheduler=scheduler, scheduler_interval="epoch", steps_per_epoch=steps_per_epoch,
                        train_step=train_step, total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_eval_mode_train():
    return _setup("eval_mode_train")


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
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      [round(x, 2) for x in tr.val_losses], symptom(r, tr))
