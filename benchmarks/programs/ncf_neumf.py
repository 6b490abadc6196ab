"""NeuMF (neural collaborative filtering): GMF + MLP paths, BCE on sampled negatives.

Written after guoyang9/NCF (the widely used PyTorch NCF/NeuMF implementation: main.py, model.py,
data_utils.py; read through the code search) and He et al.'s reference code: a GMF path (user and item
embeddings of size `factor_num`, element-wise product) and an MLP path (embeddings of size
factor_num * 2^(layers-1), a tower of Linear+ReLU halving the width, dropout), concatenated into one
linear `predict_layer` giving a logit, `BCEWithLogitsLoss`, Adam at lr 1e-3, batch 256, `num_ng = 4`
negatives per positive drawn by `train_loader.dataset.ng_sample()` at the start of every epoch, and
leave-one-out evaluation (HR@10 of the held-out item against 99 sampled items). The implicit-feedback
data is made in code: 300 users, 600 items, a rank-8 taste model, 20 positives per user, one held out
per user. Batches are dicts {"user", "item", "label"} (label float 0/1).

The checkpoint is {"model", "optimizer", "epoch"} at an epoch's end; train loss, validation BCE (the
held-out positive and 4 fresh negatives per user) and HR@10 per epoch go to `history.csv`.

Runs
- healthy: negatives re-drawn every epoch; checkpoint after epoch 3 of 6 while val loss still falls.
- labels_misaligned (label_bug): the owner edited `ng_sample()` to build `features_fill = features_ng +
  features_ps` (negatives first) and left `labels_fill = labels_ps + labels_ng` as it was. The first
  len(positives) rows, all negatives of the first quarter of the users, are now labelled 1 and every
  true positive is labelled 0. The labels follow row position, not the (user, item) pair: the train loss
  falls fast (the model learns "users 0-74 click everything, nobody else clicks") while validation BCE
  on correctly labelled held-out pairs climbs above what predicting the base rate scores, and HR@10
  stays near a random ranking's. guoyang9/NCF's data_utils builds the two lists separately in exactly
  this way (features_ps + features_ng, labels_ps + labels_ng), so the two concatenations must stay in the
  same order; its issues #4/#6 show how often people edit that sampling code. Fix: concatenate the labels
  in the features' order (`align_labels`). Competing: a 10x lower LR (`lr_x0.1`) and dropout 0.5
  (`dropout_0.5`), the usual answers to "train falls, val rises", which leave the labels wrong. Cause
  label_bug: the targets the loss reads do not belong to their inputs.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch
import torch.nn as nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="ncf_neumf",
    kind="recsys",
    original="guoyang9/NCF main.py / model.py / data_utils.py (NeuMF-end)",
    runs={
        "healthy": Run(cause="healthy", story="NeuMF with 4 fresh negatives per positive each epoch; checkpoint "
                       "after epoch 3 of 6 while val loss still falls."),
        "labels_misaligned": Run(
            cause="label_bug",
            story="I changed ng_sample() to put the negatives first and did not touch the labels; train loss "
                  "fell nicely but val loss went up from epoch 1 and HR@10 stayed near random.",
            fix="align_labels", competing=("lr_x0.1", "dropout_0.5")),
    },
)

N_USERS, N_ITEMS, RANK, N_POS, NUM_NG, BATCH = 300, 600, 8, 20, 4, 256
FACTOR, LAYERS = 16, 3
EPOCHS = {"healthy": 6, "labels_misaligned": 5}
CKPT_EPOCH = {"healthy": 3, "labels_misaligned": 5}


def make_data(seed: int) -> dict:
    g = torch.Generator().manual_seed(41000 + seed)
    u = torch.randn(N_USERS, RANK, generator=g)
    v = torch.randn(N_ITEMS, RANK, generator=g)
    probs = torch.softmax(3.0 * u @ v.t() / math.sqrt(RANK), 1)
    pos = torch.multinomial(probs, N_POS + 1, replacement=False, generator=g)
    users = torch.arange(N_USERS)[:, None].expand(-1, N_POS)
    train = torch.stack([users.reshape(-1), pos[:, 1:].reshape(-1)], 1)
    test_item = pos[:, 0]
    seen = torch.zeros(N_USERS, N_ITEMS, dtype=torch.bool)
    seen[torch.arange(N_USERS)[:, None], pos] = True
    val_neg = _sample_negatives(torch.arange(N_USERS).repeat_interleave(NUM_NG), seen, g)
    val_u = torch.cat([torch.arange(N_USERS), torch.arange(N_USERS).repeat_interleave(NUM_NG)])
    val_i = torch.cat([test_item, val_neg])
    val_y = torch.cat([torch.ones(N_USERS), torch.zeros(N_USERS * NUM_NG)])
    rank_items = torch.cat([test_item[:, None], torch.randint(0, N_ITEMS, (N_USERS, 99), generator=g)], 1)
    return {"train": train, "seen": seen, "val": {"user": val_u, "item": val_i, "label": val_y},
            "rank_items": rank_items}


def _sample_negatives(users: torch.Tensor, seen: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    items = torch.randint(0, N_ITEMS, (len(users),), generator=g)
    bad = seen[users, items]
    while bad.any():
        items[bad] = torch.randint(0, N_ITEMS, (int(bad.sum()),), generator=g)
        bad = seen[users, items]
    return items


class NCFData:
    """guoyang9/NCF's NCFData: positives plus `num_ng` negatives each, drawn by ng_sample()."""

    def __init__(self, train: torch.Tensor, seen: torch.Tensor, g: torch.Generator, negatives_first=False):
        self.train, self.seen, self.g, self.negatives_first = train, seen, g, negatives_first
        self.features = None

    def ng_sample(self):
        u = self.train[:, 0].repeat_interleave(NUM_NG)
        neg = _sample_negatives(u, self.seen, self.g)
        labels_ps = torch.ones(len(self.train))
        labels_ng = torch.zeros(len(u))
        if self.negatives_first:     # the owner's edit: features_ng + features_ps, labels left as ps + ng
            users, items = torch.cat([u, self.train[:, 0]]), torch.cat([neg, self.train[:, 1]])
        else:
            users, items = torch.cat([self.train[:, 0], u]), torch.cat([self.train[:, 1], neg])
        self.features = {"user": users, "item": items, "label": torch.cat([labels_ps, labels_ng])}

    def batches(self, g: torch.Generator):
        f = self.features
        idx = torch.randperm(len(f["user"]), generator=g)
        for i in range(0, len(idx), BATCH):
            j = idx[i:i + BATCH]
            yield {k: v[j] for k, v in f.items()}


