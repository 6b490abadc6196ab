"""BiLSTM-CRF sequence tagger on synthetic BIO-tagged sentences, padded batches with masks.

What it does: a word-embedding + bidirectional LSTM produces per-token emission scores; a linear-chain CRF
(start / end / transition scores, batched forward algorithm over a padded batch with a mask, Viterbi decoding)
turns them into a sequence-level objective. The loss is the CRF negative log-likelihood
log Z(x) - score(x, y), averaged over the sentences of a batch. The data is made in code: sentences of 4-14
tokens built from templates ("mr <first> <last> lives in <city>", "<city> is near <city>", ...), tags
O / B-PER / I-PER / B-LOC / I-LOC, with ambiguous words (a name that is also a city, read only by its
context) and 4 % of the tags re-drawn at random, so the NLL's floor is well above 0. Batches are dicts
{"tokens", "tags", "mask", "lengths"} padded with token 0 (tags padded with 0 under a False mask), each batch
sorted by length for pack_padded_sequence(enforce_sorted=True).
Validation: held-out sentences, the same NLL plus token accuracy of the Viterbi path.

The public original it follows: the PyTorch tutorial "Advanced: Making Dynamic Decisions and the Bi-LSTM CRF"
(beginner_source/nlp/advanced_tutorial.py: BiLSTM_CRF, _forward_alg, _score_sentence, _viterbi_decode; its
per-sentence loop) and kmkurn/pytorch-crf (torchcrf/__init__.py: CRF(num_tags, batch_first=True) whose
forward(emissions, tags, mask, reduction) returns the LOG-LIKELIHOOD, batched _compute_normalizer /
_compute_score with a mask, decode()). I read both with the search tool and wrote a small batched CRF with
pytorch-crf's interface (not installed here), used as BiLSTM-CRF repositories use it: Adam, a dict batch,
`loss = -crf(emissions, tags, mask=mask, reduction="mean")`, a checkpoint dict with model / optimizer / step.

Runs:
- healthy: the loss is the negated log-likelihood; it falls from ~12 to ~3 per sentence and keeps falling
  at the checkpoint (step 60 of 150); the floor is not 0 (label noise and ambiguous words).
- crf_loglik_not_negated: the user took pytorch-crf's `crf(emissions, tags, mask)` for a loss (the name
  "loss = model.crf(...)" in their code) and minimised the log-likelihood itself. The printed loss is
  negative from the first step and runs away (-12 -> hundreds below zero), the Viterbi path gets worse than
  the majority tag, and no learning rate helps. Real users hit exactly this: kmkurn/pytorch-crf issue #27
  ("Multiply -1 before loss.backward()?": the maintainer: the returned value is the log likelihood, multiply
  by -1) and issue #81 ("bi-LSTM with CRF not training properly ... a really big negative loss, and decode
  just outputs my padding value": fixed by `loss = -crf(...)`). Root cause `wrong_loss`: the objective is
  the wrong function of the outputs (its sign), a loss going below its floor of 0 (the NLL of a CRF is >= 0);
  the fix is negating it (variant `negate_loglik`); the competing fix a user tries first, lr x 0.1
  (`lr_x0.1`), still drives the loss negative.
- collate_sorts_tokens_not_tags: the collate_fn sorts each padded batch by length, longest first, because the
  model packs it with pack_padded_sequence(enforce_sorted=True) (the ordering older PyTorch required and the
  older BiLSTM-CRF repositories still do); it reorders tokens, mask and lengths with the sort's permutation
  but leaves the tags in the original order, so each tag row belongs to another sentence of the batch. The
  CRF still fits what the tags carry on their own (how often O is, which tag follows which): the loss falls
  from ~12 to ~7 per sentence and stays there (a correct pairing reaches ~2), and the Viterbi tags are no
  better than tagging everything O, in training and in validation (built by the same collate). Sorting the
  inputs of a batch and forgetting one of the tensors is the bookkeeping pitfall of packed sequences: the
  torch.nn.utils.rnn.pack_padded_sequence docs (enforce_sorted=True by default: "the sequences should be
  sorted by length in a decreasing order") and write-ups such as city.shaform.com "Sort sequences in
  PyTorch" (2019: sort, keep the permutation, unsort the outputs) show how many tensors must follow it. Root cause `label_bug`: the labels the loss reads are unrelated to
  the inputs; the fix sorts the tags with the same permutation (variant `sort_tags_too`). The competing fix
  a user tries first for a stuck loss, lr x 10 (`lr_x10`), lowers the loss a little by fitting the tag
  statistics harder and tags no better.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    from _program import Program, Run, Trained
except ImportError:  # imported by path from elsewhere
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

import triage

PROGRAM = Program(
    name="crf_sequence_tagging",
    kind="sequence tagging (CRF)",
    original="PyTorch tutorial 'Advanced: Making Dynamic Decisions and the Bi-LSTM CRF' "
             "(beginner_source/nlp/advanced_tutorial.py) + kmkurn/pytorch-crf torchcrf/__init__.py",
    runs={
        "healthy": Run(
            cause="healthy",
            story="BiLSTM-CRF on padded, masked batches; CRF NLL falls from ~12 to ~3 per sentence and is still "
                  "falling at the step-60 checkpoint; its floor is above 0 (noisy, ambiguous tags).",
        ),
        "crf_loglik_not_negated": Run(
            cause="wrong_loss",
            story="I used pytorch-crf's crf(emissions, tags, mask) as the loss without the minus sign: it is the "
                  "log-likelihood. The loss went negative at once and kept falling by hundreds, and the tagger "
                  "got worse than predicting O everywhere; lowering the LR only slowed the fall.",
            fix="negate_loglik",
            competing=("lr_x0.1",),
        ),
        "collate_sorts_tokens_not_tags": Run(
            cause="label_bug",
            story="My collate_fn sorts each batch by length for pack_padded_sequence(enforce_sorted=True); it "
                  "reorders tokens, mask and lengths but not the tags. The CRF loss fell to ~7 per sentence and "
                  "stopped there, and the tagger never beat tagging everything O; a 10x learning rate did not "
                  "help.",
            fix="sort_tags_too",
            competing=("lr_x10",),
        ),
    },
)

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
O, BP, IP, BL, IL = range(5)
FIRST = [f"first{i}" for i in range(12)]
LAST = [f"last{i}" for i in range(12)]
CITY = [f"city{i}" for i in range(12)]
AMBIG = [f"jordan{i}" for i in range(4)]            # a person's name or a place: the context decides
FILLER = [f"w{i}" for i in range(20)]
CUES = ["mr", "mrs", "dr", "in", "from", "to", "near", "met", "said", "lives", "visited", "and", "the", "is"]
VOCAB = ["<pad>"] + FIRST + LAST + CITY + AMBIG + FILLER + CUES
W = {w: i for i, w in enumerate(VOCAB)}
BATCH = 32
N_TRAIN_BATCHES = 48
N_VAL_BATCHES = 8
CKPT_STEP = 60
TOTAL_STEPS = 150
LR = 2e-3


def _sentence(rng: random.Random):
    words, tags = [], []

    def fill(k):
        for _ in range(k):
            words.append(rng.choice(FILLER)); tags.append(O)

    def person():
        title = rng.random() < 0.6
        if title:
            words.append(rng.choice(["mr", "mrs", "dr"])); tags.append(O)
        first = rng.choice(AMBIG) if (title and rng.random() < 0.3) else rng.choice(FIRST)
        words.append(first); tags.append(BP)
        if rng.random() < 0.7:
            words.append(rng.choice(LAST)); tags.append(IP)

    def place():
        words.append(rng.choice(["in", "from", "to", "near"])); tags.append(O)
        first = rng.choice(AMBIG) if rng.random() < 0.3 else rng.choice(CITY)
        words.append(first); tags.append(BL)
        if rng.random() < 0.3:
            words.append(rng.choice(CITY)); tags.append(IL)

    fill(rng.randint(0, 2))
    for _ in range(rng.randint(1, 3)):
        rng.choice([person, place])()
        if rng.random() < 0.5:
            words.append(rng.choice(["met", "said", "lives", "visited", "and", "the", "is"])); tags.append(O)
        fill(rng.randint(0, 1))
    words, tags = words[:14], tags[:14]
    tags = [rng.randrange(5) if rng.random() < 0.04 else t for t in tags]   # annotation noise
    return [W[w] for w in words], tags


def collate(sents, sort_tags=True):
    """Pad a list of (word ids, tag ids) and sort it by length, longest first, for pack_padded_sequence."""
    T = max(len(s[0]) for s in sents)
    tokens = torch.zeros(len(sents), T, dtype=torch.long)
    tags = torch.zeros(len(sents), T, dtype=torch.long)
    mask = torch.zeros(len(sents), T, dtype=torch.bool)
    for i, (ws, ts) in enumerate(sents):
        tokens[i, :len(ws)] = torch.tensor(ws)
        tags[i, :len(ts)] = torch.tensor(ts)
        mask[i, :len(ws)] = True
    lengths = mask.sum(1)
    lengths, perm = lengths.sort(descending=True, stable=True)
    tokens, mask = tokens[perm], mask[perm]
    if sort_tags:
        tags = tags[perm]
    # else the fault: the tags stay in the unsorted order, each row belongs to another sentence
    return {"tokens": tokens, "tags": tags, "mask": mask, "lengths": lengths}


def _batches(seed: int, n_batches: int, offset: int, sort_tags: bool = True):
    rng = random.Random(1000 * seed + offset)
    return [collate([_sentence(rng) for _ in range(BATCH)], sort_tags) for _ in range(n_batches)]


def data(seed: int = 0, run: str = "healthy", variant: str | None = None):
    sort_tags = not (run == "collate_sorts_tokens_not_tags" and variant != "sort_tags_too")
    return (_batches(seed, N_TRAIN_BATCHES, 1, sort_tags), _batches(seed, N_VAL_BATCHES, 2, sort_tags))


class CRF(nn.Module):
    """Linear-chain CRF with pytorch-crf's interface: forward() returns the log-likelihood."""

    def __init__(self, num_tags: int):
        super().__init__()
        self.num_tags = num_tags
        self.start_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).uniform_(-0.1, 0.1))

    def forward(self, emissions, tags, mask, reduction="sum"):
        # emissions (B, T, K), tags (B, T), mask (B, T) bool, first step unmasked
        llh = self._score(emissions, tags, mask) - self._normalizer(emissions, mask)
        if reduction == "sum":
            return llh.sum()
        if reduction == "mean":
            return llh.mean()
        return llh

    def _score(self, emissions, tags, mask):
        B, T, _ = emissions.shape
        maskf = mask.float()
        ar = torch.arange(B)
        score = self.start_transitions[tags[:, 0]] + emissions[ar, 0, tags[:, 0]]
        for t in range(1, T):
            step = self.transitions[tags[:, t - 1], tags[:, t]] + emissions[ar, t, tags[:, t]]
            score = score + step * maskf[:, t]
        last = tags[ar, mask.long().sum(1) - 1]
        return score + self.end_transitions[last]

    def _normalizer(self, emissions, mask):
        alpha = self.start_transitions + emissions[:, 0]                     # (B, K)
        for t in range(1, emissions.shape[1]):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.transitions + emissions[:, t].unsqueeze(1), dim=1)
            alpha = torch.where(mask[:, t].unsqueeze(1), nxt, alpha)
        return torch.logsumexp(alpha + self.end_transitions, dim=1)

    @torch.no_grad()
    def decode(self, emissions, mask):
        B, T, K = emissions.shape
        score = self.start_transitions + emissions[:, 0]
        history = []
        for t in range(1, T):
            cand = score.unsqueeze(2) + self.transitions + emissions[:, t].unsqueeze(1)
            best, idx = cand.max(dim=1)
            score = torch.where(mask[:, t].unsqueeze(1), best, score)
            history.append(idx)
        score = score + self.end_transitions
        lengths = mask.long().sum(1)
        paths = torch.zeros(B, T, dtype=torch.long)
        for b in range(B):
            tag = int(score[b].argmax())
            L = int(lengths[b])
            paths[b, L - 1] = tag
            for t in range(L - 2, -1, -1):
                tag = int(history[t][b, tag])
                paths[b, t] = tag
        return paths


