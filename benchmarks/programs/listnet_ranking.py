"""Listwise learning-to-rank: ListNet (top-one probability loss) over padded query slates.

Written after allegro/allRank (`allrank/models/losses/listNet.py`: padded documents carry y = -1, both their
predicted and true scores are set to -inf before the two softmaxes, `-sum(softmax(y_true) * log(softmax(y_pred)
+ eps))` averaged over slates; `allrank/models/model.py`: `FCModel(sizes, input_norm, activation, dropout)` applied
to every document of a slate, an `OutputLayer` reducing to one score, `LTRModel.forward(x, mask, indices)`, xavier
init; `allrank/training/train_utils.py`: `fit` loops epochs over `(xb, yb, indices)` batches of shape
[batch, slate_length, n_features] / [batch, slate_length], `mask = (yb == PADDED_Y_VALUE)`, Adam, a StepLR stepped
once per epoch, NDCG@k on the validation slates every epoch, `torch.save(model.state_dict(), "model.pkl")`).
The data is made in code in the layout of an svmlight/LETOR file (`label qid:Q 1:f1 ... 20:f20`, rows of one
query contiguous but in no particular order): 20 features per document, graded relevance 0-4 from a hidden
non-linear function of the features plus noise, 8 to 30 documents per query, slates padded to 30.

The ListNet loss is a cross-entropy between two distributions over a slate, so its floor is the entropy of
softmax(y_true) (about 2.2-2.4 nats here), not 0; it starts near 2.7-2.9 and a healthy run only moves it by a
few tenths (train 2.7 -> 2.25, val 2.5 -> 2.3-2.37) while val NDCG@10 climbs from ~0.87 to ~0.95 (random: 0.45). Healthy runs called "plateaued" because the loss
barely moves are what this program's healthy run tests.

Runs
- healthy: Adam 1e-3, StepLR(step_size=20, gamma=0.5) per epoch, 30 epochs of 25 batches (16 slates a batch); the
  owner saved model.pkl (a bare state_dict, as allRank does) at epoch 4, train and val loss still falling.
- labels_misaligned_qid_sort: the owner's own LETOR reader sorted each query's rows by doc id (to make slates
  deterministic) when it built the feature tensor, but took the label column from the file order. Every query's
  labels are a permutation of its real labels: the labels are unrelated to the documents. The loss stays at the
  level of a constant score, val NDCG@10 at the level of a random ordering. A real user of LTR data hits exactly
  this because labels, qids and features come from different columns and grouping/sorting must be applied to all
  of them (e.g. the LightGBM/XGBoost ranking docs insist data be "sorted by query" with group sizes matching, and
  allRank's own reader relies on the svmlight row order). Root cause `label_bug`: the fix is to apply the same
  sort to the labels (`aligned_labels`); the competing fix a user tries first on a flat loss, lr x10
  (`lr_0.01`), leaves it. Checkpoint: model.pkl at epoch 4, when the flat loss and random NDCG show.
"""

from __future__ import annotations

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
    name="listnet_ranking",
    kind="learning to rank (listwise)",
    original="allegro/allRank: allrank/models/losses/listNet.py + allrank/models/model.py (FCModel, LTRModel) + "
             "allrank/training/train_utils.py (fit, loss_batch)",
    runs={
        "healthy": Run(cause="healthy", story="ListNet on padded LETOR-style slates; the loss only drops from ~2.9 "
                       "to ~2.5 because its floor is the entropy of the label distribution, not 0, while val "
                       "NDCG@10 climbs. model.pkl saved at epoch 4, still improving."),
        "labels_misaligned_qid_sort": Run(
            cause="label_bug",
            story="My reader sorts each query's documents by doc id for the features, but the labels came from the "
                  "file order. The ListNet loss never moves and NDCG@10 is what a random ordering gets; a 10x "
                  "learning rate changed nothing.",
            fix="aligned_labels", competing=("lr_0.01",)),
    },
)

