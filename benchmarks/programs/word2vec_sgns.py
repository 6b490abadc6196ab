"""Skip-gram word2vec with negative sampling (SGNS), sparse embeddings trained by SparseAdam.

What it does: two embedding tables, u (centre words, the vectors kept) and v (context / output words), both
nn.Embedding(sparse=True). For a (centre, context) pair and 5 negatives drawn from the unigram^0.75 table, the
loss is -log sigmoid(u.v) - sum_k log sigmoid(-u.v_k) (scores clamped to [-10, 10]), averaged over the batch:
the original word2vec's SGNS objective. The corpus is made in code: 10 topics of 24 words plus 40 common
words, sentences of 8-12 words drawn mostly from one topic (Zipf-weighted), so words of a topic co-occur and a
trained u table puts them next to each other. Pairs come from a dynamic window of up to 3 words each side
(word2vec's reduced window), batched as (pos_u, pos_v, neg_v) tensors the way a collate_fn returns them. Its
loss never reaches 0 (negatives drawn from the unigram table are often real context words): the healthy
floor is ~2. The quality read is nearest-neighbour topic purity of the u vectors (chance ~0.08).

The public original it follows: Andras7/word2vec-pytorch (word2vec/model.py: SkipGramModel with
u_embeddings / v_embeddings sparse=True, u uniform(-1/dim, 1/dim), v constant 0, clamped logsigmoid terms,
mean over the batch; word2vec/trainer.py: a fresh optim.SparseAdam and CosineAnnealingLR(len(dataloader)) per
iteration, the scheduler stepped every batch; word2vec/data_reader.py: unigram^0.75 negative table, collate
into three LongTensors), read with the search tool. My loop keeps its shape (two iterations, a new
SparseAdam + cosine schedule each), with lr 0.03 for this small corpus and the scheduler stepped after the
optimizer. The original word2vec.c decays alpha linearly towards 0 over all iterations
(alpha = starting_alpha * (1 - word_count_actual / (iter * train_words + 1))), the schedule of the third
run. The checkpoint is a dict {"model", "optimizer", "scheduler", "iteration", "step"}.

Runs:
- healthy: loss 4.16 (= 6 ln 2 at init) falls to ~2.1 and is still falling at the checkpoint (global step
  60 of 300, loss ~2.8 there); topic purity of neighbours reaches ~0.97 (chance ~0.1).
- zero_init_both_tables: word2vec's C code and Andras7's model zero the OUTPUT table (syn1neg / v) and draw
  the input table uniformly; the user "simplified" the init to init.constant_(..., 0) for both tables. With
  u = v = 0 every score is 0, and the gradient of each table is the other table: exactly zero for both, so
  SparseAdam never moves anything and the loss sits at 6 ln 2 = 4.159 for the whole run, the embeddings stay
  0. The embedding init is a known stumbling block (Adoni/word2vec_pytorch issue #4 asks why u is drawn in
  +-0.5/dim; tensorflow/tensorflow issue #28487 "Adam not learning when an embedding is initialized to
  zero"). Root cause `bad_initialization`: the decider is that a fresh (non-zero) init trains; the fix is
  word2vec's init of u (variant `word2vec_init`). The competing fix a user tries first, lr x 10 (`lr_x10`),
  changes nothing: the gradients are exactly 0.
- linear_decay_over_one_pass: the user replaced the per-iteration cosine restarts with word2vec.c's linear
  decay of the LR to 0, one SparseAdam for the whole run (torch.optim.lr_scheduler.LinearLR(start_factor=1,
  end_factor=0, total_iters=len(dataloader))), and trains three passes: the decay was sized for one pass, so
  the LR is exactly 0 from step 150 on. The loss drops 4.16 -> 2.47 in the first pass, then stays flat to
  the last digit for two passes (purity ~0.75); sized over all passes it keeps falling to ~1.87 (purity
  ~0.99). Sizing a schedule in batches of one epoch while stepping it across all epochs is a standard mistake
  (Andras7's trainer itself sizes its CosineAnnealingLR with len(self.dataloader) and so has to re-create it
  every iteration). Root cause `lr_schedule_decayed`: the LR at the checkpoint (step 200) is 0 against a
  peak of 0.03; the fix is the decay over all passes (variant `decay_over_all_passes`). The competing fix, a
  10x peak LR (`lr_x10`), still decays to 0 after the first pass and leaves the loss flat.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

import triage

PROGRAM = Program(
    name="word2vec_sgns",
    kind="word embeddings (SGNS)",
    original="Andras7/word2vec-pytorch (word2vec/model.py SkipGramModel, word2vec/trainer.py Word2VecTrainer)",
    runs={
        "healthy": Run(
            cause="healthy",
            story="SGNS with sparse u/v tables and SparseAdam on a topic corpus; loss 4.16 -> ~2.1 (its floor is "
                  "far above 0), still falling at the step-60 checkpoint, neighbour topic purity ~0.97 (chance 0.1).",
        ),
        "zero_init_both_tables": Run(
            cause="bad_initialization",
            story="I initialised both embedding tables to zero (word2vec zeroes the output table, I did it for "
                  "both). The loss sat at 4.159 from the first step to the last and the vectors stayed 0; "
                  "a 10x learning rate changed nothing.",
            fix="word2vec_init",
            competing=("lr_x10",),
        ),
        "linear_decay_over_one_pass": Run(
            cause="lr_schedule_decayed",
            story="I replaced the per-iteration cosine with word2vec's linear decay of the LR to 0, one "
                  "optimizer for the whole run, but sized the decay with len(dataloader): it reached 0 after the "
                  "first of three passes. The loss dropped, then sat flat for two passes; a 10x learning rate "
                  "left it flat too.",
            fix="decay_over_all_passes",
            competing=("lr_x10",),
        ),
    },
)

N_TOPICS, TOPIC_WORDS, COMMON = 10, 24, 40
VOCAB = N_TOPICS * TOPIC_WORDS + COMMON
DIM = 32
NEG = 5
WINDOW = 3
BATCH = 256
BATCHES_PER_ITER = 150
ITERATIONS = 2
CKPT_STEP = 60
LR = 0.03
DECAY_PASSES = 3            # the linear-decay run trains three passes over the data
DECAY_CKPT_STEP = 200       # in the second pass, once the loss has gone flat


def _zipf(n):
    w = [1.0 / (i + 1) ** 0.8 for i in range(n)]
    s = sum(w)
    return [x / s for x in w]


def corpus(seed: int, n_sent: int = 2600):
    rng = random.Random(seed)
    tz, cz = _zipf(TOPIC_WORDS), _zipf(COMMON)
    sents = []
    for _ in range(n_sent):
        t = rng.randrange(N_TOPICS)
        s = []
        for _ in range(rng.randint(8, 12)):
            if rng.random() < 0.7:
                s.append(t * TOPIC_WORDS + rng.choices(range(TOPIC_WORDS), tz)[0])
            else:
                s.append(N_TOPICS * TOPIC_WORDS + rng.choices(range(COMMON), cz)[0])
        sents.append(s)
    return sents


def batches(seed: int):
    """(pos_u, pos_v, neg_v) batches in corpus order, as the original's DataLoader(shuffle=False) gives them."""
    sents = corpus(seed)
    rng = random.Random(seed + 17)
    counts = torch.zeros(VOCAB)
    for s in sents:
        for w in s:
            counts[w] += 1
    noise = counts ** 0.75
    noise /= noise.sum()
    pairs = []
    for s in sents:
        for i, w in enumerate(s):
            b = rng.randint(1, WINDOW)                       # word2vec's reduced window
            for j in range(max(0, i - b), min(len(s), i + b + 1)):
                if j != i:
                    pairs.append((w, s[j]))
    g = torch.Generator().manual_seed(seed + 29)
    n = BATCH * BATCHES_PER_ITER
    pairs = pairs[:n]
    assert len(pairs) == n, len(pairs)
    pu = torch.tensor([p[0] for p in pairs]); pv = torch.tensor([p[1] for p in pairs])
    neg = torch.multinomial(noise, n * NEG, replacement=True, generator=g).view(n, NEG)
    return [(pu[i:i + BATCH], pv[i:i + BATCH], neg[i:i + BATCH]) for i in range(0, n, BATCH)]


