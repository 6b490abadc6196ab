"""BPR matrix factorisation on implicit feedback: (user, positive item, negative item) triplets.

Written after the BPR-in-PyTorch recommender tutorials and Spotlight's ImplicitFactorizationModel (read
through the code search): user and item embedding tables (normal init scaled by 1/dim) plus item biases,
score = <u, i> + b_i, a fresh uniformly sampled negative item for every positive interaction each epoch,
the pairwise BPR loss -log sigmoid(s_ui - s_uj) of the BPR paper (Spotlight's own variant is
1 - sigmoid(.), spotlight#185), Adam with the L2 regularisation given as the optimizer's `weight_decay`
(Spotlight: `optim.Adam(params, weight_decay=self._l2, lr=self._learning_rate)`), mini-batches of 256
triplets as dicts {"user", "pos_item", "neg_item"}. The interactions are made in code: 400 users, 500
items, a rank-8 taste model with a mild popularity skew, ~25 positives per user, one held-out positive
per user for validation (leave-one-out).

The checkpoint is {"state_dict", "optimizer", "iteration"} (iteration = optimizer steps), written at the
end of an epoch; the per-epoch loss goes to `history.csv`.

Runs
- healthy: l2 = 1e-6; checkpoint after epoch 4 of 10 while the loss still falls. BPR's loss floor is not 0
  on sampled negatives (some "negatives" are items the user would like), and it ends well above 0.
- l2_as_bpr_lambda (weight_decay_too_high): the owner took the BPR paper's regularisation constant
  (lambda = 0.1, applied per sampled triplet to the few embeddings it touches) and passed it as Adam's
  `weight_decay=0.1`, which pulls every row of both tables toward zero at every step. The embeddings
  collapse and the loss sits near ln 2 (only the item biases learn popularity). Regularisation
  constants that do not transfer between "per-sample lambda" and "optimizer weight decay" are a recurrent
  question for these models (Spotlight's `l2` argument, LightFM's `user_alpha`/`item_alpha` per-sample
  penalties). Fix: `weight_decay=1e-6` (`l2_1e-6`). Competing: a 10x higher LR (`lr_x10`), which the
  L2 pull scales with. Cause weight_decay_too_high.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

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
    name="bpr_matrix_factorization",
    kind="recsys",
    original="maciejkula/spotlight spotlight/factorization/implicit.py (BPR, Adam weight_decay=l2)",
    runs={
        "healthy": Run(cause="healthy", story="BPR-MF with l2=1e-6; checkpoint after epoch 4 of 10 while the "
                       "pairwise loss is still falling (its floor is well above 0)."),
        "l2_as_bpr_lambda": Run(
            cause="weight_decay_too_high",
            story="I used the BPR paper's lambda=0.1 as Adam's weight_decay; the loss stayed at ~0.69 and "
                  "ranking was no better than popularity.",
            fix="l2_1e-6", competing=("lr_x10",)),
    },
)

N_USERS, N_ITEMS, RANK, DIM, BATCH = 400, 500, 8, 32, 256
EPOCHS = {"healthy": 10, "l2_as_bpr_lambda": 10}
CKPT_EPOCH = {"healthy": 4, "l2_as_bpr_lambda": 8}


def make_interactions(seed: int) -> dict:
    g = torch.Generator().manual_seed(11000 + seed)
    u = torch.randn(N_USERS, RANK, generator=g)
    v = torch.randn(N_ITEMS, RANK, generator=g)
    pop = 0.5 * torch.randn(N_ITEMS, generator=g)
    scores = u @ v.t() / math.sqrt(RANK) + pop
    probs = torch.softmax(scores * 2.0, dim=1)
    pos = torch.multinomial(probs, 26, replacement=False, generator=g)          # (users, 26)
    users = torch.arange(N_USERS)[:, None].expand(-1, 26)
    val = torch.stack([torch.arange(N_USERS), pos[:, 0]], 1)                     # leave-one-out
    train = torch.stack([users[:, 1:].reshape(-1), pos[:, 1:].reshape(-1)], 1)
    seen = torch.zeros(N_USERS, N_ITEMS, dtype=torch.bool)
    seen[users.reshape(-1), pos.reshape(-1)] = True
    return {"train": train, "val": val, "seen": seen}


def sample_triplets(pairs: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """(user, pos, neg) with a uniform negative per positive (Spotlight samples uniformly too)."""
    neg = torch.randint(0, N_ITEMS, (len(pairs),), generator=g)
    return torch.cat([pairs, neg[:, None]], 1)


def batches_of(triplets: torch.Tensor, g: torch.Generator):
    idx = torch.randperm(len(triplets), generator=g)
    for i in range(0, len(idx), BATCH):
        t = triplets[idx[i:i + BATCH]]
        yield {"user": t[:, 0], "pos_item": t[:, 1], "neg_item": t[:, 2]}


class BilinearNet(nn.Module):
    def __init__(self, n_users, n_items, dim):
        super().__init__()
        self.user_embeddings = nn.Embedding(n_users, dim)
        self.item_embeddings = nn.Embedding(n_items, dim)
        self.item_biases = nn.Embedding(n_items, 1)
        nn.init.normal_(self.user_embeddings.weight, 0, 1.0 / dim)
        nn.init.normal_(self.item_embeddings.weight, 0, 1.0 / dim)
        nn.init.zeros_(self.item_biases.weight)

    def forward(self, user, item):
        return (self.user_embeddings(user) * self.item_embeddings(item)).sum(1) + self.item_biases(item).squeeze(1)


def loss_fn(model, batch):
    pos = model(batch["user"], batch["pos_item"])
    neg = model(batch["user"], batch["neg_item"])
    return -F.logsigmoid(pos - neg).mean()


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    data = make_interactions(seed)
    model = BilinearNet(N_USERS, N_ITEMS, DIM)
    l2 = 1e-6 if (run == "healthy" or variant == "l2_1e-6") else 0.1
    lr = 0.1 if variant == "lr_x10" else 0.01
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=l2)
    return model, optimizer, data


@torch.no_grad()
def _evaluate(model, data, g):
    """Held-out positive against sampled negatives: BPR loss and AUC."""
    model.eval()
    val = data["val"]
    negs = torch.randint(0, N_ITEMS, (len(val), 50), generator=g)
    pos = model(val[:, 0], val[:, 1])
    neg = model(val[:, 0].repeat_interleave(50), negs.reshape(-1)).view(len(val), 50)
    diff = pos[:, None] - neg
    return float(-F.logsigmoid(diff).mean()), float((diff > 0).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, data = _build(run, seed, variant)
    g = torch.Generator().manual_seed(12000 + seed)
    ckpt = out_dir / "ckpt.pt"
    losses, val_losses, rows, metrics, iteration = [], [], [], {}, 0
    for epoch in range(1, EPOCHS[run] + 1):
        model.train()
        triplets = sample_triplets(data["train"], g)
        total, n = 0.0, 0
        for batch in batches_of(triplets, g):
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            iteration += 1
            total += float(loss.detach())
            n += 1
        val_loss, val_auc = _evaluate(model, data, torch.Generator().manual_seed(13000 + seed))
        losses.append(total / n)
        val_losses.append(val_loss)
        rows.append({"step": iteration, "epoch": epoch, "loss": total / n, "val_loss": val_loss, "val_auc": val_auc})
        if epoch == CKPT_EPOCH[run]:
            torch.save({"state_dict": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iteration": iteration}, ckpt)
            metrics = {"loss": total / n, "val_loss": val_loss, "val_auc": val_auc}
    history = out_dir / "history.csv"
    with history.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses, metrics=metrics, history=history)


def symptom(run: str, trained: Trained) -> str | None:
    m, losses = trained.metrics, trained.train_losses
    if run == "healthy":
        if not (m["loss"] < 0.8 * math.log(2) and m["val_auc"] > 0.75):
            return f"healthy run did not train: loss {m['loss']:.3f}, val AUC {m['val_auc']:.3f}"
        return None
    if m["loss"] > 0.85 * math.log(2):
        return (f"BPR loss {losses[0]:.3f} -> {m['loss']:.3f} after {CKPT_EPOCH[run]} epochs (ln 2 = 0.693), "
                f"val AUC {m['val_auc']:.3f}")
    return None


def _setup(run: str):
    import triage

    model, optimizer, data = _build(run, 0, None)
    g = torch.Generator().manual_seed(14000)
    batches = list(batches_of(sample_triplets(data["train"], g), g))[:40]
    val = data["val"]
    vneg = torch.randint(0, N_ITEMS, (len(val),), generator=g)
    val_batches = [{"user": val[i:i + BATCH, 0], "pos_item": val[i:i + BATCH, 1], "neg_item": vneg[i:i + BATCH]}
                   for i in range(0, len(val), BATCH)]
    steps_per_epoch = math.ceil(len(data["train"]) / BATCH)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        val_batches=val_batches, total_steps=EPOCHS[run] * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_l2_as_bpr_lambda():
    return _setup("l2_as_bpr_lambda")
