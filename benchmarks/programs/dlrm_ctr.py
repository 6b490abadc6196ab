"""DLRM click-through-rate prediction: EmbeddingBag sparse features + dense MLP + dot interaction.

Written after facebookresearch/dlrm dlrm_s_pytorch.py and its Criteo preprocessing (read through the code
search): the 13 integer features turned into dense inputs by zeroing negative values and taking
log(x + 1), a bottom MLP on them, one `nn.EmbeddingBag(mode="sum")` per categorical feature (indices +
offsets), the "dot" interaction (pairwise dot products of the bottom output and the embeddings, lower
triangle, concatenated with the bottom output), a top MLP ending in a sigmoid,
`torch.nn.BCELoss(reduction="mean")` on the probability, dlrm's `--optimizer=adagrad` (the optimizer
torchrec's DLRM examples use for the tables) at lr 0.02, batch 128, dlrm's init (normal MLP weights,
uniform(+-sqrt(1/n)) tables), and the checkpoint dlrm writes: {"epoch", "nepochs", "nbatches", "iter",
"state_dict", "opt_state_dict", "train_loss"}, every 20 iterations. torchrec is not used. The click log is
made in code: 13 heavy-tailed count features, 8 categorical features (tables of 50-500 rows), a click rate
of 10-20% driven by per-category effects, dense features and one pairwise interaction. As in the Criteo
logs, the integer feature I2 is written as -1 or -2 where missing (here: from a logging change part-way
through the log, from iteration 61 on).

Runs
- healthy: the preprocessing as dlrm does it; checkpoint at iteration 100 of 300 while the loss still
  falls. The loss starts near the click-rate entropy (0.5-0.6) and its floor is far from 0.
- i2_negative_counts (nonfinite_data): the owner wrote their own preprocessing as `log(x + 1)` without
  zeroing the negative values: I2 = -1 gives log(0) = -inf and I2 = -2 gives log(-1) = NaN. The first
  batch holding such a row (iteration 61) gives NaN activations and a NaN click probability; on CPU
  BCELoss then stops the run with "all elements of input should be between 0 and 1" (the message people
  search for; elsewhere the loss is NaN). The checkpoint is the last
  periodic one before it (iteration 60); the snapshot is the 48 batches after it, in order. Criteo's
  negative integer values are a known trap of this dataset (dlrm zeroes them before the log for that
  reason; "loss is nan" reports from people who preprocess Criteo themselves). Fix: zero the negatives
  before the log (`clip_negatives`). Competing: a 10x lower LR (`lr_x0.1`) and gradient clipping at 1.0
  (`clip_1`), the usual first tries for a NaN loss, which leave the NaN inputs in place.
  Cause nonfinite_data: the dense inputs hold -inf/NaN before the model sees them.
"""

from __future__ import annotations

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
    name="dlrm_ctr",
    kind="recsys",
    original="facebookresearch/dlrm dlrm_s_pytorch.py",
    runs={
        "healthy": Run(cause="healthy", story="DLRM on a synthetic click log, Adagrad lr 0.02; checkpoint "
                       "at iteration 100 of 300 while the (already low) loss still falls."),
        "i2_negative_counts": Run(
            cause="nonfinite_data",
            story="I wrote my own preprocessing as log(x + 1) on the integer features; the run died at "
                  "iteration 61 in BCELoss (input not between 0 and 1), also with a lower LR and with clip_grad_norm_(1.0).",
            fix="clip_negatives", competing=("lr_x0.1", "clip_1")),
    },
)

N_DENSE, TABLES, EMB_DIM, BATCH = 13, (50, 100, 200, 500, 80, 300, 60, 120), 16, 128
ITERS, CKPT_EVERY = {"healthy": 300, "i2_negative_counts": 200}, 20
N_EXAMPLES = 40960
CHANGE_AT = 60 * BATCH + 64                    # inside iteration 61


def make_click_log(seed: int) -> dict:
    g = torch.Generator().manual_seed(31000 + seed)
    n = N_EXAMPLES
    raw_counts = torch.floor(torch.exp(torch.randn(n, N_DENSE, generator=g) * 1.5 + 1.0))
    sparse = torch.stack([torch.multinomial(torch.softmax(torch.randn(t, generator=g), 0), n, replacement=True,
                                            generator=g) for t in TABLES], 1)
    effects = [1.2 * torch.randn(t, generator=g) for t in TABLES]
    w_dense = 0.3 * torch.randn(N_DENSE, generator=g)
    dense = torch.log(raw_counts + 1)
    logit = -2.5 + (dense - dense.mean(0)) @ w_dense
    for k, e in enumerate(effects):
        logit = logit + e[sparse[:, k]]
    logit = logit + 0.8 * effects[0][sparse[:, 0]] * effects[1][sparse[:, 1]]
    label = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    # From example CHANGE_AT on (a logging change part-way through the day), I2 is written as -1 or -2
    # where it is missing, as in the Criteo logs.
    missing = torch.zeros(n, dtype=torch.bool)
    missing[CHANGE_AT:] = torch.rand(n - CHANGE_AT, generator=g) < 0.02
    raw_counts[missing, 1] = -torch.randint(1, 3, (int(missing.sum()),), generator=g).float()
    return {"raw_int": raw_counts, "sparse_idx": sparse, "label": label[:, None]}


def preprocess(log: dict, clip_negatives: bool) -> dict:
    """dlrm's transform of the integer features: negatives to 0, then log(x + 1)."""
    x = log["raw_int"]
    if clip_negatives:
        x = x.clamp(min=0)
    return {"dense_x": torch.log(x + 1), "sparse_idx": log["sparse_idx"], "label": log["label"]}