class SkipGramModel(nn.Module):
    def __init__(self, emb_size=VOCAB, emb_dimension=DIM, zero_both=False):
        super().__init__()
        self.emb_dimension = emb_dimension
        self.u_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        self.v_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        initrange = 1.0 / emb_dimension
        if zero_both:
            init.constant_(self.u_embeddings.weight.data, 0)   # the fault: the input table zeroed too
        else:
            init.uniform_(self.u_embeddings.weight.data, -initrange, initrange)
        init.constant_(self.v_embeddings.weight.data, 0)

    def forward(self, pos_u, pos_v, neg_v):
        emb_u = self.u_embeddings(pos_u)
        emb_v = self.v_embeddings(pos_v)
        emb_neg_v = self.v_embeddings(neg_v)
        score = torch.clamp((emb_u * emb_v).sum(dim=1), min=-10, max=10)
        score = -F.logsigmoid(score)
        neg_score = torch.bmm(emb_neg_v, emb_u.unsqueeze(2)).squeeze(2)
        neg_score = torch.clamp(neg_score, min=-10, max=10)
        neg_score = -F.logsigmoid(-neg_score).sum(dim=1)
        return (score + neg_score).mean()


def loss_fn(model, batch):
    pos_u, pos_v, neg_v = batch
    return model(pos_u, pos_v, neg_v)