N_FEAT, SLATE, BATCH, N_TRAIN_Q, N_VAL_Q, EPOCHS, CKPT_EPOCH = 20, 30, 16, 400, 128, 30, 4
PADDED_Y_VALUE, DEFAULT_EPS = -1, 1e-10


def read_letor(seed, n_queries, split, aligned):
    """What the owner's svmlight reader returns: X [Q, SLATE, F], y [Q, SLATE] (-1 = padding), indices."""
    g = torch.Generator().manual_seed(9100 + seed)
    w1 = torch.randn(N_FEAT, 16, generator=g) / math.sqrt(N_FEAT)
    w2 = torch.randn(16, generator=g)
    g = torch.Generator().manual_seed(9200 + 10 * seed + split)
    xs = torch.zeros(n_queries, SLATE, N_FEAT)
    ys = torch.full((n_queries, SLATE), float(PADDED_Y_VALUE))
    for q in range(n_queries):
        n = int(torch.randint(8, SLATE + 1, (1,), generator=g))
        x = torch.randn(n, N_FEAT, generator=g) + 0.5 * torch.randn(1, N_FEAT, generator=g)   # query offset
        util = torch.tanh(x @ w1) @ w2 + 0.3 * torch.randn(n, generator=g)
        util = util - util.mean()
        label = torch.bucketize(util, torch.tensor([-0.6, 0.2, 0.9, 1.6])).float()            # grades 0-4
        doc_id = torch.randperm(n, generator=g)                                                # file order
        by_doc = torch.argsort(doc_id)
        xs[q, :n] = x[by_doc]                                    # features: rows sorted by doc id
        ys[q, :n] = label[by_doc] if aligned else label          # labels: the fault keeps the file order
    indices = torch.arange(SLATE).expand(n_queries, SLATE).clone()
    return xs, ys, indices


class FCModel(nn.Module):
    def __init__(self, sizes, input_norm, activation, dropout, n_features):
        super().__init__()
        sizes = [n_features] + list(sizes)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.input_norm = nn.LayerNorm(n_features) if input_norm else nn.Identity()
        self.activation = activation
        self.dropout = nn.Dropout(dropout)
        self.output_size = sizes[-1]

    def forward(self, x):
        x = self.input_norm(x)
        for layer in self.layers:
            x = self.dropout(self.activation(layer(x)))
        return x


class OutputLayer(nn.Module):
    def __init__(self, d_model, d_output=1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_output)

    def forward(self, x):
        return self.w_1(x).squeeze(dim=2)


class LTRModel(nn.Module):
    def __init__(self, input_layer, output_layer):
        super().__init__()
        self.input_layer = input_layer
        self.output_layer = output_layer

    def forward(self, x, mask, indices):
        return self.output_layer(self.input_layer(x))

    def score(self, x, mask, indices):
        return self.forward(x, mask, indices)


def make_model():
    fc = FCModel([64, 64], input_norm=True, activation=nn.ReLU(), dropout=0.0, n_features=N_FEAT)
    model = LTRModel(fc, OutputLayer(fc.output_size))
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return model


def listNet(y_pred, y_true, eps=DEFAULT_EPS, padded_value_indicator=PADDED_Y_VALUE):
    y_pred = y_pred.clone()
    y_true = y_true.clone()
    mask = y_true == padded_value_indicator
    y_pred[mask] = float("-inf")
    y_true[mask] = float("-inf")
    preds_smax = F.softmax(y_pred, dim=1) + eps
    true_smax = F.softmax(y_true, dim=1)
    return torch.mean(-torch.sum(true_smax * torch.log(preds_smax), dim=1))


def loss_fn(model, batch):
    xb, yb, indices = batch
    mask = yb == PADDED_Y_VALUE
    return listNet(model(xb, mask, indices), yb)


