"""Two-tower retrieval with an in-batch softmax and a temperature.

Written after torchrec's two-tower retrieval example (examples/retrieval/two_tower_train.py and
modules/two_tower.py, read through the code search) and the in-batch sampled softmax it is usually trained
with (Yi et al. 2019; TFRS `tfrs.tasks.Retrieval`): a query tower (user id embedding + an EmbeddingBag
mean over the user's recent items -> MLP) and a candidate tower (item id + item category embeddings ->
MLP), both L2-normalised, logits = q @ c.T / temperature over the batch, cross-entropy against the
diagonal (temperature 0.1). Adam at lr 3e-3 with a StepLR (halve every 2 epochs, stepped once an epoch). torchrec is not
used: the towers are plain `nn.Embedding`/`nn.EmbeddingBag` + MLPs. The interactions are made in code
(1000 users, 800 items in 20 categories, a rank-8 taste model).

Batches are dicts {"user_id", "history", "item_id", "item_cat"} of 128 positive pairs. The checkpoint is
{"model", "optimizer", "lr_scheduler", "epoch", "step"}, as torchrec/torchvision-style reference scripts
save it; the per-epoch loss and recall@10 go to `history.jsonl`.

Runs
- healthy: the schedule stepped once an epoch; checkpoint after epoch 3 of 8 while the loss still falls.
  The in-batch softmax loss starts at ln 128 = 4.85 and its floor is far above 0 (items a user likes
  share a batch), so a healthy run ends around 2.4 (train) / 3.3 (val).
- steplr_per_batch (lr_schedule_decayed): the owner put `scheduler.step()` inside the batch loop. The
  StepLR meant "halve every 2 epochs" now halves every 2 batches, so the LR is ~3e-3 x 2^-20 after 40
  steps and the loss freezes after its first few updates. A well-known pitfall ("Calling
  scheduler.step() inside the batch loop when using epoch-based schedulers (e.g., StepLR): the LR will
  decay too quickly ... often causing training to fail", runebook.dev's LRScheduler.step pitfalls page).
  Fix: step it once an epoch (`step_per_epoch`). Competing: a 10x higher LR (`lr_x10`), which only
  scales a schedule that still reaches ~0 within an epoch. Cause lr_schedule_decayed.
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
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="two_tower_retrieval",
    kind="recsys",
    original="meta-pytorch/torchrec examples/retrieval/two_tower_train.py (in-batch softmax variant)",
    runs={
        "healthy": Run(cause="healthy", story="Two towers, in-batch softmax at temperature 0.1, StepLR stepped "
                       "per epoch; checkpoint after epoch 3 of 8 while the loss is still falling."),
        "steplr_per_batch": Run(
            cause="lr_schedule_decayed",
            story="The retrieval loss dropped for a few batches and then froze at ~4.8 (about ln 128) for the whole run; my "
                  "scheduler.step() was inside the batch loop.",
            fix="step_per_epoch", competing=("lr_x10",)),
    },
)

N_USERS, N_ITEMS, N_CATS, RANK, HIST = 1000, 800, 20, 8, 5
BATCH, DIM, TEMPERATURE = 128, 32, 0.1
EPOCHS = {"healthy": 8, "steplr_per_batch": 6}
CKPT_EPOCH = {"healthy": 3, "steplr_per_batch": 5}
N_PAIRS = 5120                                   # 40 batches an epoch


def make_data(seed: int) -> dict:
    g = torch.Generator().manual_seed(21000 + seed)
    cat = torch.randint(0, N_CATS, (N_ITEMS,), generator=g)
    cat_vec = torch.randn(N_CATS, RANK, generator=g)
    item_vec = 0.7 * cat_vec[cat] + 0.7 * torch.randn(N_ITEMS, RANK, generator=g)
    user_vec = torch.randn(N_USERS, RANK, generator=g)
    probs = torch.softmax(5.0 * user_vec @ item_vec.t() / math.sqrt(RANK), 1)
    history = torch.multinomial(probs, HIST, replacement=True, generator=g)        # (users, HIST)

    def pairs(n):
        users = torch.randint(0, N_USERS, (n,), generator=g)
        items = torch.multinomial(probs[users], 1, generator=g).squeeze(1)
        return users, items

    tu, ti = pairs(N_PAIRS)
    vu, vi = pairs(1024)
    return {"cat": cat, "history": history, "train": (tu, ti), "val": (vu, vi)}


def make_batch(data, users, items):
    return {"user_id": users, "history": data["history"][users], "item_id": items, "item_cat": data["cat"][items]}


def batches_of(data, split, g: torch.Generator | None):
    users, items = data[split]
    idx = torch.randperm(len(users), generator=g) if g is not None else torch.arange(len(users))
    for i in range(0, len(idx), BATCH):
        j = idx[i:i + BATCH]
        yield make_batch(data, users[j], items[j])


def mlp(d_in, d_out):
    return nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, d_out))


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_emb = nn.Embedding(N_USERS, DIM)
        self.history_bag = nn.EmbeddingBag(N_ITEMS, DIM, mode="mean")
        self.item_emb = nn.Embedding(N_ITEMS, DIM)
        self.cat_emb = nn.Embedding(N_CATS, DIM)
        self.query_tower = mlp(2 * DIM, DIM)
        self.candidate_tower = mlp(2 * DIM, DIM)

    def query(self, user_id, history):
        return F.normalize(self.query_tower(torch.cat([self.user_emb(user_id), self.history_bag(history)], 1)), dim=-1)

    def candidate(self, item_id, item_cat):
        return F.normalize(self.candidate_tower(torch.cat([self.item_emb(item_id), self.cat_emb(item_cat)], 1)), dim=-1)

    def forward(self, batch):
        q = self.query(batch["user_id"], batch["history"])
        c = self.candidate(batch["item_id"], batch["item_cat"])
        return q @ c.t() / TEMPERATURE


def loss_fn(model, batch):
    logits = model(batch)
    return F.cross_entropy(logits, torch.arange(logits.size(0)))


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    data = make_data(seed)
    model = TwoTower()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2 if variant == "lr_x10" else 3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    per_batch = run == "steplr_per_batch" and variant != "step_per_epoch"
    return model, optimizer, scheduler, data, per_batch


@torch.no_grad()
def _recall_at_10(model, data):
    model.eval()
    items = torch.arange(N_ITEMS)
    c = model.candidate(items, data["cat"])
    users, pos = data["val"]
    q = model.query(users, data["history"][users])
    top = (q @ c.t()).topk(10, dim=1).indices
    return float((top == pos[:, None]).any(1).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer, scheduler, data, per_batch = _build(run, seed, variant)
    g = torch.Generator().manual_seed(22000 + seed)
    ckpt = out_dir / "ckpt.pt"
    losses, val_losses, rows, metrics, step = [], [], [], {}, 0
    for epoch in range(1, EPOCHS[run] + 1):
        model.train()
        total, n = 0.0, 0
        for batch in batches_of(data, "train", g):
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            optimizer.step()
            if per_batch:
                scheduler.step()
            step += 1
            total += float(loss.detach())
            n += 1
        if not per_batch:
            scheduler.step()
        model.eval()
        with torch.no_grad():
            val_loss = sum(float(loss_fn(model, b)) for b in batches_of(data, "val", None)) / 8
        recall = _recall_at_10(model, data)
        losses.append(total / n)
        val_losses.append(val_loss)
        rows.append({"step": step, "epoch": epoch, "loss": total / n, "val_loss": val_loss, "recall@10": recall,
                     "lr": optimizer.param_groups[0]["lr"]})
        if epoch == CKPT_EPOCH[run]:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": scheduler.state_dict(), "epoch": epoch, "step": step}, ckpt)
            metrics = {"loss": total / n, "val_loss": val_loss, "recall": recall}
    history = out_dir / "history.jsonl"
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses, metrics=metrics, history=history)


def symptom(run: str, trained: Trained) -> str | None:
    m, losses = trained.metrics, trained.train_losses
    e = CKPT_EPOCH[run]
    if run == "healthy":
        if not (m["loss"] < 0.85 * math.log(BATCH) and m["recall"] > 0.05):
            return f"healthy run did not train: loss {m['loss']:.3f}, recall@10 {m['recall']:.3f}"
        return None
    if m["loss"] > 0.85 * math.log(BATCH) and abs(losses[e - 1] - losses[1]) < 0.05:
        return (f"in-batch softmax loss {losses[0]:.3f} (epoch 1) -> {losses[1]:.3f} (epoch 2) -> "
                f"{losses[e - 1]:.3f} (epoch {e}), ln 128 = {math.log(BATCH):.2f}; recall@10 {m['recall']:.3f}")
    return None


def _setup(run: str):
    import triage

    model, optimizer, scheduler, data, per_batch = _build(run, 0, None)
    g = torch.Generator().manual_seed(23000)
    batches = list(batches_of(data, "train", g))          # 40 batches: one epoch
    steps_per_epoch = len(batches)
    return triage.Setup(
        model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
        val_batches=list(batches_of(data, "val", None)), scheduler=scheduler,
        scheduler_interval="step" if per_batch else "epoch", steps_per_epoch=steps_per_epoch,
        total_steps=EPOCHS[run] * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_steplr_per_batch():
    return _setup("steplr_per_batch")
