"""DeepSets digit sum: regress the sum of a variable-sized set of handwritten digit images.

Written after manzilzaheer/DeepSets (`DigitSum/image_sum.ipynb`, Keras) and its PyTorch ports (e.g. the "Deep
Sets: digit sum" PyTorch repository that re-implements it, and alvaromf2002-cpu/deepsets-mnist `model.py`): an
element network phi applied to every image of the set, a SUM over the set, and a network rho on the pooled
vector to one number; trained with the mean absolute error against the sum of the digits, Adam 1e-3, sets of 2
to 10 images drawn at random. I read the ports' model files (phi = MLP, `x_phi.sum(dim=1)`, rho = MLP) and the
README of the port (InfiMNIST sets as in the original). Here the images are scikit-learn's 8x8 digits (the
first 1300 images feed the training sets, the other 497 the validation sets, so no image is shared), the
original's sets of up to 10 are cut to 2-6 images (to train in seconds), padded to the longest set of their
batch with a mask (padded slots are zeroed before the sum), and -- as
set-learning loaders do to waste little padding -- the sets are bucketed: sorted by size, cut into batches of
64, and the batches shuffled each epoch. A batch is a dict `{"images": (B, L, 64), "mask": (B, L), "target":
(B,)}`. The checkpoint is written every epoch, `{"epoch", "model_state_dict", "optimizer_state_dict",
"val_mae"}`.

Runs
- healthy: the set targets travel with their sets; the validation MAE falls from ~4.5 after the first epoch
  to about 1.5 by epoch 30; the checkpoint is the epoch-12 one (validation MAE about 2), still improving.
- targets_not_sorted_with_sets: the owner added the size bucketing later and sorted the list of sets by length
  (`sets = [sets[i] for i in order]`) but not the list of targets, which stays in generation order. Each set
  is now paired with another set's sum: the labels are unrelated to the inputs, the training MAE stays near 7-8 and
  the validation MAE (honest pairs) near 5-6.5, where the healthy run reaches 1.5. Parallel lists
  that must be permuted together and are not (inputs reordered, targets not) are a well-known class of
  data-pipeline bug; I searched for a public thread on this exact bucketing case and did not find one to cite. Root cause `label_bug`: the fix `sort_targets_too` (reorder the targets
  with the same permutation) trains. Competing fix a user tries first: a 10x larger lr (`lr_1e-2`), which
  leaves the validation MAE at chance.
- adam_lr_too_high: the owner set Adam's lr to 0.2 "because the targets are sums up to 50, not class
  probabilities". With an unnormalised sum over the set, rho's input scales with the set size, and steps that
  large throw the pooled features around: within the first epochs the loss jumps to 10+ and the network settles
  on (nearly) one output for every set -- its ReLUs knocked out -- with a validation MAE of 4-7 (predicting the
  median sum scores about 6.7). Root cause `lr_too_high`: lr x0.1 (`lr_2e-2`) trains to a validation MAE of
  about 1.5. Competing fix a user tries first: gradient clipping at 1.0 (`clip_grad_1`), which leaves it (Adam's
  step does not depend on the gradient's scale). The checkpoint is the last epoch's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
    name="deepsets_digit_sum",
    kind="set learning",
    original="manzilzaheer/DeepSets: DigitSum/image_sum.ipynb (and its PyTorch ports' model.py: phi, sum, rho)",
    runs={
        "healthy": Run(cause="healthy", story="DeepSets sum-of-digits on 8x8 digit sets of 2-10 images, bucketed "
                       "by size; validation MAE falls from ~4.5 to ~1.5; checkpoint at epoch 12 of 30."),
        "targets_not_sorted_with_sets": Run(
            cause="label_bug",
            story="Since I bucket the sets by size the model predicts the same sum for every set; the validation MAE stays "
                  "around 5. A larger lr changed nothing.",
            fix="sort_targets_too", competing=("lr_1e-2",)),
        "adam_lr_too_high": Run(
            cause="lr_too_high",
            story="With lr 0.2 the loss jumps around and then the model predicts about the same sum for every "
                  "set; the validation MAE stays at 4-7. Clipping the gradients at 1.0 did not help.",
            fix="lr_2e-2", competing=("clip_grad_1",)),
    },
)

BS, EPOCHS, CKPT_EPOCH_HEALTHY = 64, 30, 12
N_TRAIN_SETS, N_VAL_SETS, MIN_SIZE, MAX_SIZE = 3000, 640, 2, 6


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target, dtype=torch.float32)


def make_sets(images, labels, n, g):
    sets, targets = [], []
    for _ in range(n):
        k = int(torch.randint(MIN_SIZE, MAX_SIZE + 1, (1,), generator=g))
        idx = torch.randint(0, len(images), (k,), generator=g)
        sets.append(images[idx])
        targets.append(float(labels[idx].sum()))
    return sets, targets


def pad(sets, targets):
    L = max(len(s) for s in sets)
    x = torch.zeros(len(sets), L, 64)
    mask = torch.zeros(len(sets), L)
    for i, s in enumerate(sets):
        x[i, :len(s)] = s
        mask[i, :len(s)] = 1.0
    return {"images": x, "mask": mask, "target": torch.tensor(targets)}


def make_data(seed, sort_targets=True):
    images, labels = _digits()
    g = torch.Generator().manual_seed(300 + seed)
    perm = torch.randperm(len(images), generator=g)
    tr_img, tr_lab = images[perm[:1300]], labels[perm[:1300]]
    va_img, va_lab = images[perm[1300:]], labels[perm[1300:]]
    sets, targets = make_sets(tr_img, tr_lab, N_TRAIN_SETS, g)
    # bucket by size so a batch pads little
    order = sorted(range(len(sets)), key=lambda i: len(sets[i]))
    sets = [sets[i] for i in order]
    if sort_targets:
        targets = [targets[i] for i in order]
    train = [pad(sets[i:i + BS], targets[i:i + BS]) for i in range(0, len(sets), BS)]
    vsets, vtargets = make_sets(va_img, va_lab, N_VAL_SETS, g)
    val = [pad(vsets[i:i + 128], vtargets[i:i + 128]) for i in range(0, len(vsets), 128)]
    return train, val


class DeepSet(nn.Module):
    def __init__(self, d_in=64, hidden=128, latent=64):
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, latent), nn.ReLU())
        self.rho = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, images, mask):
        h = self.phi(images) * mask.unsqueeze(-1)
        return self.rho(h.sum(dim=1)).squeeze(-1)


def loss_fn(model, batch):
    return F.l1_loss(model(batch["images"], batch["mask"]), batch["target"])


def config(run, variant):
    lr = 0.2 if run == "adam_lr_too_high" else 1e-3
    if variant == "lr_1e-2":
        lr = 1e-2
    if variant == "lr_2e-2":
        lr = 2e-2
    clip = 1.0 if variant == "clip_grad_1" else None
    sort_targets = run != "targets_not_sorted_with_sets" or variant == "sort_targets_too"
    return lr, clip, sort_targets


def build(run, variant, seed=0):
    torch.manual_seed(seed)
    model = DeepSet()
    lr, clip, _ = config(run, variant)
    return model, torch.optim.Adam(model.parameters(), lr=lr), clip


@torch.no_grad()
def val_mae(model, val):
    n = sum(len(b["target"]) for b in val)
    return float(sum(loss_fn(model, b) * len(b["target"]) for b in val) / n)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    _, clip, sort_targets = config(run, variant)
    train_b, val = make_data(seed, sort_targets)
    model, opt, clip = build(run, variant, seed)
    ckpt = Path(out_dir) / "deepsets_epoch.pt"
    ckpt_epoch = CKPT_EPOCH_HEALTHY if run == "healthy" else EPOCHS
    losses, vals = [], []
    for epoch in range(1, EPOCHS + 1):
        model.train()
        order = torch.randperm(len(train_b), generator=torch.Generator().manual_seed(seed * 100 + epoch))
        for i in order.tolist():
            loss = loss_fn(model, train_b[i])
            opt.zero_grad()
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            losses.append(loss.item())
        model.eval()
        vals.append(val_mae(model, val))
        if epoch <= ckpt_epoch:
            torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": opt.state_dict(), "val_mae": vals[-1]}, ckpt)
    const = float(np.mean([float((b["target"] - torch.cat([v["target"] for v in val]).median()).abs().mean())
                           for b in val]))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"val_mae": float(np.median(vals[-3:])), "best_val_mae": min(vals), "const_mae": const,
                            "train_last": float(np.mean(losses[-47:])), "first": losses[0]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["val_mae"] > 2.5:
        return (f"validation MAE {m['val_mae']:.2f} over the last 3 of {EPOCHS} epochs (best {m['best_val_mae']:.2f}; "
                f"predicting the median sum scores {m['const_mae']:.2f}), train MAE {m['first']:.2f} -> "
                f"{m['train_last']:.2f}")
    return None


def _setup(run):
    import triage

    _, _, sort_targets = config(run, None)
    train_b, val = make_data(0, sort_targets)
    model, opt, clip = build(run, None, 0)
    order = torch.randperm(len(train_b), generator=torch.Generator().manual_seed(1)).tolist()
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn, batches=[train_b[i] for i in order],
                        val_batches=val, grad_clip=clip)


def setup_healthy():
    return _setup("healthy")


def setup_targets_not_sorted_with_sets():
    return _setup("targets_not_sorted_with_sets")


def setup_adam_lr_too_high():
    return _setup("adam_lr_too_high")
