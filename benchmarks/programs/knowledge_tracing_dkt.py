"""Deep Knowledge Tracing: an LSTM over padded (question, correct) sequences, BCE on the next answer, masked.

Follows pykt-toolkit (`pykt/models/dkt.py`, `pykt/models/train_model.py`, `pykt/datasets/data_loader.py`,
`pykt/preprocess/split_datasets.py`): students' sequences cut into windows of `maxlen` interactions and padded
with -1, a dict batch holding `qseqs`/`cseqs`/`rseqs`, their shifted copies `shft_*` and the select mask
`smasks` (valid next positions); the model embeds the interaction `q + num_q * r`, runs an LSTM, dropout and a
linear layer to one output per question with a sigmoid at the end of `forward`; the prediction for the next
question is gathered by a one-hot of `shft_qseqs`, and the loss is `binary_cross_entropy` over
`masked_select(y, sm)`; Adam at 1e-3, the split made by student (pykt's `train_valid_sequences` folds are
students, and the test students are held out before the folds), validation AUC once an epoch, the model saved
when validation AUC improves. (Read: dkt.py, train_model.py's `cal_loss` / `model_forward`, and
EduKTM's DKT for the same loop.)

Students are made in code: 8 skills, 40 questions each of one skill with a difficulty; every student has an
ability per skill that grows a little with every attempt (more after a mistake); P(correct) is a 2PL item
response curve. Sequences of 20..120 attempts, windows of 50.

Runs:
- healthy: the pykt loop. The loss has a floor far above 0 (answers are Bernoulli draws) and falls slowly, from
  0.68 to about 0.42 (validation 0.67 -> 0.45); the checkpoint is the epoch-6 save of a longer run, validation AUC still rising.
- bce_with_logits_on_sigmoid: to run under autocast the owner replaced `F.binary_cross_entropy` with
  `F.binary_cross_entropy_with_logits` (autocast refuses BCE: "binary_cross_entropy ... unsafe to autocast,
  use BCEWithLogitsLoss"), keeping the sigmoid at the end of the model's `forward`. The loss reads
  probabilities as logits: what it scores lies in sigmoid([0, 1]) = [0.5, 0.73], so it can never say "likely
  wrong"; the training loss stalls (0.60 -> 0.54, the recipe 0.68 -> 0.42) while the model's own
  probabilities are pushed to 0 and 1, and their validation BCE climbs to ~0.87 (the recipe: 0.45, falling). This is bigdata-ustc/EduKTM#15 ("An error in
  the implementation of DKT!!": BCEWithLogitsLoss after a sigmoid in forward; AUC 0.75 -> 0.80 once fixed),
  and the same double sigmoid in yudi-mars/daisyRec#15 ("otherwise loss does not converge"). Root cause
  `wrong_loss`: the loss the outputs call for (BCE on the probabilities, variant `bce`) trains; the owner's
  first tries -- a higher LR (`lr_high`, x10) or more epochs (`more_epochs`, twice as many) -- leave the loss
  stuck above the floor the double sigmoid sets.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="knowledge_tracing_dkt",
    kind="knowledge tracing (padded interaction sequences)",
    original="pykt-team/pykt-toolkit: pykt/models/dkt.py, pykt/models/train_model.py, pykt/datasets/data_loader.py",
    runs={
        "healthy": Run(cause="healthy", story=(
            "DKT on padded, masked student windows: the masked BCE falls slowly from 0.68 towards about 0.42 "
            "(answers are noisy), validation AUC rising; checkpoint at the epoch-6 save.")),
        "bce_with_logits_on_sigmoid": Run(
            cause="wrong_loss",
            story=("I switched to binary_cross_entropy_with_logits so the loss would run under autocast, but the "
                   "model still ends in a sigmoid. The training loss stalled near 0.54 where pykt's DKT gets to "
                   "0.42 on the same students, and the validation BCE of the predictions climbed to 0.87 (0.45)."),
            fix="bce", competing=("lr_high", "more_epochs")),
    },
)

N_SKILLS, Q_PER_SKILL = 8, 40
NUM_Q = N_SKILLS * Q_PER_SKILL
N_STUDENTS = 700
MAXLEN = 50
BATCH = 32
LR = 1e-3
EPOCHS = 12
CKPT_EPOCH = 6


# ------------------------------------------------------------------------------------------------------ data
def simulate(seed: int):
    """Students' (question, correct) sequences under a 2PL curve with learning."""
    rng = np.random.default_rng(seed)
    q_skill = np.repeat(np.arange(N_SKILLS), Q_PER_SKILL)
    q_diff = rng.normal(0, 1.2, NUM_Q)
    seqs = []
    for _ in range(N_STUDENTS):
        ability = rng.normal(0, 1.0) + rng.normal(0, 1.0, N_SKILLS)
        n = int(rng.integers(20, 121))
        qs, rs = [], []
        skill = int(rng.integers(N_SKILLS))
        for _ in range(n):
            if rng.random() < 0.3:
                skill = int(rng.integers(N_SKILLS))          # practice comes in runs of one skill
            q = int(skill * Q_PER_SKILL + rng.integers(Q_PER_SKILL))
            p = 1 / (1 + math.exp(-2.0 * (ability[skill] - q_diff[q])))
            r = int(rng.random() < p)
            ability[skill] += 0.15 if r else 0.3
            qs.append(q)
            rs.append(r)
        seqs.append((qs, rs))
    return seqs


