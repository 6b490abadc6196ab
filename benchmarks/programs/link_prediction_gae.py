"""Link prediction with a GCN encoder and a dot-product decoder (graph auto-encoder style).

Written after PyTorch Geometric's examples/link_pred.py (read through the code search): the edges split
into train/val/test (RandomLinkSplit: val 5%, test 10%, message passing on the train edges only), a
two-layer GCN encoder, `decode(z, edge_label_index) = (z[src] * z[dst]).sum(-1)`, fresh negatives drawn
every epoch with `negative_sampling` (as many as positive train edges), `BCEWithLogitsLoss` on the
concatenated positive/negative scores, Adam at lr 0.01, ROC-AUC on val/test with `decode(...).sigmoid()`.
torch_geometric is not used: the GCN layer (sparse normalised adjacency), the edge split and the negative
sampler are written here, and the graph is a 500-node, 5-community block model with noisy
community-correlated features made in code.

Each epoch is one full-batch optimizer step on a batch dict
{"x", "edge_index", "edge_label_index", "edge_label"}. The checkpoint is
{"epoch", "model_state_dict", "optimizer_state_dict"}; the per-epoch loss and val AUC go to
`history.jsonl`.

Runs
- healthy: the example as written; checkpoint at epoch 40 of 150 while the loss still falls.
- sigmoid_in_decode (wrong_loss): the owner moved the `.sigmoid()` of the evaluation into `decode()` so
  that the model "returns probabilities", and kept `BCEWithLogitsLoss`. The loss now applies a second
  sigmoid: positives can score no better than log(1 + e^-1) = 0.313, negatives no better than ln 2, so the
  balanced loss cannot go below 0.503, and its gradient is squeezed by sigmoid'. The loss sits above 0.5
  however long it trains. The double sigmoid is a very common report (daisyRec PR #15 "Do not need sigmoid
  because there is sigmoid in BCEWithLogitsLoss. Otherwise loss does not converge"; UNet3plus_pth #23;
  kaggle-imet-2019 #3). Fix: return raw scores and keep the sigmoid at evaluation (`raw_scores`). The
  competing fix a user tries first for a loss that will not go down is a 10x higher LR (`lr_x10`).
  Cause wrong_loss: the loss is fed probabilities where it expects logits.
"""

from __future__ import annotations

import json
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
    name="link_prediction_gae",
    kind="graph",
    original="pyg-team/pytorch_geometric examples/link_pred.py",
    runs={
        "healthy": Run(cause="healthy", story="GCN encoder + dot-product decoder with fresh negatives every "
                       "epoch; checkpoint at epoch 40 of 150 while the loss still falls."),
        "sigmoid_in_decode": Run(
            cause="wrong_loss",
            story="I put .sigmoid() inside decode() so the model outputs probabilities, kept BCEWithLogitsLoss, "
                  "and the loss never went below ~0.58.",
            fix="raw_scores", competing=("lr_x10",)),
    },
)

N_NODES, N_COMM, N_FEAT = 500, 5, 32
EPOCHS = {"healthy": 150, "sigmoid_in_decode": 150}
CKPT_EPOCH = {"healthy": 40, "sigmoid_in_decode": 150}


def make_graph(seed: int) -> dict:
    g = torch.Generator().manual_seed(7000 + seed)
    comm = torch.randint(0, N_COMM, (N_NODES,), generator=g)
    same = comm[:, None] == comm[None, :]
    p = torch.where(same, torch.tensor(0.05), torch.tensor(0.003))
    upper = torch.triu(torch.rand(N_NODES, N_NODES, generator=g) < p, diagonal=1)
    src, dst = upper.nonzero(as_tuple=True)
    x = 0.5 * torch.randn(N_COMM, N_FEAT, generator=g)[comm] + torch.randn(N_NODES, N_FEAT, generator=g)
    perm = torch.randperm(src.numel(), generator=g)
    n_val, n_test = int(0.05 * perm.numel()), int(0.10 * perm.numel())
    val_e, test_e, train_e = perm[:n_val], perm[n_val:n_val + n_test], perm[n_val + n_test:]
    und = lambda idx: torch.stack([src[idx], dst[idx]])  # noqa: E731
    train_pos = und(train_e)
    edge_index = torch.cat([train_pos, train_pos.flip(0)], 1)      # message passing: train edges only
    all_keys = torch.cat([src * N_NODES + dst, dst * N_NODES + src])
    train_keys = edge_index[0] * N_NODES + edge_index[1]
    data = {"x": x, "edge_index": edge_index, "train_pos": train_pos, "all_keys": all_keys, "train_keys": train_keys}
    for name, idx in (("val", val_e), ("test", test_e)):
        pos = und(idx)
        neg = negative_sampling(all_keys, pos.size(1), g)
        data[f"{name}_label_index"] = torch.cat([pos, neg], 1)
        data[f"{name}_label"] = torch.cat([torch.ones(pos.size(1)), torch.zeros(neg.size(1))])
    return data


