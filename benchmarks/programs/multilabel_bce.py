"""Multi-label classification of tabular rows with multi-hot targets and BCEWithLogitsLoss(pos_weight).

What it does: a small MLP maps 24 numeric features to 8 independent labels (several can be on at once; data
from sklearn's `make_multilabel_classification`, made in code and seeded). Training follows the usual Kaggle /
Hugging Face multi-label recipe (e.g. the "Multi-label text classification with BERT" notebooks and
HF's `problem_type="multi_label_classification"`, whose head feeds raw logits to `BCEWithLogitsLoss`): dict
batches `{"features", "labels"}` with float multi-hot labels, `pos_weight = n_neg / n_pos` per label computed on
the training split, AdamW, a linear-decay LambdaLR stepped every batch, validation each epoch with micro-F1 at a
0.5 threshold on `sigmoid(logits)`, and a `torch.save` checkpoint dict (`model_state_dict`,
`optimizer_state_dict`, `scheduler`, `step`) every epoch.

Runs
- healthy: the recipe as written. Its loss floor is not 0 (label noise, pos_weight).
- double_sigmoid: the owner ended the model with `nn.Sigmoid()` (so `predict()` gives probabilities) and kept
  `BCEWithLogitsLoss`, which applies a sigmoid again. The loss then sees sigmoid(probability), which lives in
  (0.5, 0.73): every label leans positive, the loss cannot go below ~0.69 per negative label, and the gradient
  through the two sigmoids is tiny. A very common multi-label mistake (PyTorch forums "BCEWithLogitsLoss with
  sigmoid twice", and e.g. the runebook guide "A Guide to Sigmoid, Softmax, and BCEWithLogitsLoss" that calls
  applying a sigmoid before a logits loss "a super common mistake"). Cause `wrong_loss`: the loss does not
  match what the model outputs; the deciding fix is the loss/output pairing (drop the final Sigmoid so the
  logits loss gets logits), which removes the plateau; a higher LR (what the owner tries first) does not.
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
except ImportError:  # imported by path
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

N_FEAT, N_LAB, BS, EPOCHS, LR = 24, 8, 32, 8, 3e-3

PROGRAM = Program(
    name="multilabel_bce",
    kind="multilabel",
    original="HF transformers multi_label_classification head (BCEWithLogitsLoss) / Kaggle multi-label MLP notebooks",
    runs={
        "healthy": Run(cause="healthy", story="Multi-label MLP with BCEWithLogitsLoss(pos_weight); loss falls to a "
                       "non-zero floor and micro-F1 climbs."),
        "double_sigmoid": Run(
            cause="wrong_loss",
            story="I put nn.Sigmoid() at the end of the model so predictions are probabilities, and trained with "
                  "BCEWithLogitsLoss. The loss sits near 0.9 and micro-F1 is stuck; a higher LR did not help.",
            fix="logits_to_loss", competing=("lr_x10",)),
    },
)


def make_data(seed=0):
    from sklearn.datasets import make_multilabel_classification
    x, y = make_multilabel_classification(n_samples=2200, n_features=N_FEAT, n_classes=N_LAB, n_labels=2,
                                          allow_unlabeled=True, random_state=seed)
    x = np.log1p(x.astype(np.float32))
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    x, y = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    return (x[:1800], y[:1800]), (x[1800:], y[1800:])


def batches(x, y, seed, shuffle=True):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(x), generator=g) if shuffle else torch.arange(len(x))
    return [{"features": x[idx[i:i + BS]], "labels": y[idx[i:i + BS]], "idx": idx[i:i + BS]}
            for i in range(0, len(x) - BS + 1, BS)]


class MultiLabelMLP(nn.Module):
    def __init__(self, final_sigmoid=False):
        super().__init__()
        layers = [nn.Linear(N_FEAT, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 64), nn.ReLU(),
                  nn.Linear(64, N_LAB)]
        if final_sigmoid:
            layers.append(nn.Sigmoid())
        self.net = nn.Sequential(*layers)

    def forward(self, features):
        return self.net(features)


def build(run, seed, variant=None):
    torch.manual_seed(seed)
    (xtr, ytr), (xva, yva) = make_data(seed)
    model = MultiLabelMLP(final_sigmoid=(run == "double_sigmoid" and variant != "logits_to_loss"))
    lr = LR * (10 if variant == "lr_x10" else 1)
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr)
    steps_per_epoch = len(xtr) // BS
    total = steps_per_epoch * EPOCHS
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total))
    pos = ytr.sum(0)
    pos_weight = ((len(ytr) - pos) / pos.clamp(min=1)).clamp(max=10.0)
    crit = nn.BCEWithLogitsLoss(pos_weight=pos_weight)

    def loss_fn(model, batch):
        return crit(model(batch["features"]), batch["labels"])

    return model, opt, sched, loss_fn, (xtr, ytr), (xva, yva), total, steps_per_epoch


def micro_f1(model, x, y, final_probs):
    model.eval()
    with torch.no_grad():
        out = model(x)
        p = out if final_probs else torch.sigmoid(out)
    model.train()
    pred = (p > 0.5).float()
    tp = (pred * y).sum(); fp = (pred * (1 - y)).sum(); fn = ((1 - pred) * y).sum()
    return float(2 * tp / (2 * tp + fp + fn))


def train(run, out_dir, seed=0, variant=None):
    out_dir = Path(out_dir)
    model, opt, sched, loss_fn, (xtr, ytr), (xva, yva), total, spe = build(run, seed, variant)
    final_probs = run == "double_sigmoid" and variant != "logits_to_loss"
    val = batches(xva, yva, 0, shuffle=False)
    ckpt_epoch = 4 if run == "healthy" else 5
    ckpt = out_dir / "checkpoint.pt"
    losses, val_losses, step, metrics = [], [], 0, {}
    for epoch in range(EPOCHS):
        for batch in batches(xtr, ytr, seed * 1000 + epoch):
            loss = loss_fn(model, batch)
            opt.zero_grad(); loss.backward(); opt.step(); sched.step()
            losses.append(loss.item()); step += 1
        model.eval()
        with torch.no_grad():
            val_losses.append(float(np.mean([loss_fn(model, b).item() for b in val])))
        model.train()
        f1 = micro_f1(model, xva, yva, final_probs)
        if epoch + 1 == ckpt_epoch:
            torch.save({"model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
                        "scheduler": sched.state_dict(), "step": step, "epoch": epoch + 1}, ckpt)
            metrics = {"f1_at_ckpt": f1, "train_loss_at_ckpt": float(np.mean(losses[-spe:])),
                       "first_loss": float(np.mean(losses[:10])), "ckpt_step": step}
    metrics["final_f1"] = f1
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses, metrics=metrics)


def symptom(run, trained):
    m = trained.metrics
    if m["train_loss_at_ckpt"] > 0.75:
        return (f"train BCE {m['first_loss']:.3f} -> {m['train_loss_at_ckpt']:.3f} by step {m['ckpt_step']} "
                f"(epoch mean), stuck above 0.75 where the per-label loss cannot go below ~0.69 for a negative; val micro-F1 {m['f1_at_ckpt']:.3f}")
    return None


def _setup(run):
    import triage
    model, opt, sched, loss_fn, (xtr, ytr), (xva, yva), total, spe = build(run, 0)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn,
                        batches=batches(xtr, ytr, 0 * 1000 + 5), val_batches=batches(xva, yva, 0, shuffle=False),
                        total_steps=total)


def setup_healthy():
    return _setup("healthy")


def setup_double_sigmoid():
    return _setup("double_sigmoid")
