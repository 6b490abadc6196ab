"""GraphSAGE on neighbour-sampled mini-batches of one larger graph (Reddit-style node classification).

Written after PyTorch Geometric's examples/reddit.py and graph_sage_unsup.py (read through the code
search): `NeighborLoader(data, num_neighbors=[25, 10], batch_size=..., input_nodes=train_mask)`, a
two-layer `SAGEConv` model (mean aggregation, root weight) run on the sampled subgraph, the loss on the
first `batch.batch_size` rows (the seed nodes), Adam at lr 0.01, bag-of-words features row-normalised by
the `NormalizeFeatures` transform. torch_geometric is not used: the sampler here is a small vectorised
two-hop sampler over a CSR adjacency that hands out dict batches
`{"x", "edge_index", "y", "batch_size", "n_id"}` (local edge_index, the seeds first, `n_id` their global
ids), and the graph is a 5-community block model with Poisson word counts made in code. A few nodes have
no words at all (users who never posted), as in real bag-of-words graphs.

The checkpoint is {"model", "optimizer", "step"}, written every 20 optimizer steps.

Runs
- healthy: features normalised as `NormalizeFeatures` does (row sum clamped at 1); checkpoint at step 60
  of 150 while the loss still falls.
- rownorm_nan (nonfinite_data): the owner replaced the transform by their own `x / x.sum(1, keepdim=True)`
  on the feature matrix. The nodes with no words become 0/0 = NaN rows; a mini-batch whose sampled
  subgraph reaches one of them gives a NaN loss, and Adam writes NaN into every weight. The checkpoint is
  the last periodic one before the NaN, and the snapshot is the batches that followed it, in order (as
  a capture holds them). PyG's own transform clamps the denominator for exactly this reason
  (torch_geometric.transforms.NormalizeFeatures: `sum.clamp_(min=1.)`); "loss becomes nan" threads on
  row-normalised features with empty rows are common. Fix: clamp the row sum (`clamp_rowsum`). The
  competing fixes a user tries first for a NaN loss are a 10x lower LR (`lr_x0.1`) and gradient clipping
  (`clip_1`): neither touches the NaN inputs. Cause nonfinite_data: the batches hold NaN before the model
  sees them.
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
    name="graphsage_minibatch",
    kind="graph",
    original="pyg-team/pytorch_geometric examples/reddit.py (NeighborLoader + SAGEConv)",
    runs={
        "healthy": Run(cause="healthy", story="GraphSAGE on neighbour-sampled batches of a 3000-node graph; "
                       "checkpoint at step 60 of 150 while the loss is still falling."),
        "rownorm_nan": Run(
            cause="nonfinite_data",
            story="I swapped NormalizeFeatures for my own x / x.sum(1) and the loss went to NaN a few dozen "
                  "steps in; lowering the LR and clipping did not help.",
            fix="clamp_rowsum", competing=("lr_x0.1", "clip_1")),
    },
)

N_NODES, N_CLASSES, N_WORDS, HIDDEN = 3000, 5, 60, 64
BATCH, FANOUT = 64, (10, 5)
STEPS, CKPT_EVERY = 150, 20
N_EMPTY = 2                      # nodes with no words (and no links) at all


def make_graph(seed: int) -> dict:
    g = torch.Generator().manual_seed(2000 + seed)
    y = torch.randint(0, N_CLASSES, (N_NODES,), generator=g)
    # block model, sparse: ~8 neighbours per node, 70% inside the community
    n_edges = N_NODES * 4
    src = torch.randint(0, N_NODES, (n_edges,), generator=g)
    same = torch.rand(n_edges, generator=g) < 0.7
    by_class = [torch.nonzero(y == c).flatten() for c in range(N_CLASSES)]
    dst = torch.randint(0, N_NODES, (n_edges,), generator=g)
    for c in range(N_CLASSES):
        sel = same & (y[src] == c)
        pool = by_class[c]
        dst[sel] = pool[torch.randint(0, len(pool), (int(sel.sum()),), generator=g)]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    rates = torch.rand(N_CLASSES, N_WORDS, generator=g) ** 3 * 0.8 + 0.05
    counts = torch.poisson(rates[y], generator=g)
    counts[counts.sum(1) == 0, 0] = 1.0               # every ordinary node has at least one word
    perm = torch.randperm(N_NODES, generator=g)
    train_idx, val_idx = perm[:2000], perm[2000:2500]
    # A couple of training nodes have no words and no links (accounts that never posted). Where they sit
    # in the loader's first epoch is fixed here so that every seed meets them between steps 27 and 32.
    first_epoch = train_idx[torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(3000 + seed))]
    window = first_epoch[26 * BATCH:31 * BATCH]
    empty = window[torch.randperm(len(window), generator=g)[:N_EMPTY]]
    counts[empty] = 0.0
    isolated = torch.zeros(N_NODES, dtype=torch.bool)
    isolated[empty] = True
    keep = ~(isolated[src] | isolated[dst])
    src, dst = src[keep], dst[keep]
    # sort the undirected edges into CSR (both directions)
    row = torch.cat([src, dst])
    col = torch.cat([dst, src])
    order = torch.argsort(row * N_NODES + col)
    row, col = row[order], col[order]
    rowptr = torch.zeros(N_NODES + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(row, minlength=N_NODES), 0)
    return {"counts": counts, "y": y, "rowptr": rowptr, "col": col, "train_idx": train_idx,
            "val_idx": val_idx, "empty": empty}


def normalize_features(counts: torch.Tensor, clamp: bool) -> torch.Tensor:
    s = counts.sum(dim=-1, keepdim=True)
    return counts / (s.clamp(min=1.0) if clamp else s)


class NeighborSampler:
    """Two-hop uniform neighbour sampling (with replacement), seeds first; yields dict batches."""

    def __init__(self, data: dict, x: torch.Tensor, input_nodes: torch.Tensor, batch_size: int,
                 fanout=FANOUT, shuffle=True, generator: torch.Generator | None = None):
        self.data, self.x, self.input_nodes = data, x, input_nodes
        self.batch_size, self.fanout, self.shuffle, self.g = batch_size, fanout, shuffle, generator

    def __len__(self):
        return math.ceil(len(self.input_nodes) / self.batch_size)

    def _sample(self, seeds: torch.Tensor) -> dict:
        rowptr, col = self.data["rowptr"], self.data["col"]
        nodes, frontier, edges = [seeds], seeds, []
        for k in self.fanout:
            start, deg = rowptr[frontier], rowptr[frontier + 1] - rowptr[frontier]
            pick = (torch.rand(len(frontier), k, generator=self.g) * deg[:, None]).long()
            valid = (deg > 0)[:, None].expand(-1, k)
            nbr = col[(start[:, None] + pick)[valid]]
            tgt = frontier[:, None].expand(-1, k)[valid]
            edges.append(torch.stack([nbr, tgt]))
            frontier = torch.unique(nbr)
            nodes.append(frontier)
        allnodes = torch.cat(nodes)
        local = torch.full((N_NODES,), -1, dtype=torch.long)
        n_id = []
        for n in allnodes.tolist():
            if local[n] < 0:
                local[n] = len(n_id)
                n_id.append(n)
        n_id = torch.tensor(n_id)
        e = torch.cat(edges, 1)
        return {"x": self.x[n_id], "edge_index": local[e], "y": self.data["y"][n_id],
                "batch_size": len(seeds), "n_id": n_id}

    def __iter__(self):
        idx = self.input_nodes
        if self.shuffle:
            idx = idx[torch.randperm(len(idx), generator=self.g)]
        for i in range(0, len(idx), self.batch_size):
            yield self._sample(idx[i:i + self.batch_size])


class SAGEConv(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin_l = nn.Linear(in_channels, out_channels)            # neighbours' mean
        self.lin_r = nn.Linear(in_channels, out_channels, bias=False)  # the node itself

    def forward(self, x, edge_index):
        src, dst = edge_index
        agg = torch.zeros_like(x).index_add_(0, dst, x[src])
        deg = torch.zeros(x.size(0)).index_add_(0, dst, torch.ones(dst.numel())).clamp(min=1)
        return self.lin_l(agg / deg[:, None]) + self.lin_r(x)


class SAGE(nn.Module):
    def __init__(self, in_channels, hidden, out_channels):
        super().__init__()
        self.convs = nn.ModuleList([SAGEConv(in_channels, hidden), SAGEConv(hidden, out_channels)])

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = F.dropout(F.relu(x), p=0.5, training=self.training)
        return x


def loss_fn(model, batch):
    out = model(batch["x"], batch["edge_index"])[:batch["batch_size"]]
    return F.cross_entropy(out, batch["y"][:batch["batch_size"]])


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    data = make_graph(seed)
    clamp = run == "healthy" or variant == "clamp_rowsum"
    x = normalize_features(data["counts"], clamp)
    model = SAGE(N_WORDS, HIDDEN, N_CLASSES)
    lr = 0.001 if variant == "lr_x0.1" else 0.01
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loader = NeighborSampler(data, x, data["train_idx"], BATCH,
                             generator=torch.Generator().manual_seed(3000 + seed))
    val_loader = NeighborSampler(data, x, data["val_idx"], 250, shuffle=False,
                                 generator=torch.Generator().manual_seed(4000 + seed))
    return model, optimizer, loader, val_loader


def _stream(loader):
    while True:
        yield from loader


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, loader, val_loader = _build(run, seed, variant)
    val_batches = list(val_loader)
    ckpt = out_dir / "ckpt.pt"
    losses, val_losses, nan_step, ckpt_step = [], [], None, None
    stream = _stream(loader)
    for step in range(1, STEPS + 1):
        model.train()
        batch = next(stream)
        optimizer.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        if variant == "clip_1":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            nan_step = step
            break
        if step % CKPT_EVERY == 0:
            finite = all(torch.isfinite(p).all() for p in model.parameters())
            if finite and (run != "healthy" or step <= 60):
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                           ckpt)
                ckpt_step = step
            model.eval()
            with torch.no_grad():
                val_losses.append(sum(float(loss_fn(model, b).detach()) for b in val_batches) / len(val_batches))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"nan_step": float(nan_step or 0), "ckpt_step": float(ckpt_step or 0),
                            "steps": float(len(losses))})


def symptom(run: str, trained: Trained) -> str | None:
    m, losses = trained.metrics, trained.train_losses
    if m["nan_step"]:
        return f"loss went to NaN at step {int(m['nan_step'])} (last finite checkpoint: step {int(m['ckpt_step'])})"
    first = sum(losses[:10]) / 10
    last = sum(losses[-10:]) / 10
    if run == "healthy" and not last < 0.7 * first:
        return f"healthy run did not train: loss {first:.3f} -> {last:.3f}"
    return None


def _setup(run: str):
    """The batches after the checkpoint, in the order the run drew them (the failing ones included)."""
    import triage

    model, optimizer, loader, val_loader = _build(run, 0, None)
    ckpt_step = 60 if run == "healthy" else None
    if ckpt_step is None:   # replay the owner's loader to find the last checkpoint before the NaN
        x = loader.x
        bad = torch.isnan(x).any(1)
        step, last_ckpt = 0, 0
        for batch in _stream(loader):
            step += 1
            if bad[batch["n_id"]].any() or step > STEPS:
                break
            if step % CKPT_EVERY == 0:
                last_ckpt = step
        ckpt_step = last_ckpt
        model, optimizer, loader, val_loader = _build(run, 0, None)
    stream = _stream(loader)
    for _ in range(ckpt_step):
        next(stream)
    batches = [next(stream) for _ in range(48)]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        val_batches=list(val_loader), total_steps=STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_rownorm_nan():
    return _setup("rownorm_nan")
