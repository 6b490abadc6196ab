"""Tabular classifier: categorical columns through embeddings, continuous columns through BatchNorm, an MLP on top.

Written after fastai's tabular model (fastai/tabular/model.py `TabularModel`: one `nn.Embedding` per
categorical column, embedding dropout, `BatchNorm1d` on the continuous block, then Linear/ReLU/BatchNorm
blocks and a linear output) and its training recipe (`learn.fit_one_cycle`: Adam, a one-cycle LR schedule
stepped every batch, `CrossEntropyLossFlat` on two output units for a binary target). A batch is fastai's
tabular triple `(x_cat, x_cont, y)`: a long tensor of category codes, a float tensor of continuous columns,
the target. Checkpoints are what `learn.save(name, with_opt=True)` writes: `{"model": ..., "opt": ...}`,
no step counter (fastai keeps none in the file).

The data is an "adult income"-like table made in code: three categorical columns (a workclass-like column of
7 codes, an education-like column of 12, a marital-status-like column of 5) and four continuous ones, the
target a noisy function of both.

Runs
- healthy: 6 epochs of one-cycle at max_lr 3e-3; checkpoint after epoch 3 (still improving).
- labels_misaligned: the owner shuffled the feature frame for the split (`df.sample(frac=1)`) and took the
  target column from the frame before the shuffle, so every row's label belongs to another row. Index
  misalignment between a shuffled/filtered frame and a label array is one of the most common tabular
  mistakes (pandas `reset_index` / `.values` on a re-ordered frame; many Stack Overflow threads on "accuracy
  stuck at the majority class after shuffling the dataframe"). The loss sits at the majority-class entropy,
  validation accuracy at the majority rate. Root cause `label_bug` (the labels are unrelated to the inputs:
  the fix is aligning them). Competing fix a user tries first: a lower max_lr (`lr_lower`), which leaves it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from _program import Program, Run, Trained
except ImportError:  # imported by path from elsewhere
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="tabular_embeddings_mlp",
    kind="tabular",
    original="fastai: fastai/tabular/model.py (TabularModel) + tabular_learner / fit_one_cycle",
    runs={
        "healthy": Run(cause="healthy", story="Adult-like table, embeddings + continuous MLP, one-cycle Adam; "
                       "checkpoint after epoch 3 of 6 while validation accuracy is still rising."),
        "labels_misaligned": Run(
            cause="label_bug",
            story="I shuffled the dataframe before splitting and took the target from the unshuffled frame; "
                  "the loss sits near the 0.56 of predicting the class rate and validation accuracy at the majority-class rate.",
            fix="align_labels", competing=("lr_lower",)),
    },
)

CARDS = (7, 12, 5)
N_CONT = 4
N_TRAIN, N_VALID = 4000, 1000
BS = 64
EPOCHS = 6
MAX_LR = 3e-3


def emb_sz_rule(n_cat: int) -> int:
    return int(min(600, round(1.6 * n_cat ** 0.56)))


class TabularModel(nn.Module):
    def __init__(self, emb_szs, n_cont, out_sz, layers, ps=(0.05, 0.05), embed_p=0.05):
        super().__init__()
        self.embeds = nn.ModuleList([nn.Embedding(ni, nf) for ni, nf in emb_szs])
        self.emb_drop = nn.Dropout(embed_p)
        self.bn_cont = nn.BatchNorm1d(n_cont)
        n_in = sum(nf for _, nf in emb_szs) + n_cont
        blocks = []
        for i, (n_out, p) in enumerate(zip(layers, ps)):
            blocks += [nn.Linear(n_in, n_out, bias=False), nn.ReLU(inplace=True), nn.BatchNorm1d(n_out)]
            if p:
                blocks.append(nn.Dropout(p))
            n_in = n_out
        blocks.append(nn.Linear(n_in, out_sz))
        self.layers = nn.Sequential(*blocks)

    def forward(self, x_cat, x_cont):
        x = torch.cat([e(x_cat[:, i]) for i, e in enumerate(self.embeds)], 1)
        x = self.emb_drop(x)
        x = torch.cat([x, self.bn_cont(x_cont)], 1)
        return self.layers(x)


def make_table(seed: int, misaligned: bool):
    rng = np.random.default_rng(1000 + seed)
    n = N_TRAIN + N_VALID
    cats = np.stack([rng.integers(0, c, n) for c in CARDS], 1)
    cont = rng.normal(size=(n, N_CONT)).astype(np.float32)
    cont[:, 0] = cont[:, 0] * 13 + 38          # age-like
    cont[:, 1] = np.abs(cont[:, 1]) * 12 + 30  # hours-per-week-like
    effects = [rng.normal(0, 1.2, c) for c in CARDS]
    logit = sum(e[cats[:, i]] for i, e in enumerate(effects))
    z = (cont - cont.mean(0)) / cont.std(0)
    logit = logit + 1.5 * z[:, 0] - 1.0 * z[:, 1] * z[:, 2] + 0.8 * np.sin(2 * z[:, 3]) - 1.0
    y = (logit + rng.logistic(size=n) * 0.5 > 0).astype(np.int64)
    if misaligned:
        # df = df.sample(frac=1) for the split; y read from the frame before the shuffle
        perm = rng.permutation(n)
        cats, cont = cats[perm], cont[perm]
    # fastai's Normalize proc: continuous columns standardised with the training split's stats
    mu, sd = cont[:N_TRAIN].mean(0), cont[:N_TRAIN].std(0)
    cont = (cont - mu) / sd
    t = lambda a, dt: torch.tensor(a, dtype=dt)
    train = (t(cats[:N_TRAIN], torch.long), t(cont[:N_TRAIN], torch.float32), t(y[:N_TRAIN], torch.long))
    valid = (t(cats[N_TRAIN:], torch.long), t(cont[N_TRAIN:], torch.float32), t(y[N_TRAIN:], torch.long))
    return train, valid


def batches_of(ds, bs, shuffle, seed):
    n = len(ds[0])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    out = []
    for i in range(0, n - (bs - 1 if shuffle else 0), bs):  # fastai drops the last partial train batch
        idx = order[i:i + bs]
        if len(idx) == 0:
            break
        out.append(tuple(a[idx] for a in ds))
    return out


def build(seed_data: int, run: str, variant: str | None):
    misaligned = run == "labels_misaligned" and variant != "align_labels"
    train, valid = make_table(seed_data, misaligned)
    model = TabularModel([(c, emb_sz_rule(c)) for c in CARDS], N_CONT, 2, [200, 100])
    max_lr = MAX_LR / 10 if variant == "lr_lower" else MAX_LR
    opt = torch.optim.Adam(model.parameters(), lr=max_lr, betas=(0.9, 0.99), eps=1e-5)
    steps_per_epoch = N_TRAIN // BS
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=max_lr, total_steps=EPOCHS * steps_per_epoch,
                                                pct_start=0.25, div_factor=25.0, final_div_factor=1e5)
    return model, opt, sched, train, valid, steps_per_epoch


def loss_fn(model, batch):
    x_cat, x_cont, y = batch
    return F.cross_entropy(model(x_cat, x_cont), y)


@torch.no_grad()
def evaluate(model, valid):
    model.eval()
    logits = model(valid[0], valid[1])
    model.train()
    return float(F.cross_entropy(logits, valid[2])), float((logits.argmax(1) == valid[2]).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, opt, sched, train_ds, valid, spe = build(seed, run, variant)
    ckpt_epoch = 3 if run == "healthy" else EPOCHS
    out_dir = Path(out_dir)
    losses, val_losses, accs = [], [], []
    ckpt = out_dir / "models" / "model.pth"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    for epoch in range(EPOCHS):
        for batch in batches_of(train_ds, BS, True, seed * 100 + epoch):
            loss = loss_fn(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        vl, acc = evaluate(model, valid)
        val_losses.append(vl)
        accs.append(acc)
        if epoch + 1 == ckpt_epoch:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt)  # learn.save(with_opt=True)
            if run != "healthy":
                break
    majority = float(max(valid[2].float().mean(), 1 - valid[2].float().mean()))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_acc": accs[-1], "majority": majority, "val_acc_at_ckpt": accs[ckpt_epoch - 1]
                            if len(accs) >= ckpt_epoch else accs[-1]})


def symptom(run: str, trained: Trained) -> str | None:
    acc, maj = trained.metrics["val_acc"], trained.metrics["majority"]
    first = float(np.mean(trained.train_losses[:20]))
    last = float(np.mean(trained.train_losses[-20:]))
    if acc < maj + 0.05:
        return (f"validation accuracy {acc:.3f} against a majority-class rate of {maj:.3f} after "
                f"{len(trained.val_losses)} epochs; train loss {first:.3f} -> {last:.3f}")
    if run == "healthy" and last > 0.8 * first:
        return f"train loss {first:.3f} -> {last:.3f} only"
    return None


def _setup(run: str):
    import triage

    model, opt, sched, train_ds, valid, spe = build(0, run, None)
    return triage.Setup(
        model=model, optimizer=opt, scheduler=sched,
        loss_fn=loss_fn,
        batches=batches_of(train_ds, BS, True, 7)[:48],
        val_batches=batches_of(valid, 200, False, 0),
        total_steps=EPOCHS * spe, scheduler_interval="step",
    )


def setup_healthy():
    return _setup("healthy")


def setup_labels_misaligned():
    return _setup("labels_misaligned")