def build(run: str, variant: str | None, seed: int):
    torch.manual_seed(seed)
    zero_both = run == "zero_init_both_tables" and variant != "word2vec_init"
    model = SkipGramModel(zero_both=zero_both)
    lr = LR * (10.0 if variant == "lr_x10" else 1.0)
    return model, lr


def make_opt(model, lr):
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, BATCHES_PER_ITER)
    return opt, sched


def make_linear_decay(model, lr, variant):
    """word2vec.c's linear decay of alpha towards 0, one optimizer for the whole run."""
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=lr)
    # the fault: the decay horizon is one pass (len(dataloader)), the run makes DECAY_PASSES of them
    horizon = BATCHES_PER_ITER * (DECAY_PASSES if variant == "decay_over_all_passes" else 1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.0, total_iters=horizon)
    return opt, sched


def train_linear_decay(run, out_dir, seed, variant):
    data = batches(seed)
    model, lr = build(run, variant, seed)
    opt, sched = make_linear_decay(model, lr, variant)
    ckpt = out_dir / "sgns.pt"
    losses, lrs, step = [], [], 0
    for iteration in range(DECAY_PASSES):
        for batch in data:
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            lrs.append(opt.param_groups[0]["lr"])
            sched.step()
            step += 1
            losses.append(loss.item())
            if step == DECAY_CKPT_STEP:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(), "iteration": iteration, "step": step}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"purity": topic_purity(model), "u_norm": float(model.u_embeddings.weight.detach().norm()),
                            "lr_end": lrs[-1], "lr_peak": max(lrs)})


@torch.no_grad()
def topic_purity(model, k=5):
    u = F.normalize(model.u_embeddings.weight[:N_TOPICS * TOPIC_WORDS], dim=1)
    sim = u @ u.t()
    sim.fill_diagonal_(-2)
    nn_idx = sim.topk(k, dim=1).indices
    topic = torch.arange(N_TOPICS * TOPIC_WORDS) // TOPIC_WORDS
    return float((topic[nn_idx] == topic.unsqueeze(1)).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    if run == "linear_decay_over_one_pass":
        return train_linear_decay(run, out_dir, seed, variant)
    data = batches(seed)
    model, lr = build(run, variant, seed)
    ckpt = out_dir / "sgns.pt"
    losses, step = [], 0
    running = None
    for iteration in range(ITERATIONS):
        opt, sched = make_opt(model, lr)                    # a fresh optimizer and schedule per iteration
        for batch in data:
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.item())
            running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
            if step == CKPT_STEP:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(), "iteration": iteration, "step": step}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"purity": topic_purity(model), "u_norm": float(model.u_embeddings.weight.detach().norm())})


def symptom(run: str, trained: Trained) -> str | None:
    L = trained.train_losses
    first, last = sum(L[:5]) / 5, sum(L[-20:]) / 20
    m = trained.metrics
    if run == "healthy":
        if not (last < first - 1.0 and m["purity"] > 0.6):
            return f"healthy run did not train: loss {first:.3f} -> {last:.3f}, topic purity {m['purity']:.2f}"
        return None
    if run == "linear_decay_over_one_pass":
        n = BATCHES_PER_ITER
        p2, p3 = sum(L[n:2 * n]) / n, sum(L[2 * n:]) / n      # the same batches in the same order each pass
        if p2 - p3 < 0.005:
            return (f"loss dropped {first:.3f} -> {p2:.3f} in passes 1-2, then flat in pass 3 ({p3:.3f}, "
                    f"{p2 - p3:+.4f}); LR {m['lr_end']:.2g} against a peak of {m['lr_peak']:.2g}")
        return None
    if abs(first - last) < 0.05 * first:
        return (f"SGNS loss flat at {first:.3f} -> {last:.3f} over {len(L)} steps (6 ln 2 = 4.159); u-table norm "
                f"{m['u_norm']:.3g}, neighbour topic purity {m['purity']:.2f} (chance ~0.08)")
    return None


def _setup(run: str) -> triage.Setup:
    model, lr = build(run, None, 0)
    opt, sched = make_opt(model, lr)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn, batches=batches(0),
                        total_steps=ITERATIONS * BATCHES_PER_ITER)


def setup_healthy() -> triage.Setup:
    return _setup("healthy")


def setup_zero_init_both_tables() -> triage.Setup:
    return _setup("zero_init_both_tables")


def setup_linear_decay_over_one_pass() -> triage.Setup:
    model, lr = build("linear_decay_over_one_pass", None, 0)
    opt, sched = make_linear_decay(model, lr, None)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn, batches=batches(0),
                        total_steps=DECAY_PASSES * BATCHES_PER_ITER)


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        for v in [None] + ([PROGRAM.runs[r].fix] if r != "healthy" else []):
            t = time.perf_counter()
            tr = train(r, Path("/tmp/h3"), 0, v)
            print(r, v, f"{time.perf_counter() - t:.1f}s", symptom(r, tr), tr.metrics,
                  [round(x, 2) for x in tr.train_losses[::20]])
