"""SASRec: self-attentive sequential recommendation, a causal transformer over item histories trained with one
sampled negative per position (pmixer/SASRec.pytorch).

Written after pmixer/SASRec.pytorch (`model.py` and `main.py`, read through the `search` tool together with other
ports of kang205/SASRec): item embeddings with `padding_idx=0` scaled by sqrt(d), learned positional embeddings,
blocks of (LayerNorm -> causal MultiheadAttention with the LayerNormed query, residual -> LayerNorm -> point-wise
Conv1d feed-forward, residual), padded positions zeroed by a timeline mask, a last LayerNorm; a position's score for
an item is the dot product of its feature with the item's embedding. `main.py` feeds each user's history
left-padded to `maxlen`, with `pos` the history shifted by one and `neg` one random item the user never touched
per position, and trains `BCEWithLogitsLoss` on the positive and negative logits at the positions where
`pos != 0`, Adam lr 1e-3 betas (0.9, 0.98); it evaluates HR@10 of the held-out last item of each user against
100 sampled negatives and saves `model.state_dict()` as `SASRec.epoch=E.lr=...pth`. Here the item histories are
made in code: 300 items, 640 users, each history a walk of a sparse Markov chain (every item has 3 likely
successors) of 12-30 items; maxlen 20, hidden 32, 2 blocks, 1 head, dropout 0.2, batches of 16 users (40 per
epoch, one fresh negative per position each epoch), 15 epochs, HR@10 after every epoch. A batch is a dict `{"seq", "pos", "neg"}` of (B, 20) item ids, 0 = padding.

Runs
- healthy: validation HR@10 rises from ~0.2 after the first epoch to ~0.8; the BCE of the positive + negative
  terms (with dropout on) falls from 1.44 to ~0.85; the checkpoint is the epoch-6 state dict, still improving.
- sigmoid_in_model: the owner made the model's `forward` return `torch.sigmoid(pos_logits)`,
  `torch.sigmoid(neg_logits)` ("so `predict` gives probabilities for serving") and kept `BCEWithLogitsLoss` in
  the training loop: a double sigmoid. The loss can never go below -log(sigmoid(1)) - log(1 - sigmoid(0)) = 1.01,
  and the squashed scores carry a weak gradient: the training loss sits at 1.1-1.3 where the healthy run reaches
  0.85, and HR@10 lags behind (0.75 against 0.82 at the end, 0.5 against 0.7 mid-run). Returning probabilities from the model while the criterion expects logits is
  the mistake the PyTorch docs warn about (BCEWithLogitsLoss "combines a Sigmoid layer and the BCELoss"), and
  a frequent forum question ("loss stuck at 0.69/1.0 with BCEWithLogitsLoss after sigmoid"). Root cause
  `wrong_loss`: the loss the outputs call for (BCE on the raw logits, `logits_out`) trains. Competing fix a user
  tries first: a 10x larger lr (`lr_1e-2`), which leaves the loss above 1.0 (the floor is structural, ~1.1).
- warmup_total_steps_in_epochs: the owner added a linear warmup/decay schedule, as BERT4Rec/SASRec ports with
  `get_linear_schedule_with_warmup` do, stepped after every batch, but passed `num_training_steps=num_epochs`
  (60) instead of `num_epochs * num_batch` (300), with 10% warmup. The LR peaks at step 6 and is 0 from step 60
  on: the loss drops early, then freezes for the remaining 240 steps with HR@10 far below the healthy run's.
  Passing the epoch count where a scheduler stepped per batch expects the step count is a known slip (Hugging
  Face forum / transformers issues about "lr becomes 0 after the first epoch" with
  `get_linear_schedule_with_warmup`). Root cause `lr_schedule_decayed`: the step count (`total_steps_fixed`)
  trains. Competing fix a user tries: a 10x larger peak lr (`lr_1e-2`), which still leaves the LR at 0 for 97%
  of the run and HR@10 at ~0.25-0.3. With the step count the run reaches HR@10 ~0.7.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="sasrec_sequential_rec",
    kind="sequential recommendation",
    original="pmixer/SASRec.pytorch: model.py (SASRec, log2feats) and main.py (BCEWithLogitsLoss on pos/neg, Adam)",
    runs={
        "healthy": Run(cause="healthy", story="SASRec on item-history walks; HR@10 rises from chance to ~0.9, BCE "
                       "falls from 1.39; checkpoint: the epoch-20 state dict of 60."),
        "sigmoid_in_model": Run(
            cause="wrong_loss",
            story="Since the model returns probabilities the loss never goes below 1.0 and HR@10 lags far behind "
                  "the paper's numbers. A 10x larger lr did not get the loss down.",
            fix="logits_out", competing=("lr_1e-2",)),
        "warmup_total_steps_in_epochs": Run(
            cause="lr_schedule_decayed",
            story="After adding linear warmup/decay the loss drops for a few steps and then stops moving; HR@10 "
                  "stays low. A 10x larger lr did not help.",
            fix="total_steps_fixed", competing=("lr_1e-2",)),
    },
)

N_ITEMS, N_USERS, MAXLEN, HIDDEN, BLOCKS, HEADS, BS, EPOCHS = 300, 640, 20, 32, 2, 1, 16, 15
NUM_BATCH = N_USERS // BS


def make_histories(seed):
    rng = np.random.default_rng(1000 + seed)
    succ = rng.integers(1, N_ITEMS + 1, size=(N_ITEMS + 1, 3))
    users = []
    for _ in range(N_USERS):
        n = int(rng.integers(12, 31))
        h = [int(rng.integers(1, N_ITEMS + 1))]
        while len(h) < n:
            nxt = int(succ[h[-1], rng.integers(0, 3)]) if rng.random() < 0.85 else int(rng.integers(1, N_ITEMS + 1))
            h.append(nxt)
        users.append(h)
    return users


def sample_user(hist, rng):
    """One training example as main.py's WarpSampler builds it: all but the held-out last item, left-padded."""
    train = hist[:-1]
    seq, pos, neg = np.zeros(MAXLEN, np.int64), np.zeros(MAXLEN, np.int64), np.zeros(MAXLEN, np.int64)
    nxt, idx, seen = train[-1], MAXLEN - 1, set(hist)
    for i in reversed(train[:-1]):
        seq[idx], pos[idx] = i, nxt
        while True:
            n = int(rng.integers(1, N_ITEMS + 1))
            if n not in seen:
                break
        neg[idx] = n
        nxt = i
        idx -= 1
        if idx == -1:
            break
    return seq, pos, neg