def windows(seqs):
    """pykt's preprocessing: cut each sequence into windows of MAXLEN, pad the last with -1."""
    out = []
    for qs, rs in seqs:
        for i in range(0, len(qs), MAXLEN):
            q, r = qs[i:i + MAXLEN], rs[i:i + MAXLEN]
            if len(q) < 2:
                continue
            pad = MAXLEN - len(q)
            out.append((q + [-1] * pad, r + [-1] * pad))
    return out


def collate(items):
    """pykt's KTDataset.__getitem__ + default collate: the dict batch with shifted copies and the masks."""
    q = torch.tensor([it[0] for it in items])
    r = torch.tensor([it[1] for it in items])
    mask = (q[:, :-1] != -1) & (q[:, 1:] != -1)
    qseqs, rseqs = q[:, :-1] * (q[:, :-1] != -1), r[:, :-1] * (r[:, :-1] != -1)
    shft_q, shft_r = q[:, 1:] * (q[:, 1:] != -1), r[:, 1:] * (r[:, 1:] != -1)
    return {"qseqs": qseqs, "rseqs": rseqs, "shft_qseqs": shft_q, "shft_rseqs": shft_r, "smasks": mask}


def split(seed: int):
    """Split by student (pykt's folds are students), then cut windows."""
    seqs = simulate(seed)
    perm = np.random.default_rng(seed + 1).permutation(len(seqs))
    n_val = len(seqs) // 5
    val = [seqs[i] for i in perm[:n_val]]
    tr = [seqs[i] for i in perm[n_val:]]
    return windows(tr), windows(val)


def loader(win, epoch: int | None, seed: int):
    idx = np.arange(len(win)) if epoch is None else np.random.default_rng(seed * 97 + epoch).permutation(len(win))
    return [collate([win[j] for j in idx[i:i + BATCH]]) for i in range(0, len(win) - BATCH + 1, BATCH)]


# ----------------------------------------------------------------------------------------------------- model
class DKT(nn.Module):
    def __init__(self, num_c=NUM_Q, emb_size=64, hidden=64, dropout=0.1):
        super().__init__()
        self.num_c = num_c
        self.interaction_emb = nn.Embedding(num_c * 2, emb_size)
        self.lstm_layer = nn.LSTM(emb_size, hidden, batch_first=True)
        self.dropout_layer = nn.Dropout(dropout)
        self.out_layer = nn.Linear(hidden, num_c)

    def forward(self, q, r):
        x = q + self.num_c * r
        h, _ = self.lstm_layer(self.interaction_emb(x))
        return torch.sigmoid(self.out_layer(self.dropout_layer(h)))


def predict_next(model, batch):
    y = model(batch["qseqs"].long(), batch["rseqs"].long())
    return (y * F.one_hot(batch["shft_qseqs"].long(), model.num_c)).sum(-1)


