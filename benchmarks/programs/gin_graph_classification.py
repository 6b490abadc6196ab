"""GIN graph classification: many small graphs batched into one disjoint graph, global add pooling.

Written after PyTorch Geometric's examples/mutag_gin.py (read through the code search): `GINConv` layers
whose MLP is Linear -> BatchNorm -> ReLU -> Linear, node states summed per graph with `global_add_pool`
over the `batch` vector, a final MLP with dropout 0.5, cross-entropy, Adam at lr 0.01, a DataLoader that
collates graphs PyG-style (node features concatenated, `edge_index` offset per graph, `batch` the graph id
of every node). torch_geometric is not used: the collate, the GIN layer and the pooling are written here,
and the dataset is a MUTAG-like set of 600 small molecules made in code (7 atom types one-hot, 10-24
atoms; class 1 graphs carry ring closures and an atom-type mix that class 0 graphs do not, with overlap).

The checkpoint is {"epoch", "model_state_dict", "optimizer_state_dict"} at an epoch's end (15 optimizer
steps an epoch); the per-epoch train loss / val loss go to `history.csv`.

Runs
- healthy: the example as written; checkpoint after epoch 4 of 12 while train and val loss still fall.
- shuffled_graphs_not_labels (label_bug): the owner kept the graphs in a Python list and the labels in a
  separate tensor, and shuffled the list (`random.shuffle(graphs)`) before the split without permuting
  the labels, then re-attached `y` by position. Every graph now carries a random other graph's label. The
  train loss sits at ln 2 and accuracy at chance. Keeping inputs and labels together through a shuffle is
  the classic version of this bug in dataset code (e.g. "shuffle data and labels together" questions,
  and the PyG docs' advice to call `dataset.shuffle()` on the dataset object, which moves `y` with the
  graph). Fix: shuffle the (graph, label) pairs together (`shuffle_pairs`). Competing fixes a user tries
  first for "loss stuck at ln 2": a 10x lower LR (`lr_x0.1`) and a wider model (`hidden_128`). Cause
  label_bug: the labels no longer belong to their inputs.
"""

from __future__ import annotations

import csv
import math
import random
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
    name="gin_graph_classification",
    kind="graph",
    original="pyg-team/pytorch_geometric examples/mutag_gin.py",
    runs={
        "healthy": Run(cause="healthy", story="GIN on 600 small molecule graphs; checkpoint after epoch 4 of 12 "
                       "while train and val loss still fall."),
        "shuffled_graphs_not_labels": Run(
            cause="label_bug",
            story="I shuffled my list of graphs before the train/val split but the labels lived in a separate "
                  "tensor I did not shuffle; the loss sat at 0.69 for 12 epochs.",
            fix="shuffle_pairs", competing=("lr_x0.1", "hidden_128")),
    },
)

N_GRAPHS, N_TYPES, HIDDEN, BATCH = 600, 7, 32, 32
EPOCHS = {"healthy": 12, "shuffled_graphs_not_labels": 12}
CKPT_EPOCH = {"healthy": 4, "shuffled_graphs_not_labels": 10}


def make_dataset(seed: int) -> tuple[list[dict], torch.Tensor]:
    """Graphs as dicts {"x", "edge_index"} and their labels, in generation order."""
    g = torch.Generator().manual_seed(5000 + seed)
    graphs, labels = [], []
    for i in range(N_GRAPHS):
        label = i % 2
        n = int(torch.randint(10, 25, (1,), generator=g))
        probs = torch.tensor([0.5, 0.15, 0.15, 0.05, 0.05, 0.05, 0.05]) if label == 0 else \
            torch.tensor([0.35, 0.25, 0.1, 0.1, 0.1, 0.05, 0.05])
        types = torch.multinomial(probs, n, replacement=True, generator=g)
        # a random tree ...
        parents = [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, n)]
        edges = [(j, p) for j, p in zip(range(1, n), parents)]
        # ... with ring closures for class 1 (and occasionally for class 0)
        n_rings = int(torch.randint(1, 4, (1,), generator=g)) if label == 1 else \
            int(torch.rand(1, generator=g) < 0.3)
        for _ in range(n_rings):
            a = int(torch.randint(0, n - 2, (1,), generator=g))
            edges.append((a, a + 2))
        e = torch.tensor(edges, dtype=torch.long).t()
        edge_index = torch.cat([e, e.flip(0)], 1)
        graphs.append({"x": F.one_hot(types, N_TYPES).float(), "edge_index": edge_index})
        labels.append(label)
    return graphs, torch.tensor(labels)


def collate(items: list[tuple[dict, int]]) -> dict:
    xs, eis, bs, offset = [], [], [], 0
    for i, (graph, _) in enumerate(items):
        xs.append(graph["x"])
        eis.append(graph["edge_index"] + offset)
        bs.append(torch.full((graph["x"].size(0),), i, dtype=torch.long))
        offset += graph["x"].size(0)
    return {"x": torch.cat(xs), "edge_index": torch.cat(eis, 1), "batch": torch.cat(bs),
            "y": torch.tensor([int(y) for _, y in items]), "num_graphs": len(items)}