def batches_of(data: dict, start: int, count: int) -> list[dict]:
    out = []
    for b in range(start, start + count):
        s = slice((b * BATCH) % N_EXAMPLES, (b * BATCH) % N_EXAMPLES + BATCH)
        out.append({k: v[s] for k, v in data.items()})
    return out


def mlp(sizes, sigmoid_last=False):
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        # dlrm's init: normal with std sqrt(2 / (fan_in + fan_out)), bias std sqrt(1 / fan_out)
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (sizes[i] + sizes[i + 1])))
        nn.init.normal_(lin.bias, 0.0, math.sqrt(1.0 / sizes[i + 1]))
        layers.append(lin)
        layers.append(nn.Sigmoid() if (sigmoid_last and i == len(sizes) - 2) else nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bot_l = mlp([N_DENSE, 64, EMB_DIM])
        self.emb_l = nn.ModuleList()
        for t in TABLES:
            bag = nn.EmbeddingBag(t, EMB_DIM, mode="sum")
            bound = math.sqrt(1.0 / t)                     # dlrm: uniform(-sqrt(1/n), sqrt(1/n))
            nn.init.uniform_(bag.weight, -bound, bound)
            self.emb_l.append(bag)
        n_f = len(TABLES) + 1
        self.top_l = mlp([EMB_DIM + n_f * (n_f - 1) // 2, 64, 1], sigmoid_last=True)
        self.li, self.lj = torch.tril_indices(n_f, n_f, offset=-1)

    def interact_features(self, x, ly):
        t = torch.stack([x] + ly, 1)                       # (B, F, d)
        z = torch.bmm(t, t.transpose(1, 2))
        return torch.cat([x, z[:, self.li, self.lj]], 1)

    def forward(self, dense_x, sparse_idx):
        x = self.bot_l(dense_x)
        b = sparse_idx.size(0)
        offsets = torch.arange(b)
        ly = [emb(sparse_idx[:, k], offsets) for k, emb in enumerate(self.emb_l)]
        return self.top_l(self.interact_features(x, ly))


loss_fn_bce = torch.nn.BCELoss(reduction="mean")


def loss_fn(model, batch):
    return loss_fn_bce(model(batch["dense_x"], batch["sparse_idx"]), batch["label"])


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    data = preprocess(make_click_log(seed), clip_negatives=(run == "healthy" or variant == "clip_negatives"))
    model = DLRM()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.002 if variant == "lr_x0.1" else 0.02)
    return model, optimizer, data


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, data = _build(run, seed, variant)
    ckpt = out_dir / "ckpt.pt"
    losses, nan_iter, ckpt_iter, crash = [], None, 0, ""
    for j, batch in enumerate(batches_of(data, 0, ITERS[run]), start=1):
        z = model(batch["dense_x"], batch["sparse_idx"])
        try:
            E = loss_fn_bce(z, batch["label"])
        except RuntimeError as err:   # BCELoss refuses a NaN probability: "all elements of input should be ..."
            nan_iter, crash = j, str(err).splitlines()[0]
            break
        optimizer.zero_grad()
        E.backward()
        if variant == "clip_1":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(E.detach()))
        finite = math.isfinite(losses[-1]) and all(torch.isfinite(p).all() for p in model.parameters())
        if not finite:
            nan_iter = j
            break
        if j % CKPT_EVERY == 0 and (run != "healthy" or j <= 100):
            torch.save({"epoch": 0, "nepochs": 1, "nbatches": ITERS[run], "iter": j,
                        "state_dict": model.state_dict(), "opt_state_dict": optimizer.state_dict(),
                        "train_loss": sum(losses[-CKPT_EVERY:]) / CKPT_EVERY}, ckpt)
            ckpt_iter = j
    base_rate = float(data["label"].mean())
    entropy = -(base_rate * math.log(base_rate) + (1 - base_rate) * math.log(1 - base_rate))
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"nan_iter": float(nan_iter or 0), "ckpt_iter": float(ckpt_iter), "entropy": entropy,
                            "crashed": float(bool(crash))})


def symptom(run: str, trained: Trained) -> str | None:
    m, losses = trained.metrics, trained.train_losses
    if m["nan_iter"]:
        what = ("the model's output went NaN and BCELoss stopped the run ('all elements of input should be "
                "between 0 and 1')" if m["crashed"] else "the loss went to NaN")
        return (f"at iteration {int(m['nan_iter'])} {what}; loss {losses[0]:.3f} at iteration 1, "
                f"{losses[-1]:.3f} at iteration {len(losses)}; last finite checkpoint: iteration {int(m['ckpt_iter'])}")
    head, tail = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    if run != "healthy" and tail > m["entropy"]:
        return f"loss {head:.3f} -> {tail:.3f}, above the click-rate entropy {m['entropy']:.3f}"
    if run == "healthy" and not (tail < 0.95 * m["entropy"] and tail < head):
        return f"healthy run did not train: loss {head:.3f} -> {tail:.3f} (click-rate entropy {m['entropy']:.3f})"
    return None


def _setup(run: str):
    import triage

    model, optimizer, data = _build(run, 0, None)
    # healthy: the mid-run checkpoint; the fault: the last periodic checkpoint before the bad rows (iteration 60)
    ckpt_iter = 100 if run == "healthy" else (CHANGE_AT // BATCH) // CKPT_EVERY * CKPT_EVERY
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn,
                        batches=batches_of(data, ckpt_iter, 48), total_steps=ITERS[run])


def setup_healthy():
    return _setup("healthy")


def setup_i2_negative_counts():
    return _setup("i2_negative_counts")
