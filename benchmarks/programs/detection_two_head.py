"""A tiny one-object detector (classification head + box-regression head) trained the torchvision-references way.

Follows pytorch/vision references/detection/engine.py `train_one_epoch` and train.py (read: images as a list of
tensors and targets as a list of dicts {'boxes' (N, 4) x1y1x2y2, 'labels'}; `loss_dict = model(images, targets)`;
`losses = sum(loss for loss in loss_dict.values())`; `if not math.isfinite(loss_value): print("Loss is {},
stopping training"); sys.exit(1)`; in epoch 0 a warmup scheduler (warmup_factor 1/1000 over
min(1000, len(data_loader) - 1) iterations; the older `utils.warmup_lr_scheduler`, a LambdaLR) stepped every
iteration; SGD(lr, momentum=0.9, weight_decay=1e-4); a MultiStepLR stepped once per epoch; a checkpoint per epoch
{'model', 'optimizer', 'lr_scheduler', 'args', 'epoch'} as model_{epoch}.pth) and torchvision's Fast R-CNN loss
(`fastrcnn_loss`: cross-entropy on the class logits + smooth L1 with beta 1/9 on box deltas encoded by BoxCoder:
dx = (gx - ax) / aw, dw = log(gw / aw), weights (1, 1, 1, 1) as the RPN's, summed and divided by the number of labels). The "detector" has a single
anchor (the whole image's centre box) and one object per image, so it is a conv backbone with a two-head output.
Images are 24x24 synthetic scenes: one of three shapes (square, ring, cross) on noise; the label is the shape.
The owner's training transform is a random crop (resized back to 24x24) whose boxes are clamped to the crop.

Runs
- healthy: the crop transform retries until the object lies inside the crop (what torchvision's RandomIoUCrop
  does); losses fall slowly from ~2.8 to ~0.9 (the box term keeps a floor on these small noisy shapes), val class
  accuracy ~0.8-0.9, box IoU ~0.6. BatchNorm in the backbone as torchvision's ResNets have it. Checkpoint:
  model_2.pth of 8, still improving.
- degenerate_box: the owner's crop clamps the box to the crop but keeps it when the object fell outside the crop,
  leaving a box of zero width or height. BoxCoder's log(gw / aw) of a zero-width box is -inf, the box loss is
  inf, and engine.py stops with "Loss is inf, stopping training" one or two epochs in (about 1 crop in 700
  falls outside the object), at the first batch holding such a crop. This is pytorch/vision issue #2240 "Raise error if target boxes are degenerate in Faster R-CNN"
  ("a number of reports with users saying that their training loss is nan after a few iterations ... most of the
  time due to degenerate boxes"), #997 and #1128. Root cause: bad_batch (one batch carries a target that makes
  the loss non-finite; skipping / filtering it removes the failure). Competing fix a user tries first: a 10x
  lower learning rate (the "reduce the LR" answer to NaN losses): the same crop still yields log(0).
  Checkpoint: the last one written before the failure (model_{epoch}.pth of the last finished epoch).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="detection_two_head",
    kind="detection",
    original="pytorch/vision: references/detection/engine.py + train.py (fastrcnn_loss, BoxCoder)",
    runs={
        "healthy": Run(cause="healthy", story="Tiny detector on synthetic shapes with a crop that keeps the object "
                                              "inside; losses ~2.8 -> ~0.9; checkpoint model_2.pth of 8 epochs."),
        "degenerate_box": Run(
            cause="bad_batch",
            story="Training stopped with 'Loss is inf, stopping training' in epoch 1; lowering the LR did not help. "
                  "My random crop clamps boxes to the crop window.",
            fix="drop_degenerate",
            competing=("lr_x0.1",),
        ),
    },
)

S = 24
N_TRAIN = 320
N_VAL = 96
BATCH = 8
EPOCHS = 8
LR = 0.01
LR_STEPS = [6, 7]
NUM_CLASSES = 4       # background + 3 shapes, as torchvision counts them
ANCHOR = torch.tensor([6.0, 6.0, 18.0, 18.0])
BBOX_REG_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
CROP_P = 0.3
CROP_MIN = 18


def make_scenes(n: int, g: torch.Generator):
    images, targets = [], []
    yy, xx = torch.meshgrid(torch.arange(S, dtype=torch.float32), torch.arange(S, dtype=torch.float32), indexing="ij")
    for _ in range(n):
        label = int(torch.randint(1, 4, (1,), generator=g))
        w, h = (int(v) for v in torch.randint(5, 11, (2,), generator=g))
        x1 = int(torch.randint(0, S - w + 1, (1,), generator=g))
        y1 = int(torch.randint(0, S - h + 1, (1,), generator=g))
        inside = (xx >= x1) & (xx < x1 + w) & (yy >= y1) & (yy < y1 + h)
        cx, cy = x1 + (w - 1) / 2, y1 + (h - 1) / 2
        if label == 1:
            shape = inside
        elif label == 2:
            shape = inside & ~((xx > x1) & (xx < x1 + w - 1) & (yy > y1) & (yy < y1 + h - 1))
        else:
            shape = inside & (((xx - cx).abs() <= 1) | ((yy - cy).abs() <= 1))
        img = shape.float() + 0.2 * torch.randn(S, S, generator=g)
        images.append(img.unsqueeze(0))
        targets.append({"boxes": torch.tensor([[x1, y1, x1 + w, y1 + h]], dtype=torch.float32),
                        "labels": torch.tensor([label])})
    return images, targets


def random_crop(image, target, g: torch.Generator, drop_degenerate: bool):
    """The owner's RandomCrop for detection: a random window, resized back to SxS, boxes clamped to the window."""
    if torch.rand(1, generator=g) >= CROP_P:
        return image, target
    for _ in range(20):
        size = int(torch.randint(CROP_MIN, S, (1,), generator=g))
        left = int(torch.randint(0, S - size + 1, (1,), generator=g))
        top = int(torch.randint(0, S - size + 1, (1,), generator=g))
        boxes = target["boxes"].clone()
        boxes[:, 0::2] = (boxes[:, 0::2] - left).clamp(0, size)
        boxes[:, 1::2] = (boxes[:, 1::2] - top).clamp(0, size)
        ok = bool(((boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)).all())
        if ok or not drop_degenerate:
            break
    else:
        return image, target
    crop = image[:, top:top + size, left:left + size].unsqueeze(0)
    crop = F.interpolate(crop, size=(S, S), mode="bilinear", align_corners=False)[0]
    return crop, {"boxes": boxes * (S / size), "labels": target["labels"]}