class BiLSTMCRF(nn.Module):
    def __init__(self, vocab=len(VOCAB), emb=32, hidden=32, num_tags=len(TAGS)):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb, padding_idx=0)
        self.lstm = nn.LSTM(emb, hidden // 2, batch_first=True, bidirectional=True)
        self.hidden2tag = nn.Linear(hidden, num_tags)
        self.crf = CRF(num_tags)

    def emissions(self, tokens, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embedding(tokens), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=True)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=tokens.shape[1])
        return self.hidden2tag(out)


def make_loss_fn(run: str, variant: str | None):
    negate = not (run == "crf_loglik_not_negated" and variant != "negate_loglik")

    def loss_fn(model, batch):
        em = model.emissions(batch["tokens"], batch["lengths"])
        llh = model.crf(em, batch["tags"], mask=batch["mask"], reduction="mean")
        if negate:
            return -llh                 # the negative log-likelihood
        return llh                      # the fault: pytorch-crf's return value taken for a loss
    return loss_fn


def build(run: str, variant: str | None, seed: int):
    torch.manual_seed(seed)
    model = BiLSTMCRF()
    lr = LR * {"lr_x0.1": 0.1, "lr_x10": 10.0}.get(variant, 1.0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    return model, opt


@torch.no_grad()
def evaluate(model, val, loss_fn):
    model.eval()
    nll, correct, total = 0.0, 0, 0
    for b in val:
        em = model.emissions(b["tokens"], b["lengths"])
        nll += float(-model.crf(em, b["tags"], mask=b["mask"], reduction="mean"))
        pred = model.crf.decode(em, b["mask"])
        correct += int(((pred == b["tags"]) & b["mask"]).sum()); total += int(b["mask"].sum())
    model.train()
    return nll / len(val), correct / total


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    train_b, val_b = data(seed, run, variant)
    model, opt = build(run, variant, seed)
    loss_fn = make_loss_fn(run, variant)
    order_rng = random.Random(seed)
    losses, val_losses, val_accs = [], [], []
    ckpt = out_dir / "tagger.pt"
    step = 0
    while step < TOTAL_STEPS:
        order = list(range(len(train_b))); order_rng.shuffle(order)
        for i in order:
            model.train()
            loss = loss_fn(model, train_b[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            losses.append(loss.item())
            if step % 20 == 0:
                vl, va = evaluate(model, val_b, loss_fn)
                val_losses.append(vl); val_accs.append(va)
            if step == CKPT_STEP:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                            "tags": TAGS}, ckpt)
            if step >= TOTAL_STEPS:
                break
    majority = sum(int(((b["tags"] == O) & b["mask"]).sum()) for b in val_b) / sum(int(b["mask"].sum())
                                                                                   for b in val_b)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_acc": val_accs[-1], "val_acc_at_ckpt": val_accs[CKPT_STEP // 20 - 1],
                            "majority_acc": majority, "min_loss": min(losses)})