def negative_sampling(existing_keys: torch.Tensor, num: int, g: torch.Generator) -> torch.Tensor:
    """Uniform node pairs that are not edges (and not self loops), `num` of them."""
    out = []
    have = 0
    while have < num:
        cand = torch.randint(0, N_NODES, (2, 2 * num), generator=g)
        ok = (cand[0] != cand[1]) & ~torch.isin(cand[0] * N_NODES + cand[1], existing_keys)
        cand = cand[:, ok]
        out.append(cand)
        have += cand.size(1)
    return torch.cat(out, 1)[:, :num]


class GCNConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))
        nn.init.xavier_uniform_(self.lin.weight)

    def forward(self, x, edge_index):
        n = x.size(0)
        loops = torch.arange(n)
        row, col = torch.cat([edge_index[0], loops]), torch.cat([edge_index[1], loops])
        deg = torch.zeros(n).index_add_(0, col, torch.ones(col.numel()))
        dinv = deg.pow(-0.5)
        adj = torch.sparse_coo_tensor(torch.stack([col, row]), dinv[row] * dinv[col], (n, n),
                                      check_invariants=False)
        return torch.sparse.mm(adj, self.lin(x)) + self.bias


class Net(nn.Module):
    def __init__(self, in_channels, hidden, out_channels, sigmoid_in_decode=False):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, out_channels)
        self.sigmoid_in_decode = sigmoid_in_decode

    def encode(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    def decode(self, z, edge_label_index):
        score = (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)
        return score.sigmoid() if self.sigmoid_in_decode else score

    def forward(self, x, edge_index, edge_label_index):
        return self.decode(self.encode(x, edge_index), edge_label_index)


criterion = nn.BCEWithLogitsLoss()


def loss_fn(model, batch):
    out = model(batch["x"], batch["edge_index"], batch["edge_label_index"]).view(-1)
    return criterion(out, batch["edge_label"])


def _train_batch(data: dict, g: torch.Generator) -> dict:
    pos = data["train_pos"]
    neg = negative_sampling(data["train_keys"], pos.size(1), g)     # not a train edge (as PyG samples)
    return {"x": data["x"], "edge_index": data["edge_index"], "edge_label_index": torch.cat([pos, neg], 1),
            "edge_label": torch.cat([torch.ones(pos.size(1)), torch.zeros(neg.size(1))])}


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    data = make_graph(seed)
    model = Net(N_FEAT, 64, 32, sigmoid_in_decode=(run == "sigmoid_in_decode" and variant != "raw_scores"))
    optimizer = torch.optim.Adam(params=model.parameters(), lr=0.1 if variant == "lr_x10" else 0.01)
    return model, optimizer, data


def _auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    return float((pos[:, None] > neg[None, :]).float().mean() + 0.5 * (pos[:, None] == neg[None, :]).float().mean())


@torch.no_grad()
def _test(model, data, split):
    model.eval()
    z = model.encode(data["x"], data["edge_index"])
    out = model.decode(z, data[f"{split}_label_index"]).view(-1)
    prob = out if model.sigmoid_in_decode else out.sigmoid()
    return _auc(prob, data[f"{split}_label"])


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, data = _build(run, seed, variant)
    neg_gen = torch.Generator().manual_seed(8000 + seed)
    ckpt = out_dir / "ckpt.pt"
    losses, rows, metrics = [], [], {}
    for epoch in range(1, EPOCHS[run] + 1):
        model.train()
        batch = _train_batch(data, neg_gen)
        optimizer.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if epoch % 10 == 0 or epoch == CKPT_EPOCH[run]:
            rows.append({"step": epoch, "loss": losses[-1], "val_auc": _test(model, data, "val")})
        if epoch == CKPT_EPOCH[run]:
            torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict()}, ckpt)
            metrics = {"loss": losses[-1], "val_auc": _test(model, data, "val"),
                       "test_auc": _test(model, data, "test")}
    history = out_dir / "history.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics["min_loss"] = min(losses)
    metrics["tail_loss"] = sum(losses[-10:]) / 10
    return Trained(checkpoint=ckpt, train_losses=losses, metrics=metrics, history=history)


def symptom(run: str, trained: Trained) -> str | None:
    m, losses = trained.metrics, trained.train_losses
    if run == "healthy":
        if not (losses[CKPT_EPOCH[run] - 1] < 0.9 * losses[0] and m["val_auc"] > 0.75):
            return f"healthy run did not train: loss {losses[0]:.3f} -> {losses[-1]:.3f}, val AUC {m['val_auc']:.3f}"
        return None
    if m["min_loss"] > 0.5:
        return (f"BCE loss {losses[0]:.3f} -> {m['tail_loss']:.3f} over {len(losses)} epochs and never below "
                f"{m['min_loss']:.3f} (val AUC {m['val_auc']:.3f})")
    return None


def _setup(run: str):
    import triage

    model, optimizer, data = _build(run, 0, None)
    g = torch.Generator().manual_seed(9000)
    batches = [_train_batch(data, g) for _ in range(48)]   # the same graph, fresh negatives each step
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        total_steps=EPOCHS[run], steps_per_epoch=1)


def setup_healthy():
    return _setup("healthy")


def setup_sigmoid_in_decode():
    return _setup("sigmoid_in_decode")