def ndcg_at(scores, y, k=10):
    """Mean NDCG@k over slates, padded documents excluded, gain 2^rel - 1."""
    mask = y == PADDED_Y_VALUE
    scores = scores.masked_fill(mask, float("-inf"))
    rel = y.clamp(min=0)
    order = scores.argsort(dim=1, descending=True)
    gains = (2 ** rel.gather(1, order) - 1)[:, :k]
    ideal = (2 ** rel.sort(dim=1, descending=True).values - 1)[:, :k]
    disc = 1.0 / torch.log2(torch.arange(2, k + 2).float())
    dcg, idcg = (gains * disc).sum(1), (ideal * disc).sum(1)
    ok = idcg > 0
    return float((dcg[ok] / idcg[ok]).mean())


def make_data(run, variant, seed):
    aligned = run == "healthy" or variant == "aligned_labels"
    return (read_letor(seed, N_TRAIN_Q, 0, aligned), read_letor(seed, N_VAL_Q, 1, aligned),
            read_letor(seed, N_VAL_Q, 1, True))


def batches_for_epoch(ds, epoch, seed):
    x, y, idx = ds
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [(x[o], y[o], idx[o]) for o in (order[i:i + BATCH] for i in range(0, len(x), BATCH))]


def build(run, variant, seed=0):
    torch.manual_seed(seed)
    model = make_model()
    lr = 0.01 if variant == "lr_0.01" else 1e-3
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    return model, optimizer, scheduler


@torch.no_grad()
def evaluate(model, ds):
    x, y, idx = ds
    model.eval()
    s = model.score(x, y == PADDED_Y_VALUE, idx)
    loss = float(listNet(s, y))
    model.train()
    return loss, ndcg_at(s, y)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_ds, val_ds, honest_val = make_data(run, variant, seed)
    model, optimizer, scheduler = build(run, variant, seed)
    ckpt = Path(out_dir) / "model.pkl"
    losses, val_losses, val_ndcg = [], [], []
    for epoch in range(EPOCHS):
        model.train()
        for xb, yb, indices in batches_for_epoch(train_ds, epoch, seed):
            loss = loss_fn(model, (xb, yb, indices))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        vl, vn = evaluate(model, val_ds)
        val_losses.append(vl)
        val_ndcg.append(vn)
        scheduler.step()
        if epoch + 1 == CKPT_EPOCH:
            torch.save(model.state_dict(), ckpt)
    with torch.no_grad():
        xv, yv, iv = honest_val
        rnd = ndcg_at(torch.rand(yv.shape, generator=torch.Generator().manual_seed(seed)), yv)
    _, honest = evaluate(model, honest_val)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_ndcg10": val_ndcg[-1], "val_ndcg10_first": val_ndcg[0],
                            "honest_ndcg10": honest, "random_ndcg10": rnd,
                            "first_epoch_loss": sum(losses[:25]) / 25, "last_epoch_loss": sum(losses[-25:]) / 25})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["val_ndcg10"] < m["random_ndcg10"] + 0.1:
        return (f"val NDCG@10 {m['val_ndcg10']:.3f} after {EPOCHS} epochs, a random ordering gets "
                f"{m['random_ndcg10']:.3f}; train ListNet loss {m['first_epoch_loss']:.3f} -> "
                f"{m['last_epoch_loss']:.3f}")
    return None


def _setup(run):
    import triage

    train_ds, val_ds, _ = make_data(run, None, 0)
    model, optimizer, scheduler = build(run, None, 0)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn,
                        batches=batches_for_epoch(train_ds, 0, 0) + batches_for_epoch(train_ds, 1, 0),
                        val_batches=batches_for_epoch(val_ds, 0, 0),
                        scheduler=scheduler, scheduler_interval="epoch", steps_per_epoch=N_TRAIN_Q // BATCH,
                        total_steps=EPOCHS * (N_TRAIN_Q // BATCH))


def setup_healthy():
    return _setup("healthy")


def setup_labels_misaligned_qid_sort():
    return _setup("labels_misaligned_qid_sort")