def encode(gt: torch.Tensor) -> torch.Tensor:
    """torchvision BoxCoder.encode against the single anchor."""
    wx, wy, ww, wh = BBOX_REG_WEIGHTS
    aw, ah = ANCHOR[2] - ANCHOR[0], ANCHOR[3] - ANCHOR[1]
    ax, ay = ANCHOR[0] + 0.5 * aw, ANCHOR[1] + 0.5 * ah
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    gx, gy = gt[:, 0] + 0.5 * gw, gt[:, 1] + 0.5 * gh
    return torch.stack([wx * (gx - ax) / aw, wy * (gy - ay) / ah, ww * torch.log(gw / aw), wh * torch.log(gh / ah)], 1)


def decode(d: torch.Tensor) -> torch.Tensor:
    wx, wy, ww, wh = BBOX_REG_WEIGHTS
    aw, ah = ANCHOR[2] - ANCHOR[0], ANCHOR[3] - ANCHOR[1]
    ax, ay = ANCHOR[0] + 0.5 * aw, ANCHOR[1] + 0.5 * ah
    cx, cy = d[:, 0] / wx * aw + ax, d[:, 1] / wy * ah + ay
    w, h = torch.exp(d[:, 2] / ww) * aw, torch.exp(d[:, 3] / wh) * ah
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


class TinyDetector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.box_head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 6 * 6, 128), nn.ReLU(inplace=True))
        self.cls_score = nn.Linear(128, NUM_CLASSES)
        self.bbox_pred = nn.Linear(128, 4)

    def forward(self, images, targets=None):
        x = self.box_head(self.backbone(torch.stack(images)))
        class_logits, box_regression = self.cls_score(x), self.bbox_pred(x)
        if self.training:
            labels = torch.cat([t["labels"] for t in targets])
            regression_targets = encode(torch.cat([t["boxes"] for t in targets]))
            loss_classifier = F.cross_entropy(class_logits, labels)
            loss_box_reg = F.smooth_l1_loss(box_regression, regression_targets, beta=1 / 9,
                                            reduction="sum") / labels.numel()
            return {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}
        boxes = decode(box_regression)
        scores, labels = F.softmax(class_logits, -1).max(-1)
        return [{"boxes": b[None], "labels": l[None], "scores": s[None]} for b, l, s in zip(boxes, labels, scores)]


def loss_fn(model, batch):
    images, targets = batch
    loss_dict = model(images, targets)
    return sum(loss for loss in loss_dict.values())


def _drop(run, variant):
    return run == "healthy" or variant == "drop_degenerate"


def make_data(seed: int):
    g = torch.Generator().manual_seed(700 + seed)
    return make_scenes(N_TRAIN, g), make_scenes(N_VAL, g)


def epoch_batches(train_set, seed, epoch, drop_degenerate):
    """One epoch of the shuffled, augmented DataLoader (collate_fn = tuple(zip(*batch)))."""
    images, targets = train_set
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(images), generator=g)
    batches = []
    for i in range(0, len(images), BATCH):
        items = [random_crop(images[j], targets[j], g, drop_degenerate) for j in perm[i:i + BATCH].tolist()]
        batches.append((list(a for a, _ in items), list(t for _, t in items)))
    return batches


def _build(seed, variant):
    torch.manual_seed(seed)
    model = TinyDetector()
    params = [p for p in model.parameters() if p.requires_grad]
    lr = LR * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=LR_STEPS, gamma=0.1)
    return model, optimizer, lr_scheduler