def global_add_pool(x: torch.Tensor, batch: torch.Tensor, size: int) -> torch.Tensor:
    return torch.zeros(size, x.size(1)).index_add_(0, batch, x)


class GINConv(nn.Module):
    def __init__(self, mlp: nn.Module, eps: float = 0.0):
        super().__init__()
        self.mlp, self.eps = mlp, eps

    def forward(self, x, edge_index):
        src, dst = edge_index
        agg = torch.zeros_like(x).index_add_(0, dst, x[src])
        return self.mlp((1 + self.eps) * x + agg)


class GIN(nn.Module):
    def __init__(self, in_channels, hidden, out_channels, num_layers=3):
        super().__init__()
        self.convs = nn.ModuleList()
        for i in range(num_layers):
            mlp = nn.Sequential(nn.Linear(in_channels if i == 0 else hidden, hidden), nn.BatchNorm1d(hidden),
                                nn.ReLU(), nn.Linear(hidden, hidden))
            self.convs.append(GINConv(mlp))
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.5),
                                  nn.Linear(hidden, out_channels))

    def forward(self, x, edge_index, batch, num_graphs):
        for conv in self.convs:
            x = F.relu(conv(x, edge_index))
        return self.head(global_add_pool(x, batch, num_graphs))


def loss_fn(model, batch):
    out = model(batch["x"], batch["edge_index"], batch["batch"], batch["num_graphs"])
    return F.cross_entropy(out, batch["y"])


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    graphs, labels = make_dataset(seed)
    rnd = random.Random(seed)
    if run == "shuffled_graphs_not_labels" and variant != "shuffle_pairs":
        rnd.shuffle(graphs)                                  # the labels stay in generation order
        pairs = list(zip(graphs, labels.tolist()))
    else:
        pairs = list(zip(graphs, labels.tolist()))
        rnd.shuffle(pairs)
    n_train = int(0.8 * len(pairs))
    train_set, val_set = pairs[:n_train], pairs[n_train:]
    hidden = 128 if variant == "hidden_128" else HIDDEN
    model = GIN(N_TYPES, hidden, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001 if variant == "lr_x0.1" else 0.01)
    loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(seed))
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=BATCH, collate_fn=collate)
    return model, optimizer, loader, val_loader


@torch.no_grad()
def _eval(model, loader):
    model.eval()
    tot, correct, n = 0.0, 0, 0
    for b in loader:
        out = model(b["x"], b["edge_index"], b["batch"], b["num_graphs"])
        tot += float(F.cross_entropy(out, b["y"], reduction="sum"))
        correct += int((out.argmax(1) == b["y"]).sum())
        n += b["num_graphs"]
    return tot / n, correct / n


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, loader, val_loader = _build(run, seed, variant)
    ckpt = out_dir / "ckpt.pt"
    train_losses, val_losses, rows, metrics = [], [], [], {}
    for epoch in range(1, EPOCHS[run] + 1):
        model.train()
        total, n = 0.0, 0
        for batch in loader:
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * batch["num_graphs"]
            n += batch["num_graphs"]
        val_loss, val_acc = _eval(model, val_loader)
        train_losses.append(total / n)
        val_losses.append(val_loss)
        rows.append({"epoch": epoch, "step": epoch * len(loader), "train_loss": total / n, "val_loss": val_loss,
                     "val_acc": val_acc})
        if epoch == CKPT_EPOCH[run]:
            torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict()}, ckpt)
            metrics = {"train_loss": total / n, "val_loss": val_loss, "val_acc": val_acc}
    history = out_dir / "history.csv"
    with history.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    metrics["first_loss"] = train_losses[0]
    metrics["last_loss"] = train_losses[-1]
    return Trained(checkpoint=ckpt, train_losses=train_losses, val_losses=val_losses, metrics=metrics,
                   history=history)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if not (m["train_loss"] < 0.8 * math.log(2) and m["val_acc"] > 0.65):
            return f"healthy run did not train: train loss {m['train_loss']:.3f}, val acc {m['val_acc']:.2f}"
        return None
    if m["train_loss"] > 0.85 * math.log(2) and m["val_acc"] < 0.62:
        return (f"train loss {m['first_loss']:.3f} -> {m['train_loss']:.3f} at epoch {CKPT_EPOCH[run]} "
                f"(ln 2 = 0.693), val acc {m['val_acc']:.2f}")
    return None


def _setup(run: str):
    import triage

    model, optimizer, loader, val_loader = _build(run, 0, None)
    batches = [b for _ in range(3) for b in loader][:45]      # 45 batches: three epochs' draws
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        val_batches=list(val_loader), total_steps=EPOCHS[run] * len(loader),
                        steps_per_epoch=len(loader))


def setup_healthy():
    return _setup("healthy")


def setup_shuffled_graphs_not_labels():
    return _setup("shuffled_graphs_not_labels")
