"""A tiny CLIP-style dual encoder trained with the symmetric InfoNCE loss and a learnable logit_scale.

What it does: two paired views of the same hidden 'concept' are made in code (an "image" view: 48 noisy
non-linear features; a "text" view: 32 noisy features through another map), one MLP tower each projects to a
shared 32-d space, features are L2-normalised, and the loss is open_clip's ClipLoss: logits =
logit_scale.exp() * img @ txt.T, cross-entropy against arange(B) in both directions, averaged. Written after
openai/CLIP model.py (`logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))`, normalised features) and
mlfoundations/open_clip src/open_clip/loss.py (ClipLoss) and src/training/train.py / main.py: AdamW with no
weight decay on gains, biases and logit_scale, a warmup + cosine LR per step, `logit_scale.clamp_(0, ln 100)`
after every step, dict batches, a per-epoch validation loss and retrieval R@1, and per-epoch checkpoints
`{"epoch", "name", "state_dict", "optimizer"}`.

Runs
- healthy: one DataLoader over (image, text) pairs. The loss starts at ln(64)=4.16 and falls; its floor is not
  0 (noisy views, near-duplicate concepts in a batch).
- unpaired_views: the owner kept the image features and the captions in two Datasets with two shuffled
  DataLoaders and zipped them, so row i of the image batch is no longer the partner of row i of the text
  batch, and the arange(B) targets name the wrong positives. The loss sits at ln(B) ("Loss is constant",
  mlfoundations/open_clip issue #17: a custom-data CLIP run whose loss stays at 4.8 ~ ln(128); openai/CLIP
  issue #83 discusses the arange targets that assume row i pairs with column i). Cause `label_bug`: the
  contrastive targets do not match the data; the deciding fix is pairing the views in one loader, which
  removes the plateau; a 10x higher LR (what the owner tries first) does not.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

N_TRAIN, N_VAL, BS, EPOCHS, LR, WARMUP, WD = 2560, 512, 64, 8, 2e-3, 40, 0.1
D_IMG, D_TXT, D_LAT, D_EMB = 48, 32, 12, 32

PROGRAM = Program(
    name="clip_dual_encoder",
    kind="contrastive-multimodal",
    original="mlfoundations/open_clip src/open_clip/loss.py (ClipLoss) + src/training/train.py, main.py; "
             "openai/CLIP clip/model.py (logit_scale)",
    runs={
        "healthy": Run(cause="healthy", story="Two-tower CLIP on paired views; symmetric InfoNCE falls from ln(64) "
                       "and retrieval R@1 rises."),
        "unpaired_views": Run(
            cause="label_bug",
            story="I loaded image features and captions with two shuffled DataLoaders and zipped them. The loss "
                  "sits at 4.16 = ln(64) for the whole run; raising the LR did not move it.",
            fix="paired_loader", competing=("lr_x10",)),
    },
)


def make_views(seed):
    g = torch.Generator().manual_seed(seed)
    n = N_TRAIN + N_VAL
    z = torch.randn(n, D_LAT, generator=g)
    wa = torch.randn(D_LAT, D_IMG, generator=g) / math.sqrt(D_LAT)
    wb = torch.randn(D_LAT, D_TXT, generator=g) / math.sqrt(D_LAT)
    img = torch.tanh(z @ wa) + 0.3 * torch.randn(n, D_IMG, generator=g)
    txt = torch.relu(z @ wb) - 0.4 + 0.3 * torch.randn(n, D_TXT, generator=g)
    return (img[:N_TRAIN], txt[:N_TRAIN]), (img[N_TRAIN:], txt[N_TRAIN:])


class Tower(nn.Module):
    def __init__(self, d_in):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d_in, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 128),
                                 nn.GELU(), nn.Linear(128, D_EMB))

    def forward(self, x):
        return self.mlp(x)


class TinyCLIP(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = Tower(D_IMG)
        self.text = Tower(D_TXT)
        self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))

    def forward(self, image, text):
        return (F.normalize(self.visual(image), dim=-1), F.normalize(self.text(text), dim=-1),
                self.logit_scale.exp())


def clip_loss(model, batch):
    img, txt, scale = model(batch["image"], batch["text"])
    logits_per_image = scale * img @ txt.T
    labels = torch.arange(img.shape[0])
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.T, labels)) / 2


def epoch_batches(run, variant, img, txt, seed, epoch):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order_img = torch.randperm(len(img), generator=g)
    if run == "unpaired_views" and variant != "paired_loader":
        order_txt = torch.randperm(len(txt), generator=g)   # the caption loader's own shuffle
    else:
        order_txt = order_img
    return [{"image": img[order_img[s:s + BS]], "text": txt[order_txt[s:s + BS]]}
            for s in range(0, len(img) - BS + 1, BS)]


def build(seed, variant=None):
    torch.manual_seed(seed)
    model = TinyCLIP()
    exclude = lambda n, p: p.ndim < 2 or "bias" in n or "logit_scale" in n  # open_clip main.py
    gain_or_bias = [p for n, p in model.named_parameters() if exclude(n, p)]
    rest = [p for n, p in model.named_parameters() if not exclude(n, p)]
    lr = LR * (10 if variant == "lr_x10" else 1)
    opt = torch.optim.AdamW([{"params": gain_or_bias, "weight_decay": 0.0}, {"params": rest, "weight_decay": WD}],
                            lr=lr, betas=(0.9, 0.98), eps=1e-6)
    total = (N_TRAIN // BS) * EPOCHS

    def cosine_with_warmup(step):  # open_clip scheduler.cosine_lr, as a LambdaLR stepped every batch
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (total - WARMUP)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine_with_warmup)
    return model, opt, sched, total


def train_step(model, optimizer, batch):
    loss = clip_loss(model, batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():  # open_clip train.py: clamp to [0, ln(100)]
        model.logit_scale.clamp_(0, math.log(100))
    return loss


def val_batches(img, txt):
    return [{"image": img[s:s + BS], "text": txt[s:s + BS]} for s in range(0, len(img) - BS + 1, BS)]


def train(run, out_dir, seed=0, variant=None):
    out_dir = Path(out_dir)
    (img, txt), (vimg, vtxt) = make_views(seed)
    vb = val_batches(vimg, vtxt)
    model, opt, sched, total = build(seed, variant)
    ckpt_epoch = 2 if run == "healthy" else 4
    ckpt = out_dir / f"epoch_{ckpt_epoch}.pt"
    losses, vlosses, metrics = [], [], {}
    for epoch in range(EPOCHS):
        model.train()
        for b in epoch_batches(run, variant, img, txt, seed, epoch):
            losses.append(train_step(model, opt, b).item())
            sched.step()
        model.eval()
        with torch.no_grad():
            vlosses.append(float(np.mean([clip_loss(model, b).item() for b in vb])))
            r1 = float(np.mean([(model(b["image"], b["text"])[0] @ model(b["image"], b["text"])[1].T)
                                .argmax(1).eq(torch.arange(BS)).float().mean().item() for b in vb]))
        if epoch + 1 == ckpt_epoch:
            torch.save({"epoch": epoch + 1, "name": "tiny-clip", "state_dict": model.state_dict(),
                        "optimizer": opt.state_dict()}, ckpt)
            spe = N_TRAIN // BS
            metrics = {"train_loss_at_ckpt": float(np.mean(losses[-spe:])), "first_loss": float(np.mean(losses[:5])),
                       "val_loss_at_ckpt": vlosses[-1], "val_r1_at_ckpt": r1, "ckpt_epoch": epoch + 1,
                       "logit_scale": float(model.logit_scale.detach().exp())}
    metrics["final_val_loss"] = vlosses[-1]
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vlosses, metrics=metrics)


def symptom(run, trained):
    m = trained.metrics
    chance = math.log(BS)
    if m["train_loss_at_ckpt"] > chance - 0.3:
        return (f"contrastive loss {m['first_loss']:.2f} -> {m['train_loss_at_ckpt']:.2f} (epoch mean) after "
                f"{m['ckpt_epoch']} epochs, ln(B)={chance:.2f}; val R@1 {m['val_r1_at_ckpt']:.3f} (chance "
                f"{1 / BS:.3f})")
    return None


def _setup(run):
    import triage
    (img, txt), (vimg, vtxt) = make_views(0)
    model, opt, sched, total = build(0)
    snap = epoch_batches(run, None, img, txt, 0, 4 if run != "healthy" else 2)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=clip_loss, train_step=train_step,
                        batches=snap, val_batches=val_batches(vimg, vtxt), total_steps=total,
                        steps_per_epoch=N_TRAIN // BS)


def setup_healthy():
    return _setup("healthy")


def setup_unpaired_views():
    return _setup("unpaired_views")