def make_batch(histories, users, rng):
    s, p, n = zip(*[sample_user(histories[u], rng) for u in users])
    return {"seq": torch.from_numpy(np.stack(s)), "pos": torch.from_numpy(np.stack(p)),
            "neg": torch.from_numpy(np.stack(n))}


def eval_set(histories, seed):
    """The held-out last item of each user against 100 items the user never touched (main.py's evaluate)."""
    rng = np.random.default_rng(5000 + seed)
    seqs, cands = [], []
    for h in histories:
        seq = np.zeros(MAXLEN, np.int64)
        ctx = h[:-1][-MAXLEN:]
        seq[MAXLEN - len(ctx):] = ctx
        seen, c = set(h), [h[-1]]
        while len(c) < 101:
            n = int(rng.integers(1, N_ITEMS + 1))
            if n not in seen:
                c.append(n)
        seqs.append(seq)
        cands.append(c)
    return torch.from_numpy(np.stack(seqs)), torch.tensor(cands)


class PointWiseFeedForward(nn.Module):
    def __init__(self, d, p):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv1d(d, d, 1), nn.Conv1d(d, d, 1)
        self.drop1, self.drop2, self.relu = nn.Dropout(p), nn.Dropout(p), nn.ReLU()

    def forward(self, x):
        out = self.drop2(self.conv2(self.relu(self.drop1(self.conv1(x.transpose(-1, -2))))))
        return out.transpose(-1, -2) + x


class SASRec(nn.Module):
    def __init__(self, sigmoid_out=False, dropout=0.2):
        super().__init__()
        self.sigmoid_out = sigmoid_out
        self.item_emb = nn.Embedding(N_ITEMS + 1, HIDDEN, padding_idx=0)
        self.pos_emb = nn.Embedding(MAXLEN + 1, HIDDEN, padding_idx=0)
        self.emb_dropout = nn.Dropout(dropout)
        self.attention_layernorms = nn.ModuleList([nn.LayerNorm(HIDDEN, eps=1e-8) for _ in range(BLOCKS)])
        self.attention_layers = nn.ModuleList([nn.MultiheadAttention(HIDDEN, HEADS, dropout) for _ in range(BLOCKS)])
        self.forward_layernorms = nn.ModuleList([nn.LayerNorm(HIDDEN, eps=1e-8) for _ in range(BLOCKS)])
        self.forward_layers = nn.ModuleList([PointWiseFeedForward(HIDDEN, dropout) for _ in range(BLOCKS)])
        self.last_layernorm = nn.LayerNorm(HIDDEN, eps=1e-8)
        for name, p in self.named_parameters():  # main.py: xavier_normal_ on every weight it can
            try:
                nn.init.xavier_normal_(p.data)
            except ValueError:
                pass
        with torch.no_grad():
            self.item_emb.weight[0].zero_()
            self.pos_emb.weight[0].zero_()

    def log2feats(self, log_seqs):
        seqs = self.item_emb(log_seqs) * HIDDEN ** 0.5
        poss = torch.arange(1, log_seqs.shape[1] + 1).unsqueeze(0).expand_as(log_seqs) * (log_seqs != 0)
        seqs = self.emb_dropout(seqs + self.pos_emb(poss))
        timeline_mask = (log_seqs == 0).unsqueeze(-1)
        seqs = seqs.masked_fill(timeline_mask, 0.0)
        tl = seqs.shape[1]
        attention_mask = ~torch.tril(torch.ones((tl, tl), dtype=torch.bool))
        for i in range(len(self.attention_layers)):
            seqs = seqs.transpose(0, 1)
            q = self.attention_layernorms[i](seqs)
            mha_outputs, _ = self.attention_layers[i](q, seqs, seqs, attn_mask=attention_mask, need_weights=False)
            seqs = (q + mha_outputs).transpose(0, 1)
            seqs = self.forward_layers[i](self.forward_layernorms[i](seqs))
            seqs = seqs.masked_fill(timeline_mask, 0.0)
        return self.last_layernorm(seqs)

    def forward(self, log_seqs, pos_seqs, neg_seqs):
        feats = self.log2feats(log_seqs)
        pos_logits = (feats * self.item_emb(pos_seqs)).sum(-1)
        neg_logits = (feats * self.item_emb(neg_seqs)).sum(-1)
        if self.sigmoid_out:
            return torch.sigmoid(pos_logits), torch.sigmoid(neg_logits)
        return pos_logits, neg_logits

    def predict(self, log_seqs, item_indices):
        final = self.log2feats(log_seqs)[:, -1, :]
        return (self.item_emb(item_indices) * final.unsqueeze(1)).sum(-1)