class NCF(nn.Module):
    def __init__(self, user_num, item_num, factor_num, num_layers, dropout):
        super().__init__()
        self.embed_user_GMF = nn.Embedding(user_num, factor_num)
        self.embed_item_GMF = nn.Embedding(item_num, factor_num)
        mlp_dim = factor_num * (2 ** (num_layers - 1))
        self.embed_user_MLP = nn.Embedding(user_num, mlp_dim)
        self.embed_item_MLP = nn.Embedding(item_num, mlp_dim)
        layers = []
        for i in range(num_layers):
            input_size = factor_num * (2 ** (num_layers - i))
            layers += [nn.Dropout(p=dropout), nn.Linear(input_size, input_size // 2), nn.ReLU()]
        self.MLP_layers = nn.Sequential(*layers)
        self.predict_layer = nn.Linear(factor_num * 2, 1)
        for emb in (self.embed_user_GMF, self.embed_item_GMF, self.embed_user_MLP, self.embed_item_MLP):
            nn.init.normal_(emb.weight, std=0.01)
        for m in self.MLP_layers:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.kaiming_uniform_(self.predict_layer.weight, a=1, nonlinearity="sigmoid")
        nn.init.zeros_(self.predict_layer.bias)

    def forward(self, user, item):
        output_GMF = self.embed_user_GMF(user) * self.embed_item_GMF(item)
        interaction = torch.cat((self.embed_user_MLP(user), self.embed_item_MLP(item)), -1)
        output_MLP = self.MLP_layers(interaction)
        return self.predict_layer(torch.cat((output_GMF, output_MLP), -1)).view(-1)


loss_function = nn.BCEWithLogitsLoss()


def loss_fn(model, batch):
    return loss_function(model(batch["user"], batch["item"]), batch["label"])


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    data = make_data(seed)
    model = NCF(N_USERS, N_ITEMS, FACTOR, LAYERS, dropout=0.5 if variant == "dropout_0.5" else 0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4 if variant == "lr_x0.1" else 1e-3)
    dataset = NCFData(data["train"], data["seen"], torch.Generator().manual_seed(42000 + seed),
                      negatives_first=(run == "labels_misaligned" and variant != "align_labels"))
    return model, optimizer, data, dataset


@torch.no_grad()
def _evaluate(model, data):
    model.eval()
    v = data["val"]
    val_loss = float(loss_function(model(v["user"], v["item"]), v["label"]))
    items = data["rank_items"]
    scores = model(torch.arange(N_USERS).repeat_interleave(100), items.reshape(-1)).view(N_USERS, 100)
    hr = float((scores[:, 1:] >= scores[:, :1]).sum(1).lt(10).float().mean())
    return val_loss, hr


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, data, dataset = _build(run, seed, variant)
    g = torch.Generator().manual_seed(43000 + seed)
    ckpt = out_dir / "ckpt.pt"
    losses, val_losses, hrs, rows = [], [], [], []
    for epoch in range(1, EPOCHS[run] + 1):
        model.train()
        dataset.ng_sample()
        total, n = 0.0, 0
        for batch in dataset.batches(g):
            model.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            n += 1
        val_loss, hr = _evaluate(model, data)
        losses.append(total / n)
        val_losses.append(val_loss)
        hrs.append(hr)
        rows.append({"epoch": epoch, "step": epoch * n, "train_loss": total / n, "val_loss": val_loss, "HR@10": hr})
        if epoch == CKPT_EPOCH[run]:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, ckpt)
    history = out_dir / "history.csv"
    with history.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"hr_at_ckpt": hrs[CKPT_EPOCH[run] - 1]}, history=history)