def make_loss_fn(run: str, variant: str | None = None):
    with_logits = run == "bce_with_logits_on_sigmoid" and variant != "bce"

    def loss_fn(model, batch):
        y = predict_next(model, batch)
        sm = batch["smasks"]
        pred, target = torch.masked_select(y, sm), torch.masked_select(batch["shft_rseqs"], sm).double()
        if with_logits:
            return F.binary_cross_entropy_with_logits(pred.double(), target)
        return F.binary_cross_entropy(pred.double(), target)
    return loss_fn


@torch.no_grad()
def evaluate(model, batches):
    """pykt's evaluate: AUC and the BCE of the model's probabilities over the valid next positions."""
    model.eval()
    ys, ts = [], []
    for b in batches:
        y = predict_next(model, b)
        ys.append(torch.masked_select(y, b["smasks"]))
        ts.append(torch.masked_select(b["shft_rseqs"], b["smasks"]))
    model.train()
    y, t = torch.cat(ys).double(), torch.cat(ts).double()
    order = torch.argsort(y)
    ranks = torch.empty_like(y)
    ranks[order] = torch.arange(1, len(y) + 1, dtype=y.dtype)
    n_pos = t.sum()
    auc = float((ranks[t == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * (len(t) - n_pos)))
    bce = float(F.binary_cross_entropy(y.clamp(1e-7, 1 - 1e-7), t))
    return auc, bce


def build(variant: str | None = None):
    model = DKT()
    opt = torch.optim.Adam(model.parameters(), lr=LR * (10 if variant == "lr_high" else 1))
    return model, opt


# ----------------------------------------------------------------------------------------------------- train
def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    tr_win, va_win = split(seed)
    va_batches = loader(va_win, None, seed)
    model, opt = build(variant)
    loss_fn = make_loss_fn(run, variant)
    epochs = EPOCHS * (2 if variant == "more_epochs" else 1)
    losses, val_bce, val_auc = [], [], []
    ckpt = out_dir / "dkt_model.ckpt"
    best_auc = -1.0
    for epoch in range(epochs):
        for batch in loader(tr_win, epoch, seed):
            loss = loss_fn(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        auc, bce = evaluate(model, va_batches)
        val_auc.append(auc)
        val_bce.append(bce)
        if auc > best_auc:
            best_auc = auc
        if epoch + 1 == CKPT_EPOCH:       # the save the owner triages (pykt saves on a better val AUC)
            torch.save({"model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
                        "epoch": epoch + 1, "validauc": auc}, ckpt)
    per_epoch = len(losses) // epochs
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_bce,
                   metrics={"val_auc": val_auc[-1], "val_bce": val_bce[-1], "val_auc_first": val_auc[0],
                            "train_loss_last_epoch": float(np.mean(losses[-per_epoch:])),
                            "train_loss_first_epoch": float(np.mean(losses[:per_epoch]))})


VAL_BCE_OK = 0.6    # the recipe's validation BCE falls to about 0.45 on these students


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if not all(math.isfinite(v) for v in trained.train_losses):
        return "loss went to NaN"
    if m["val_bce"] > VAL_BCE_OK:
        return (f"validation BCE of the predicted probabilities {m['val_bce']:.3f} after {len(trained.val_losses)} "
                f"epochs (the recipe gets ~0.45); training loss {m['train_loss_first_epoch']:.3f} -> "
                f"{m['train_loss_last_epoch']:.3f} (recipe ~0.42), validation AUC {m['val_auc']:.3f}")
    return None


# ---------------------------------------------------------------------------------------------------- setups
def _setup(run: str):
    import triage

    seed = 0
    model, opt = build()
    tr_win, va_win = split(seed)
    batches = [b for e in (CKPT_EPOCH, CKPT_EPOCH + 1) for b in loader(tr_win, e, seed)]
    return triage.Setup(
        model=model, optimizer=opt, loss_fn=make_loss_fn(run),
        batches=batches, val_batches=loader(va_win, None, seed),
        steps_per_epoch=len(loader(tr_win, 0, seed)),
        total_steps=EPOCHS * len(loader(tr_win, 0, seed)),
    )


def setup_healthy():
    return _setup("healthy")


def setup_bce_with_logits_on_sigmoid():
    return _setup("bce_with_logits_on_sigmoid")


if __name__ == "__main__":
    torch.set_num_threads(1)
    run = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    tr = train(run, Path("."), seed=0)
    print(symptom(run, tr), tr.metrics)
