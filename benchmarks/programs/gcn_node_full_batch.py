"""Full-batch GCN node classification on one graph with train/val/test masks.

Written after PyTorch Geometric's examples/gcn.py (read through the code search): a two-layer GCN
(`GCNConv(in, 16) -> ReLU -> dropout -> GCNConv(16, C)`), symmetric normalisation D^-1/2 (A+I) D^-1/2,
Adam at lr 0.01 with two param groups (weight decay 5e-4 on the first conv only, 0 on the second), one
optimizer step per epoch on the whole graph, the loss taken on `out[train_mask]`, validation accuracy on
`val_mask`. torch_geometric is not used: the GCN layer here builds its own sparse normalised adjacency from
`edge_index`, and the graph is a stochastic block model made in code (4 communities, noisy class-correlated
node features, 20 labelled nodes per class as in the Planetoid split).

The checkpoint is the PyTorch tutorial layout {"epoch", "model_state_dict", "optimizer_state_dict"}, one
step per epoch, plus a `history.jsonl` of the per-epoch train/val loss.

Runs
- healthy: the example as written; checkpoint at epoch 30 while val loss still falls (it bottoms out
  near epoch 45 on this noisy graph; the train loss keeps falling well below val, as on Cora).
- val_in_train_mask (train_val_overlap): the owner made the split by hand, `train_mask = ~test_mask`, so
  the 200 validation nodes are also supervised by the loss. Validation loss and accuracy look excellent
  while the test nodes (never in the loss) do far worse. A known confusion with full-batch masks: the
  loss must read only `out[train_mask]` (tkipf/gcn#68, dmlc/dgl#2904, waittim/graph-fraud-detection#3
  on loss computed over the wrong mask). Fix: the disjoint split (`disjoint_split`); the competing fix a
  user tries first for "val looks too good / test is bad" is more regularisation (`more_wd`: weight decay
  5e-3 on conv1), which leaves val supervised. Cause train_val_overlap: the validation examples are in the training loss.
- weight_decay_typo (weight_decay_too_high): this owner used the one-group form of the PyG intro docs,
  `Adam(model.parameters(), lr=0.01, weight_decay=5e-4)`, with the decay typed as 5e-1 (Adam's L2 term,
  not decoupled). The L2 pull then holds every weight near zero, the logits near uniform, and the train
  loss sits at ln 4. Fix: 5e-4 (`wd_5e-4`); competing: a 10x higher LR (`lr_x10`), which
  moves nothing since the L2 pull scales with the step as the gradient does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
    name="gcn_node_full_batch",
    kind="graph",
    original="pyg-team/pytorch_geometric examples/gcn.py",
    runs={
        "healthy": Run(cause="healthy", story="Two-layer GCN on a 4-community graph, 20 labels per class; "
                       "checkpoint at epoch 30 while validation loss is still falling."),
        "val_in_train_mask": Run(
            cause="train_val_overlap",
            story="I built the masks by hand and set train_mask = ~test_mask, so the validation nodes were "
                  "in the loss; val accuracy was ~1.0 but test accuracy was much lower.",
            fix="disjoint_split", competing=("more_wd",)),
        "weight_decay_typo": Run(
            cause="weight_decay_too_high",
            story="Train loss stayed near ln 4 for 200 epochs; I had typed weight_decay=5e-1 instead of 5e-4 "
                  "in Adam.",
            fix="wd_5e-4", competing=("lr_x10",)),
    },
)

N_NODES, N_CLASSES, N_FEAT, HIDDEN = 600, 4, 64, 16
EPOCHS = {"healthy": 60, "val_in_train_mask": 200, "weight_decay_typo": 150}
CKPT_EPOCH = {"healthy": 30, "val_in_train_mask": 200, "weight_decay_typo": 150}


def make_graph(seed: int) -> dict:
    g = torch.Generator().manual_seed(1000 + seed)
    y = torch.arange(N_NODES) % N_CLASSES
    y = y[torch.randperm(N_NODES, generator=g)]
    same = y[:, None] == y[None, :]
    p = torch.where(same, torch.tensor(0.01), torch.tensor(0.004))
    upper = torch.triu(torch.rand(N_NODES, N_NODES, generator=g) < p, diagonal=1)
    src, dst = upper.nonzero(as_tuple=True)
    edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    centers = torch.randn(N_CLASSES, N_FEAT, generator=g)
    x = 0.25 * centers[y] + torch.randn(N_NODES, N_FEAT, generator=g)
    perm = torch.randperm(N_NODES, generator=g)
    train_idx = torch.cat([perm[y[perm] == c][:20] for c in range(N_CLASSES)])
    rest = perm[~torch.isin(perm, train_idx)]
    val_idx, test_idx = rest[:200], rest[200:]
    masks = {}
    for name, idx in (("train_mask", train_idx), ("val_mask", val_idx), ("test_mask", test_idx)):
        m = torch.zeros(N_NODES, dtype=torch.bool)
        m[idx] = True
        masks[name] = m
    return {"x": x, "edge_index": edge_index, "y": y, **masks}


class GCNConv(nn.Module):
    """X' = D^-1/2 (A + I) D^-1/2 X W + b, the adjacency a sparse COO tensor built from edge_index."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        nn.init.xavier_uniform_(self.lin.weight)

    @staticmethod
    def norm_adj(edge_index: torch.Tensor, n: int) -> torch.Tensor:
        loops = torch.arange(n)
        row = torch.cat([edge_index[0], loops])
        col = torch.cat([edge_index[1], loops])
        deg = torch.zeros(n).index_add_(0, col, torch.ones(col.numel()))
        dinv = deg.pow(-0.5)
        vals = dinv[row] * dinv[col]
        return torch.sparse_coo_tensor(torch.stack([col, row]), vals, (n, n), check_invariants=False).coalesce()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        adj = self.norm_adj(edge_index, x.size(0))
        return torch.sparse.mm(adj, self.lin(x)) + self.bias


