"""A small U-Net segmenting synthetic shapes, trained on BCE-with-logits + soft Dice, batches as dicts.

Follows milesial/Pytorch-UNet train.py and utils/dice_score.py (read: the UNet of DoubleConv / Down (MaxPool2d +
DoubleConv) / Up (upsample + concat skip + DoubleConv) / OutConv blocks; batches as dicts `batch['image']`,
`batch['mask']`; for one class `loss = criterion(masks_pred.squeeze(1), true_masks.float())` with
`nn.BCEWithLogitsLoss()` plus `dice_loss(F.sigmoid(masks_pred.squeeze(1)), true_masks.float(), multiclass=False)`;
`torch.nn.utils.clip_grad_norm_(model.parameters(), gradient_clipping=1.0)`; the validation Dice per epoch;
`state_dict['mask_values'] = dataset.mask_values` saved with the weights), which is the Dice + BCE recipe of
segmentation_models_pytorch's losses and MONAI's DiceCELoss. The optimizer is Adam (lr=3e-3) as in smp's examples
(the repository's RMSprop at lr 1e-5 is far too slow for a run this small). Images are 16x16 synthetic scenes: a
bright ellipse or rectangle on a noisy background with a random illumination gradient; the mask is the shape.
The checkpoint is the model's state_dict with 'mask_values', plus 'optimizer' and 'epoch'.

Runs
- healthy: BCE + Dice from ~1.1-1.4 down to ~0.3-0.8 over 8 epochs (slow but steady: the BCE part falls
  slowly on these noisy scenes), validation Dice ~0.97. Checkpoint: epoch 4 of 8, still improving.
- mask_255: the owner's dataset reads the PNG masks as they are stored, 0 and 255, and skips Pytorch-UNet's
  `mask_values` mapping to class indices. With a target of 255, BCE has no lower bound (255*log p pays for
  pushing every foreground logit up without limit) and the "Dice" exceeds 1: the logged loss goes negative
  within the first epoch and keeps falling (-300 to -600 by epoch 8), while the predicted masks are worse than the
  healthy run's (Dice ~0.3-0.8 against the true masks, ~0.97 healthy). This is milesial/Pytorch-UNet issue #78 "When i run this code, get loss is negative??"
  ("please ensure mask is 0-1, not 0-255"; "Validation Dice Coeff: 1.97"), and qubvel/segmentation_models
  issue #95 "Negative loss" (iou_score above 1). Root cause: label_bug (the targets are wrong; mapping 255 -> 1
  removes the symptom). Competing fix a user tries first: a 10x lower learning rate (the loss still runs
  negative). Checkpoint: epoch 2, the loss already negative.
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
    name="unet_dice_segmentation",
    kind="segmentation",
    original="milesial/Pytorch-UNet: train.py + utils/dice_score.py (Dice + BCE as in smp / MONAI DiceCELoss)",
    runs={
        "healthy": Run(cause="healthy", story="U-Net on synthetic shapes with BCE + Dice; loss ~1.2 -> ~0.4, val Dice "
                                              "~0.97; checkpoint at epoch 4 of 8 while still improving."),
        "mask_255": Run(
            cause="label_bug",
            story="My masks come from PNGs; the loss went negative in the first epoch and keeps falling (-300), and "
                  "the validation Dice is above 1 while the predicted masks look worse.",
            fix="masks_to_01",
            competing=("lr_x0.1",),
        ),
    },
)

H = W = 16
N_TRAIN = 256
N_VAL = 64
BATCH = 16
EPOCHS = 8
GRAD_CLIP = 1.0


def make_scenes(n: int, g: torch.Generator):
    yy, xx = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32), indexing="ij")
    images = torch.empty(n, 1, H, W)
    masks = torch.empty(n, H, W, dtype=torch.long)
    for i in range(n):
        cy, cx = 3 + 10 * torch.rand(2, generator=g)
        ry, rx = 2 + 3 * torch.rand(2, generator=g)
        if torch.rand(1, generator=g) < 0.5:
            m = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
        else:
            m = ((yy - cy).abs() <= ry) & ((xx - cx).abs() <= rx)
        slope = (torch.rand(2, generator=g) - 0.5) * 0.1
        img = 1.0 * m.float() + slope[0] * (yy - 8) + slope[1] * (xx - 8) + 0.35 * torch.randn(H, W, generator=g)
        images[i, 0] = img
        masks[i] = m.long()
    return images, masks


def make_data(seed: int, mask_255: bool):
    g = torch.Generator().manual_seed(500 + seed)
    xtr, mtr = make_scenes(N_TRAIN, g)
    xva, mva = make_scenes(N_VAL, g)
    if mask_255:   # the PNGs store the foreground as 255; no mapping to class indices
        mtr, mva = mtr * 255, mva * 255
    return (xtr, mtr), (xva, mva)


class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(cin, cout))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):
        return self.conv(torch.cat([x2, self.up(x1)], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels=1, n_classes=1):
        super().__init__()
        self.n_classes = n_classes
        self.inc = DoubleConv(n_channels, 8)
        self.down1 = Down(8, 16)
        self.down2 = Down(16, 16)
        self.up1 = Up(32, 8)
        self.up2 = Up(16, 8)
        self.outc = nn.Conv2d(8, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        return self.outc(x)


def dice_coeff(input, target, epsilon=1e-6):
    sum_dim = (-1, -2)
    inter = 2 * (input * target).sum(dim=sum_dim)
    sets_sum = input.sum(dim=sum_dim) + target.sum(dim=sum_dim)
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    return ((inter + epsilon) / (sets_sum + epsilon)).mean()


def dice_loss(input, target):
    return 1 - dice_coeff(input, target)


criterion = nn.BCEWithLogitsLoss()


def loss_fn(model, batch):
    images, true_masks = batch["image"], batch["mask"]
    masks_pred = model(images)
    loss = criterion(masks_pred.squeeze(1), true_masks.float())
    loss = loss + dice_loss(torch.sigmoid(masks_pred.squeeze(1)), true_masks.float())
    return loss


def _bug(run, variant):
    return run == "mask_255" and variant != "masks_to_01"


def _build(seed, variant):
    torch.manual_seed(seed)
    model = UNet()
    lr = 3e-3 * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return model, optimizer


def _batches(x, m, seed, epoch):
    g = torch.Generator().manual_seed(seed * 100 + epoch)
    perm = torch.randperm(len(x), generator=g)
    return [{"image": x[perm[i:i + BATCH]], "mask": m[perm[i:i + BATCH]]} for i in range(0, len(x), BATCH)]


def _ckpt_epoch(run):
    return 4 if run == "healthy" else 2


@torch.no_grad()
def evaluate(model, x, m):
    """The run's own validation Dice (against the masks as loaded) and the honest one (against mask > 0)."""
    model.eval()
    pred = (torch.sigmoid(model(x).squeeze(1)) > 0.5).float()
    model.train()
    return float(dice_coeff(pred, m.float())), float(dice_coeff(pred, (m > 0).float()))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    (xtr, mtr), (xva, mva) = make_data(seed, _bug(run, variant))
    model, optimizer = _build(seed, variant)
    ckpt = out_dir / "checkpoint.pth"
    losses, val_dice = [], []
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for batch in _batches(xtr, mtr, seed, epoch):
            loss = loss_fn(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            losses.append(loss.item())
        val_dice.append(evaluate(model, xva, mva)[0])
        if epoch == _ckpt_epoch(run):
            state_dict = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                          "mask_values": [0, 255] if _bug(run, variant) else [0, 1]}
            torch.save(state_dict, ckpt)
    own, honest = evaluate(model, xva, mva)
    n = N_TRAIN // BATCH
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"first_epoch": sum(losses[:n]) / n, "last_epoch": sum(losses[-n:]) / n,
                            "val_dice": own, "honest_val_dice": honest})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["last_epoch"] > 0.85 * m["first_epoch"] or m["honest_val_dice"] < 0.8:
            return f"healthy U-Net failed: loss {m['first_epoch']:.2f} -> {m['last_epoch']:.2f}, val Dice {m['honest_val_dice']:.2f}"
        return None
    if m["last_epoch"] < 0 or m["honest_val_dice"] < 0.8:
        return (f"loss {m['first_epoch']:.3g} -> {m['last_epoch']:.4g} over the last epoch (negative), the run's val "
                f"Dice {m['val_dice']:.3g}; against the true masks the Dice is {m['honest_val_dice']:.2f}")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    (xtr, mtr), (xva, mva) = make_data(0, _bug(run, None))
    model, optimizer = _build(0, None)
    e = _ckpt_epoch(run)
    batches = _batches(xtr, mtr, 0, e + 1) + _batches(xtr, mtr, 0, e + 2) + _batches(xtr, mtr, 0, e + 3)
    val = [{"image": xva[i:i + BATCH], "mask": mva[i:i + BATCH]} for i in range(0, N_VAL, BATCH)]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches, val_batches=val,
                        grad_clip=GRAD_CLIP, total_steps=EPOCHS * (N_TRAIN // BATCH))


def setup_healthy():
    return _setup("healthy")


def setup_mask_255():
    return _setup("mask_255")


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
                      [round(x, 2) for x in tr.train_losses[::16]], symptom(r, tr))