def symptom(run: str, trained: Trained) -> str | None:
    L = trained.train_losses
    m = trained.metrics
    first, last = sum(L[:5]) / 5, sum(L[-10:]) / 10
    if run == "healthy":
        if not (last < 0.5 * first and last > 0 and m["val_acc"] > m["majority_acc"] + 0.15):
            return (f"healthy run did not train: loss {first:.2f} -> {last:.2f}, val token acc "
                    f"{m['val_acc']:.3f} (majority tag {m['majority_acc']:.3f})")
        return None
    if run == "collate_sorts_tokens_not_tags":
        if m["val_acc"] < m["majority_acc"] + 0.05:
            return (f"CRF loss {first:.2f} -> {last:.2f} per sentence (a correct pairing reaches ~2); val token acc {m['val_acc']:.3f}, "
                    f"no better than tagging everything O ({m['majority_acc']:.3f})")
        return None
    if m["min_loss"] < 0:
        return (f"CRF loss negative and falling: {first:.2f} -> {last:.1f} over {len(L)} steps (an NLL cannot go "
                f"below 0); val token acc {m['val_acc']:.3f} vs majority tag {m['majority_acc']:.3f}")
    return None


def _setup(run: str) -> triage.Setup:
    train_b, val_b = data(0, run)
    model, opt = build(run, None, 0)
    return triage.Setup(model=model, optimizer=opt, loss_fn=make_loss_fn(run, None), batches=train_b,
                        val_batches=val_b, total_steps=TOTAL_STEPS)


def setup_healthy() -> triage.Setup:
    return _setup("healthy")


def setup_crf_loglik_not_negated() -> triage.Setup:
    return _setup("crf_loglik_not_negated")


def setup_collate_sorts_tokens_not_tags() -> triage.Setup:
    return _setup("collate_sorts_tokens_not_tags")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        t = time.perf_counter()
        tr = train(r, Path("/tmp"), 0)
        print(r, f"{time.perf_counter() - t:.1f}s", symptom(r, tr), tr.metrics,
              [round(x, 2) for x in tr.train_losses[::15]], [round(x, 2) for x in tr.val_losses])