class GCN(nn.Module):
    def __init__(self, in_channels: int, hidden: int, out_channels: int, dropout: float = 0.5):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)
        self.dropout = dropout

    def forward(self, x, edge_index):
        x = F.dropout(x, p=self.dropout, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.conv2(x, edge_index)


def _config(run: str, variant: str | None) -> dict:
    cfg = {"lr": 0.01, "wd1": 5e-4, "dropout": 0.5, "leak": False}
    if run == "val_in_train_mask":
        cfg["leak"] = variant != "disjoint_split"
        if variant == "more_wd":
            cfg["wd1"] = 5e-3
        if variant == "lr_x0.1":
            cfg["lr"] = 0.001
    if run == "weight_decay_typo":
        cfg["wd1"] = 5e-4 if variant == "wd_5e-4" else 5e-1
        if variant == "lr_x10":
            cfg["lr"] = 0.1
    return cfg


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    cfg = _config(run, variant)
    data = make_graph(seed)
    if cfg["leak"]:
        data["train_mask"] = ~data["test_mask"]   # the owner's hand-made split
    model = GCN(N_FEAT, HIDDEN, N_CLASSES, dropout=cfg["dropout"])
    if run == "weight_decay_typo":   # the docs' one-group form, as this owner wrote it
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["wd1"])
    else:
        optimizer = torch.optim.Adam([
            dict(params=model.conv1.parameters(), weight_decay=cfg["wd1"]),
            dict(params=model.conv2.parameters(), weight_decay=0.0),
        ], lr=cfg["lr"])
    return model, optimizer, data


def _batch(data: dict, mask: str) -> dict:
    return {"x": data["x"], "edge_index": data["edge_index"], "y": data["y"], "mask": data[mask]}


def loss_fn(model, batch):
    out = model(batch["x"], batch["edge_index"])
    return F.cross_entropy(out[batch["mask"]], batch["y"][batch["mask"]])


@torch.no_grad()
def _evaluate(model, data):
    model.eval()
    out = model(data["x"], data["edge_index"])
    res = {}
    for split in ("train", "val", "test"):
        m = data[f"{split}_mask"]
        res[f"{split}_loss"] = float(F.cross_entropy(out[m], data["y"][m]))
        res[f"{split}_acc"] = float((out[m].argmax(1) == data["y"][m]).float().mean())
    return res


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, data = _build(run, seed, variant)
    train_batch = _batch(data, "train_mask")
    train_losses, val_losses, rows = [], [], []
    ckpt = out_dir / "ckpt.pt"
    metrics = {}
    for epoch in range(1, EPOCHS[run] + 1):
        model.train()
        optimizer.zero_grad()
        loss = loss_fn(model, train_batch)
        loss.backward()
        optimizer.step()
        ev = _evaluate(model, data)
        train_losses.append(float(loss.detach()))
        val_losses.append(ev["val_loss"])
        rows.append({"step": epoch, "train_loss": float(loss.detach()), "val_loss": ev["val_loss"],
                     "val_acc": ev["val_acc"]})
        if epoch == CKPT_EPOCH[run]:
            torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict()}, ckpt)
            metrics = dict(ev)
    history = out_dir / "history.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics["first_loss"] = train_losses[0]
    metrics["min_train_loss"] = min(train_losses)
    return Trained(checkpoint=ckpt, train_losses=train_losses, val_losses=val_losses, metrics=metrics,
                   history=history)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if not (m["train_loss"] < 0.8 * math.log(N_CLASSES) and m["val_acc"] > 0.45):
            return f"healthy run did not train: train loss {m['train_loss']:.3f}, val acc {m['val_acc']:.2f}"
        return None
    if run == "val_in_train_mask":
        gap = m["val_acc"] - m["test_acc"]
        if gap > 0.15 and m["val_loss"] < 0.8 * m["test_loss"]:
            return (f"val acc {m['val_acc']:.2f} (val loss {m['val_loss']:.3f}) while held-out test acc is "
                    f"{m['test_acc']:.2f} (test loss {m['test_loss']:.3f})")
        return None
    if run == "weight_decay_typo":
        if sum(trained.train_losses[-20:]) / 20 > 0.9 * math.log(N_CLASSES):
            return (f"train loss {trained.train_losses[0]:.3f} -> {trained.train_losses[-1]:.3f} over "
                    f"{len(trained.train_losses)} epochs (ln 4 = {math.log(4):.3f}), val acc {m['val_acc']:.2f}")
        return None
    raise KeyError(run)


def _setup(run: str):
    import triage

    model, optimizer, data = _build(run, 0, None)
    return triage.Setup(
        model=model, optimizer=optimizer, loss_fn=loss_fn,
        batches=[_batch(data, "train_mask")],          # full batch: the one graph is every step's batch
        val_batches=[_batch(data, "val_mask")],
        total_steps=EPOCHS[run], steps_per_epoch=1,
    )


def setup_healthy():
    return _setup("healthy")


def setup_val_in_train_mask():
    return _setup("val_in_train_mask")


def setup_weight_decay_typo():
    return _setup("weight_decay_typo")


if __name__ == "__main__":
    import sys
    import tempfile
    import time

    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        for v in [None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing]:
            t = time.perf_counter()
            tr = train(r, Path(tempfile.mkdtemp()), 0, v)
            print(r, v, f"{time.perf_counter() - t:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                  symptom(r, tr))