def symptom(run: str, trained: Trained) -> str | None:
    tl, vl = trained.train_losses, trained.val_losses
    e = CKPT_EPOCH[run]
    tl, vl = tl[:e], vl[:e]
    best = min(range(e), key=vl.__getitem__)
    if run == "healthy":
        if not (vl[-1] < vl[0] and tl[-1] < tl[0] and best == e - 1):
            return f"healthy run did not train: train {tl[0]:.3f} -> {tl[-1]:.3f}, val {vl[0]:.3f} -> {vl[-1]:.3f}"
        return None
    hr = trained.metrics["hr_at_ckpt"]
    constant = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))     # val BCE of predicting the 20% positive rate
    if vl[-1] > constant and tl[-1] < 0.6 * tl[0]:
        return (f"val BCE {vl[0]:.3f} -> {vl[-1]:.3f} by epoch {e}, worse than predicting the positive rate "
                f"({constant:.3f}), while train loss fell {tl[0]:.3f} -> {tl[-1]:.3f}; HR@10 {hr:.3f}")
    return None


def _setup(run: str):
    import triage

    model, optimizer, data, dataset = _build(run, 0, None)
    dataset.ng_sample()
    batches = list(dataset.batches(torch.Generator().manual_seed(44000)))[:48]
    v = data["val"]
    val_batches = [{k: t[i:i + 300] for k, t in v.items()} for i in range(0, len(v["user"]), 300)]
    steps_per_epoch = math.ceil(len(data["train"]) * (1 + NUM_NG) / BATCH)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        val_batches=val_batches, total_steps=EPOCHS[run] * steps_per_epoch,
                        steps_per_epoch=steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_labels_misaligned():
    return _setup("labels_misaligned")