def warmup_lr_scheduler(optimizer, warmup_iters, warmup_factor):
    def f(x):
        if x >= warmup_iters:
            return 1
        alpha = float(x) / warmup_iters
        return warmup_factor * (1 - alpha) + alpha
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)


def box_iou(a, b):
    lt = torch.max(a[:, :2], b[:, :2])
    rb = torch.min(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(1)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    return inter / (area(a) + area(b) - inter)


@torch.no_grad()
def evaluate(model, val_set):
    images, targets = val_set
    model.eval()
    out = model(images)
    model.train()
    pred_boxes = torch.cat([o["boxes"] for o in out])
    pred_labels = torch.cat([o["labels"] for o in out])
    gt_boxes = torch.cat([t["boxes"] for t in targets])
    gt_labels = torch.cat([t["labels"] for t in targets])
    return float((pred_labels == gt_labels).float().mean()), float(box_iou(pred_boxes, gt_boxes).mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    train_set, val_set = make_data(seed)
    model, optimizer, lr_scheduler = _build(seed, variant)
    drop = _drop(run, variant)
    losses, failed_at, ckpt, step = [], None, None, 0
    for epoch in range(EPOCHS):
        # train_one_epoch
        model.train()
        batches = epoch_batches(train_set, seed, epoch, drop)
        warmup = None
        if epoch == 0:
            warmup = warmup_lr_scheduler(optimizer, min(1000, len(batches) - 1), 1.0 / 1000)
        for images, targets in batches:
            loss_dict = model(images, targets)
            losses_sum = sum(loss for loss in loss_dict.values())
            loss_value = losses_sum.item()
            if not math.isfinite(loss_value):
                failed_at = (step, epoch)           # print("Loss is inf, stopping training"); sys.exit(1)
                break
            optimizer.zero_grad()
            losses_sum.backward()
            optimizer.step()
            if warmup is not None:
                warmup.step()
            losses.append(loss_value)
            step += 1
        if failed_at is not None:
            break
        lr_scheduler.step()
        path = out_dir / f"model_{epoch}.pth"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "lr_scheduler": lr_scheduler.state_dict(), "args": {"lr": LR, "batch_size": BATCH},
                    "epoch": epoch}, path)
        if run == "healthy" and epoch == 2 or run != "healthy":
            ckpt = path
    acc, iou = evaluate(model, val_set)
    metrics = {"val_acc": acc, "val_iou": iou, "steps": step, "first": sum(losses[:10]) / 10,
               "last": sum(losses[-10:]) / 10}
    if failed_at is not None:
        metrics.update(failed_step=failed_at[0], failed_epoch=failed_at[1])
    return Trained(checkpoint=ckpt, train_losses=losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if "failed_step" in m:
        return (f"Loss is inf, stopping training: step {m['failed_step']} (epoch {m['failed_epoch']}), after the loss "
                f"had gone {m['first']:.2f} -> {m['last']:.2f}")
    if m["val_acc"] < 0.65 or m["val_iou"] < 0.5 or not m["last"] < 0.6 * m["first"]:
        return f"detector did not train: val accuracy {m['val_acc']:.2f}, box IoU {m['val_iou']:.2f}"
    return None


def _ckpt_epoch(run: str) -> int:
    if run == "healthy":
        return 2
    # the owner's log: the last model_{epoch}.pth before "Loss is inf" (seed 0)
    return _failure(0)[1] - 1


def _failure(seed: int):
    """(step, epoch) of the first batch whose targets hold a zero-width/height box, for the run as it was."""
    train_set, _ = make_data(seed)
    step = 0
    for epoch in range(EPOCHS):
        for _, targets in epoch_batches(train_set, seed, epoch, False):
            b = torch.cat([t["boxes"] for t in targets])
            if bool(((b[:, 2] - b[:, 0] <= 0) | (b[:, 3] - b[:, 1] <= 0)).any()):
                return step, epoch
            step += 1
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    train_set, val_set = make_data(0)
    model, optimizer, lr_scheduler = _build(0, None)
    drop = _drop(run, None)
    e = _ckpt_epoch(run)
    batches = []
    for epoch in range(e + 1, EPOCHS):
        batches += epoch_batches(train_set, 0, epoch, drop)   # the epochs after the checkpoint, in the run's order
    batches = batches[:48]
    val = [(val_set[0][i:i + BATCH], val_set[1][i:i + BATCH]) for i in range(0, N_VAL, BATCH)]
    steps_per_epoch = -(-N_TRAIN // BATCH)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches, val_batches=val,
                        scheduler=lr_scheduler, scheduler_interval="epoch", steps_per_epoch=steps_per_epoch,
                        total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_degenerate_box():
    return _setup("degenerate_box")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for s in range(3):
        print("failure", s, _failure(s))
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            if r == "healthy" and v is not None:
                continue
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      tr.checkpoint.name if tr.checkpoint else None, symptom(r, tr))