bce_criterion = nn.BCEWithLogitsLoss()


def loss_fn(model, batch):
    pos_logits, neg_logits = model(batch["seq"], batch["pos"], batch["neg"])
    indices = batch["pos"] != 0
    loss = bce_criterion(pos_logits[indices], torch.ones_like(pos_logits[indices]))
    return loss + bce_criterion(neg_logits[indices], torch.zeros_like(neg_logits[indices]))


def config(run, variant):
    lr = 1e-2 if variant == "lr_1e-2" else 1e-3
    sigmoid_out = run == "sigmoid_in_model" and variant != "logits_out"
    sched_total = None
    if run == "warmup_total_steps_in_epochs":
        sched_total = EPOCHS * NUM_BATCH if variant == "total_steps_fixed" else EPOCHS
    return lr, sigmoid_out, sched_total


def linear_warmup(opt, total):
    warm = max(1, int(0.1 * total))

    def lr_lambda(step):
        if step < warm:
            return float(step) / float(warm)
        return max(0.0, float(total - step) / float(max(1, total - warm)))

    return torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)


def build(run, variant, seed=0):
    lr, sigmoid_out, sched_total = config(run, variant)
    torch.manual_seed(seed)
    model = SASRec(sigmoid_out)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    sched = linear_warmup(opt, sched_total) if sched_total is not None else None
    return model, opt, sched


@torch.no_grad()
def hit_rate(model, seqs, cands):
    model.eval()
    scores = model.predict(seqs, cands)
    rank = (scores[:, 1:] > scores[:, :1]).sum(1)
    model.train()
    return float((rank < 10).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    histories = make_histories(seed)
    seqs, cands = eval_set(histories, seed)
    model, opt, sched = build(run, variant, seed)
    rng = np.random.default_rng(seed)
    ckpt_epoch = 6 if run == "healthy" else EPOCHS
    ckpt = None
    losses, hrs = [], []
    model.train()
    for epoch in range(1, EPOCHS + 1):
        perm = rng.permutation(N_USERS)
        for step in range(NUM_BATCH):
            batch = make_batch(histories, perm[step * BS:(step + 1) * BS], rng)
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(loss.item())
        if True:
            hrs.append(hit_rate(model, seqs, cands))
        if epoch == ckpt_epoch:
            ckpt = Path(out_dir) / f"SASRec.epoch={epoch}.lr={opt.defaults['lr']}.layer={BLOCKS}.head={HEADS}" \
                                   f".hidden={HIDDEN}.maxlen={MAXLEN}.pth"
            torch.save(model.state_dict(), ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=[1.0 - h for h in hrs],
                   metrics={"first": float(np.mean(losses[:5])), "last": float(np.mean(losses[-120:])),
                            "hr10": float(np.mean(hrs[-2:])), "hr10_first": hrs[0]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    said = (f"train BCE (pos + neg) {m['first']:.3f} -> {m['last']:.3f} over {EPOCHS} epochs (mean of the last 120 "
            f"steps), validation HR@10 {m['hr10_first']:.2f} after 1 epoch -> {m['hr10']:.2f} at the end (chance 0.10)")
    if run == "sigmoid_in_model":
        return said + "; the loss never goes below 1.0" if m["last"] > 1.0 else None
    if m["hr10"] < 0.45 or (run == "healthy" and m["last"] > 1.0):
        return said
    return None


def _setup(run):
    import triage

    histories = make_histories(0)
    model, opt, sched = build(run, None, 0)
    rng = np.random.default_rng(0)
    batches = []
    while len(batches) < 40:
        perm = rng.permutation(N_USERS)
        batches += [make_batch(histories, perm[s * BS:(s + 1) * BS], rng) for s in range(NUM_BATCH)]
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches, scheduler=sched,
                        total_steps=EPOCHS * NUM_BATCH)


def setup_healthy():
    return _setup("healthy")


def setup_sigmoid_in_model():
    return _setup("sigmoid_in_model")


def setup_warmup_total_steps_in_epochs():
    return _setup("warmup_total_steps_in_epochs")
