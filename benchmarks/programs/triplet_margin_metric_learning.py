"""Metric learning: an embedding MLP trained with a triplet margin loss on mined triplets, m-per-class batches.

Written after pytorch-metric-learning's examples (KevinMusgrave/pytorch-metric-learning, examples/notebooks
"TripletMarginLossMNIST" and the trainers' "trunk + embedder" recipe): a trunk network and an embedder,
`miners.TripletMarginMiner(margin=0.2, type_of_triplets="all")` picking the triplets that violate the margin,
`losses.TripletMarginLoss(margin=0.2)` on L2-normalised embeddings (`LpDistance(normalize_embeddings=True)`)
with its `AvgNonZeroReducer` (the mean over triplets whose loss is not zero), batches drawn by an
`MPerClassSampler(m=4)`, and accuracy measured as precision@1 of nearest neighbours on held-out data
(`AccuracyCalculator`). The optimisers are the examples' pair, one Adam for the trunk and one for the
embedder, each with `weight_decay=1e-4`. A batch is `(data, labels)`. Checkpoint: the examples' `save_models`
style dict `{"trunk": ..., "embedder": ..., "trunk_optimizer": ..., "embedder_optimizer": ...}` - here one
`nn.Sequential(trunk, embedder)` saved as `{"model", "optimizer", "iteration"}` since setup() hands triage one
model and the two optimizers' groups as one Adam over two param groups.

Data: 16 classes whose points live on a 12-dimensional class manifold, mapped non-linearly into 32 informative
features, plus 48 noisy distractor features of larger variance, so nearest neighbours on the raw inputs are
poor and the embedding has to be learnt.

Runs
- healthy: lr 1e-3 for both; checkpoint at iteration 200 of 400, loss and precision@1 still improving. A
  mined-triplet loss is an interesting healthy curve: as the embedding gets better the miner hands the loss
  only the harder remaining triplets, so the averaged loss falls noisily (and reads 0 on a batch where the
  miner finds no violating triplet), not smoothly.
- lr_too_low: the owner copied the optimiser lines of the library's example, `lr=0.00001` for the trunk and
  the embedder, which were meant for fine-tuning a *pretrained* trunk (the examples load an ImageNet
  ResNet), onto a trunk trained from scratch: the loss creeps down and precision@1 crawls from ~0.52
  (the random network) to ~0.77 in 400 iterations, where the same network at 1e-3 reaches ~0.97.
  Root cause `lr_too_low` (the fix, lr 1e-3, removes it). Competing fix a user tries first: dropping the weight decay (`no_weight_decay`),
  which leaves it.
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
    name="triplet_margin_metric_learning",
    kind="ranking",
    original="pytorch-metric-learning (KevinMusgrave): examples/notebooks TripletMarginLossMNIST + "
             "losses/triplet_margin_loss.py, miners/triplet_margin_miner.py",
    runs={
        "healthy": Run(cause="healthy", story="Trunk + embedder, TripletMarginMiner('all') + TripletMarginLoss "
                       "margin 0.2, Adam 1e-3; checkpoint at iteration 200 of 400 while P@1 still rises."),
        "lr_too_low": Run(
            cause="lr_too_low",
            story="Copied the example's Adam(lr=0.00001, weight_decay=0.0001) lines for a trunk trained from "
                  "scratch; precision@1 crawls from 0.52 to 0.77 in 400 iterations.",
            fix="lr_1e-3", competing=("no_weight_decay",)),
    },
)

N_CLASSES, M_PER_CLASS, CLASSES_PER_BATCH = 16, 4, 8
N_PER_CLASS, N_VAL_PER_CLASS = 90, 30
ITERS, MARGIN = 400, 0.2


def make_data(seed):
    rng = np.random.default_rng(4000 + seed)
    latent_dim, info_dim, noise_dim = 12, 32, 48
    centers = rng.normal(0, 1.0, (N_CLASSES, latent_dim))
    n = N_PER_CLASS + N_VAL_PER_CLASS
    z = centers[:, None, :] + rng.normal(0, 0.55, (N_CLASSES, n, latent_dim))
    W1 = rng.normal(0, 1 / np.sqrt(latent_dim), (latent_dim, info_dim))
    info = np.tanh(z @ W1) * 1.0 + 0.1 * rng.normal(size=(N_CLASSES, n, info_dim))
    noise = rng.normal(0, 2.5, (N_CLASSES, n, noise_dim))
    x = np.concatenate([info, noise], -1).astype(np.float32)
    x = (x - x.reshape(-1, x.shape[-1]).mean(0)) / x.reshape(-1, x.shape[-1]).std(0)
    labels = np.repeat(np.arange(N_CLASSES)[:, None], n, 1)
    tr = (torch.tensor(x[:, :N_PER_CLASS].reshape(-1, x.shape[-1])), torch.tensor(labels[:, :N_PER_CLASS].reshape(-1)))
    va = (torch.tensor(x[:, N_PER_CLASS:].reshape(-1, x.shape[-1])), torch.tensor(labels[:, N_PER_CLASS:].reshape(-1)))
    return tr, va


def m_per_class_batches(ds, n_batches, seed):
    """MPerClassSampler: each batch holds M_PER_CLASS examples of CLASSES_PER_BATCH classes."""
    x, y = ds
    g = torch.Generator().manual_seed(seed)
    by_class = [torch.where(y == c)[0] for c in range(N_CLASSES)]
    out = []
    for _ in range(n_batches):
        cls = torch.randperm(N_CLASSES, generator=g)[:CLASSES_PER_BATCH]
        idx = torch.cat([by_class[c][torch.randperm(len(by_class[c]), generator=g)[:M_PER_CLASS]] for c in cls])
        out.append((x[idx], y[idx]))
    return out


def lp_distance(emb):
    emb = F.normalize(emb, p=2, dim=1)
    sq = (emb[:, None, :] - emb[None, :, :]).pow(2).sum(-1)
    return torch.sqrt(sq.clamp_min(1e-12))


def mine_triplets(dist, labels, margin=MARGIN):
    """TripletMarginMiner(type_of_triplets='all'): every (a, p, n) whose margin is violated."""
    with torch.no_grad():
        same = labels[:, None] == labels[None, :]
        eye = torch.eye(len(labels), dtype=torch.bool)
        a, p, n = torch.where((same & ~eye)[:, :, None] & (~same)[:, None, :])
        keep = (dist[a, n] - dist[a, p]) <= margin
    return a[keep], p[keep], n[keep]


def triplet_margin_loss(emb, labels, margin=MARGIN):
    dist = lp_distance(emb)
    a, p, n = mine_triplets(dist, labels, margin)
    losses = F.relu(dist[a, p] - dist[a, n] + margin)
    nonzero = losses > 0
    if not bool(nonzero.any()):
        return emb.sum() * 0
    return losses[nonzero].mean()   # AvgNonZeroReducer


def loss_fn(model, batch):
    data, labels = batch
    return triplet_margin_loss(model(data), labels)


def build(seed, run, variant):
    train_ds, val_ds = make_data(seed)
    trunk = nn.Sequential(nn.Linear(80, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
    embedder = nn.Linear(256, 64)
    model = nn.Sequential(trunk, embedder)
    lr = 1e-5 if run == "lr_too_low" and variant != "lr_1e-3" else 1e-3
    wd = 0.0 if variant == "no_weight_decay" else 1e-4
    opt = torch.optim.Adam([{"params": trunk.parameters(), "lr": lr, "weight_decay": wd},
                            {"params": embedder.parameters(), "lr": lr, "weight_decay": wd}])
    return model, opt, train_ds, val_ds


@torch.no_grad()
def precision_at_1(model, ds):
    was = model.training
    model.eval()
    e = F.normalize(model(ds[0]), dim=1)
    model.train(was)
    d = torch.cdist(e, e)
    d.fill_diagonal_(float("inf"))
    return float((ds[1][d.argmin(1)] == ds[1]).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, opt, train_ds, val_ds = build(seed, run, variant)
    p1_init = precision_at_1(model, val_ds)
    ckpt_iter = 200 if run == "healthy" else ITERS
    ckpt = Path(out_dir) / "checkpoint.pt"
    losses, p1s = [], []
    for it, batch in enumerate(m_per_class_batches(train_ds, ITERS, seed), start=1):
        loss = loss_fn(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if it % 50 == 0:
            p1s.append(precision_at_1(model, val_ds))
        if it == ckpt_iter:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": it}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"p1_init": p1_init, "p1": p1s[-1], "p1_at_ckpt": p1s[ckpt_iter // 50 - 1]})


def symptom(run: str, trained: Trained) -> str | None:
    tl = trained.train_losses
    first, last = float(np.mean(tl[:20])), float(np.mean(tl[-40:]))
    p0, p1 = trained.metrics["p1_init"], trained.metrics["p1"]
    if p1 < 0.88:
        return (f"triplet loss {first:.3f} -> {last:.3f} over {len(tl)} iterations (margin {MARGIN}); "
                f"precision@1 {p0:.3f} at init -> {p1:.3f}")
    return None


def _setup(run):
    import triage

    model, opt, train_ds, val_ds = build(0, run, None)
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn,
                        batches=m_per_class_batches(train_ds, 48, 123),
                        val_batches=m_per_class_batches(val_ds, 10, 321),
                        total_steps=ITERS)


def setup_healthy():
    return _setup("healthy")


def setup_lr_too_low():
    return _setup("lr_too_low")
