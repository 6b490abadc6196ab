"""TransE knowledge-graph embeddings: margin ranking loss against corrupted triples, entities renormalised.

What it does: entity and relation embeddings (nn.Embedding, init uniform(+-6/sqrt(dim)), relations L1-normalised
at init, as the TransE paper's Algorithm 1 and mklimasz/TransE-PyTorch do); the distance of a triple is
||h + r - t||_1; each step the entity vectors are first renormalised to unit L2 norm (the paper's line 5,
done at the top of forward() as mklimasz's model does), then every positive triple of the batch gets a
corrupted twin (head or tail replaced by a random entity, chosen by a coin flip) and the loss is
nn.MarginRankingLoss(margin=1) on (positive distance, negative distance, target -1), its default mean over
the batch. Optimizer: plain SGD, no scheduler, checkpoints a dict {"model", "optimizer", "epoch", "step",
"best_score"} like mklimasz's storage.save_checkpoint. Validation: raw hits@10 (head and tail prediction over
all entities) on held-out triples, and the same margin loss on them.

The knowledge graph is made in code: 300 entities with latent positions in R^6 and 10 relations that are
translations in that space; the tail of (h, r) is the entity nearest to z_h + d_r, so the graph has the
structure TransE models. 2,700 training triples (42 batches of 64), 300 held out.

The public original it follows: mklimasz/TransE-PyTorch (model.py: TransE with entities_emb / relations_emb,
the renormalisation in forward, MarginRankingLoss; main.py: the loop corrupting heads or tails, SGD, hits@10
validation every few epochs, storage.save_checkpoint), read with the search tool, and the TransE paper (Bordes
et al. 2013, Algorithm 1: its loss is the SUM of hinge terms over the minibatch, learning rate 0.01 among
{0.001, 0.01, 0.1}).

A margin loss reaches 0 on every triple whose negative is farther than the positive by the margin: that is
normal, and late in the healthy run most hinge terms of a batch are 0 (batch means down to ~0.05); its
checkpoint (step 168 of 840) is taken while the loss and hits@10 are still improving.

Runs:
- healthy: SGD lr 1.0 on the mean-reduced hinge (the paper's lr 0.01 on a sum over a batch of 64 is an lr of
  0.64 on the mean); loss ~1.0 -> ~0.15, val hits@10 ~0.03 -> ~0.4 (raw, on (head, relation) pairs never seen in
  training: the ceiling of this graph).
- paper_lr_on_mean_loss: the user took the paper's (and mklimasz's default) lr = 0.01 with
  nn.MarginRankingLoss's default reduction='mean'. The paper's 0.01 multiplies the gradient of a loss SUMMED
  over the minibatch; averaged, every embedding row moves ~64x less, and with unit-norm entities the loss sits
  at ~1.0 (the margin) for the whole run (1.10 -> 0.90 in 840 steps), val hits@10 stays near chance
  (0.04-0.08). Users meet this as "TransE loss not decreasing" (wuxiyu/transE issue #15: the loss does not
  fall until the update is scaled properly; mana-ysh/knowledge-graph-embeddings issue #5 "the loss is not
  converging"). Root cause `lr_too_low`: lr x 10 and more makes progress (the fix variant `lr_x100`: 1.0, the
  healthy run's). The competing fix a user tries first for a stuck margin loss, a larger margin (`margin_2`),
  leaves it stuck.
- reciprocals_split_after_augmenting: the user adds reciprocal relations (for every fact (h, r, t) also
  (t, r + 10, h), the usual augmentation of knowledge-graph training) and only then splits the triples 90/10
  into train and validation; a test set of 300 facts (both directions) was held out before. Most validation
  triples then have their reciprocal in train, and TransE learns r_inv = -r, so a validation triple scores as
  its memorised twin: validation hits@10 ~0.22 and margin loss ~0.54 against ~0.09 and ~0.92 on the test
  facts. This graph has half its facts idiosyncratic (a random tail, memorisable only), as real graphs do,
  which is what memorisation buys. This is the test leakage through inverse relations that made WN18 and
  FB15k unusable for evaluation (Toutanova & Chen 2015; Dettmers et al. 2018, the ConvE paper, which built
  WN18RR and showed a rule-based inverse model scoring near the state of the art). Root cause
  `train_val_overlap`: the validation set holds (reciprocal) copies of training facts that score better than
  the rest; the fix splits the facts before adding reciprocals (variant `split_before_augmenting`): validation
  then matches test. The competing fix for "validation and test disagree", a smaller model (`dim_16`),
  leaves the gap. Checkpoint at epoch 10 (step 750 of 1,500), once validation has pulled away.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

import triage

PROGRAM = Program(
    name="transe_knowledge_graph",
    kind="knowledge-graph embeddings (TransE)",
    original="mklimasz/TransE-PyTorch (model.py TransE, main.py training loop) after Bordes et al. 2013",
    runs={
        "healthy": Run(
            cause="healthy",
            story="TransE with per-step entity renormalisation, SGD lr 1.0 on the mean margin loss; loss and "
                  "hits@10 still improving at the step-168 checkpoint; late batches down to ~0.05, most hinge "
                  "terms at 0.",
        ),
        "paper_lr_on_mean_loss": Run(
            cause="lr_too_low",
            story="I used the paper's lr 0.01 with nn.MarginRankingLoss (mean over the batch, the paper sums). "
                  "The loss stayed at the margin, ~1.0, for 20 epochs and hits@10 stayed near chance; a "
                  "larger margin did not help.",
            fix="lr_x100",
            competing=("margin_2",),
        ),
        "reciprocals_split_after_augmenting": Run(
            cause="train_val_overlap",
            story="I added a reciprocal relation for every fact, (t, r_inv, h) for (h, r, t), and then split the "
                  "triples 90/10 into train and validation. Validation hits@10 and loss came out far better than "
                  "on the held-out test triples; a smaller model (dim 16) did not close the gap.",
            fix="split_before_augmenting",
            competing=("dim_16",),
        ),
    },
)

N_ENT, N_REL, LATENT = 300, 10, 6
DIM = 32
BATCH = 64
EPOCHS = 20
VAL_EVERY = 2               # epochs
CKPT_EPOCH = 4
LEAK_CKPT_EPOCH = 10        # the reciprocal run's checkpoint: once validation has pulled away from test
HEALTHY_LR = 1.0
PAPER_LR = 0.01
IDIOSYNCRATIC = 0.5         # the reciprocal run's graph: the share of facts with a tail off the geometry


def graph(seed: int):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N_ENT, LATENT, generator=g)
    d = torch.randn(N_REL, LATENT, generator=g) * 1.2
    triples = []
    for r in range(N_REL):
        target = z + d[r]
        dist = torch.cdist(target, z)
        dist.fill_diagonal_(float("inf"))
        tails = dist.argmin(1)
        triples += [(h, r, int(tails[h])) for h in range(N_ENT)]
    rng = random.Random(seed)
    rng.shuffle(triples)
    t = torch.tensor(triples)
    return t[:2700], t[2700:]


def graph_with_reciprocals(seed: int, split_after_augmenting: bool):
    """The same graph with a reciprocal relation r + N_REL for every relation: (t, r + N_REL, h) for (h, r, t).

    A test set of 300 base triples (both directions) is held out first. The rest is split 90/10 into train and
    validation: after the reciprocals were added (the fault: a validation triple's reciprocal is usually in
    train) or before (each base triple and its reciprocal land on the same side)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N_ENT, LATENT, generator=g)
    d = torch.randn(N_REL, LATENT, generator=g) * 1.2
    base = []
    rng = random.Random(seed)
    for r in range(N_REL):
        dist = torch.cdist(z + d[r], z)
        dist.fill_diagonal_(float("inf"))
        tails = dist.argmin(1)
        # half the facts follow the geometry, half are idiosyncratic (a tail that only memory can give)
        base += [(h, r, int(tails[h]) if rng.random() < 1 - IDIOSYNCRATIC else rng.randrange(N_ENT))
                 for h in range(N_ENT)]
    rng.shuffle(base)

    def both(ts):
        return ts + [(t, r + N_REL, h) for h, r, t in ts]

    test, rest = both(base[:300]), base[300:]
    if split_after_augmenting:
        rest = both(rest)
        rng.shuffle(rest)
        n_val = len(rest) // 10
        val, train = rest[:n_val], rest[n_val:]
    else:
        n_val = len(rest) // 10
        val, train = both(rest[:n_val]), both(rest[n_val:])
        rng.shuffle(train)
    return torch.tensor(train), torch.tensor(val), torch.tensor(test)


def load_data(run: str, variant: str | None, seed: int):
    """(train, validation, honest test or None, number of relations) of a run."""
    if run == "reciprocals_split_after_augmenting":
        tr, va, te = graph_with_reciprocals(seed, split_after_augmenting=variant != "split_before_augmenting")
        return tr, va, te, 2 * N_REL
    tr, va = graph(seed)
    return tr, va, None, N_REL


def train_batches(train_triples):
    return [train_triples[i:i + BATCH] for i in range(0, len(train_triples) - BATCH + 1, BATCH)]


class TransE(nn.Module):
    def __init__(self, entity_count=N_ENT, relation_count=N_REL, norm=1, dim=DIM, margin=1.0):
        super().__init__()
        self.entity_count, self.norm, self.dim = entity_count, norm, dim
        r = 6 / np.sqrt(dim)
        self.entities_emb = nn.Embedding(entity_count, dim)
        self.entities_emb.weight.data.uniform_(-r, r)
        self.relations_emb = nn.Embedding(relation_count, dim)
        self.relations_emb.weight.data.uniform_(-r, r)
        self.relations_emb.weight.data.div_(self.relations_emb.weight.data.norm(p=1, dim=1, keepdim=True))
        self.criterion = nn.MarginRankingLoss(margin=margin)

    def forward(self, positive_triplets, negative_triplets):
        # the paper's constraint: entity vectors renormalised to unit L2 norm at every step
        self.entities_emb.weight.data.div_(self.entities_emb.weight.data.norm(p=2, dim=1, keepdim=True))
        pos = self._distance(positive_triplets)
        neg = self._distance(negative_triplets)
        target = torch.full_like(pos, -1.0)
        return self.criterion(pos, neg, target)

    def _distance(self, triplets):
        h = self.entities_emb(triplets[:, 0])
        r = self.relations_emb(triplets[:, 1])
        t = self.entities_emb(triplets[:, 2])
        return (h + r - t).norm(p=self.norm, dim=1)

    def predict(self, triplets):
        return self._distance(triplets)


def corrupt(triples, n_ent=N_ENT):
    """Replace the head or the tail (a coin flip per triple) with a random entity, as the original's loop."""
    heads, rels, tails = triples[:, 0].clone(), triples[:, 1], triples[:, 2].clone()
    flip = torch.randint(high=2, size=heads.shape) == 0
    rand = torch.randint(high=n_ent, size=heads.shape)
    heads = torch.where(flip, rand, heads)
    tails = torch.where(flip, tails, rand)
    return torch.stack((heads, rels, tails), dim=1)


def loss_fn(model, batch):
    return model(batch, corrupt(batch))


def build(run: str, variant: str | None, seed: int):
    torch.manual_seed(seed)
    margin = 2.0 if variant == "margin_2" else 1.0
    n_rel = 2 * N_REL if run == "reciprocals_split_after_augmenting" else N_REL
    model = TransE(relation_count=n_rel, margin=margin, dim=DIM // 2 if variant == "dim_16" else DIM)
    if run == "paper_lr_on_mean_loss":
        lr = PAPER_LR * (100 if variant == "lr_x100" else 1)
    else:
        lr = HEALTHY_LR
    return model, torch.optim.SGD(model.parameters(), lr=lr)


@torch.no_grad()
def hits_at_10(model, triples):
    ents = model.entities_emb.weight
    ents = ents / ents.norm(dim=1, keepdim=True)
    h, r, t = ents[triples[:, 0]], model.relations_emb(triples[:, 1]), ents[triples[:, 2]]
    tail_d = (h + r).unsqueeze(1).sub(ents.unsqueeze(0)).abs().sum(-1)           # (n, N_ENT)
    head_d = ents.unsqueeze(0).add(r.unsqueeze(1)).sub(t.unsqueeze(1)).abs().sum(-1)
    tail_rank = (tail_d < tail_d.gather(1, triples[:, 2:3])).sum(1)
    head_rank = (head_d < head_d.gather(1, triples[:, 0:1])).sum(1)
    return float(torch.cat([tail_rank < 10, head_rank < 10]).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    tr, va, te, _ = load_data(run, variant, seed)
    batches = train_batches(tr)
    model, opt = build(run, variant, seed)
    ckpt = out_dir / "checkpoint.tar"
    losses, val_losses, hits = [], [], [hits_at_10(model, va)]
    step, best = 0, 0.0
    order_g = torch.Generator().manual_seed(seed + 1)
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for i in torch.randperm(len(batches), generator=order_g).tolist():
            opt.zero_grad()
            loss = loss_fn(model, batches[i])
            loss.backward()
            opt.step()
            step += 1
            losses.append(loss.item())
        if epoch % VAL_EVERY == 0:
            model.eval()
            with torch.no_grad():
                val_losses.append(float(loss_fn(model, va)))
            hits.append(hits_at_10(model, va))
            best = max(best, hits[-1])
        if epoch == (LEAK_CKPT_EPOCH if run == "reciprocals_split_after_augmenting" else CKPT_EPOCH):
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "step": step,
                        "best_score": best}, ckpt)
    metrics = {"hits10_init": hits[0], "hits10": hits[-1], "hits10_ckpt": hits[CKPT_EPOCH // VAL_EVERY]}
    if te is not None:
        metrics["test_hits10"] = hits_at_10(model, te)
        with torch.no_grad():
            torch.manual_seed(seed + 7)
            metrics["test_loss"] = float(loss_fn(model, te))
            torch.manual_seed(seed + 7)
            metrics["val_loss"] = float(loss_fn(model, va))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    L = trained.train_losses
    m = trained.metrics
    first, last = float(np.mean(L[:20])), float(np.mean(L[-42:]))
    if run == "healthy":
        if not (last < 0.5 * first and m["hits10"] > 0.25):
            return f"healthy run did not train: loss {first:.3f} -> {last:.3f}, hits@10 {m['hits10']:.3f}"
        return None
    if run == "reciprocals_split_after_augmenting":
        if m["hits10"] > 1.6 * m["test_hits10"] and m["val_loss"] < 0.8 * m["test_loss"]:
            return (f"validation suspiciously good: val hits@10 {m['hits10']:.3f} and margin loss {m['val_loss']:.3f} "
                    f"while held-out test triples score hits@10 {m['test_hits10']:.3f}, loss {m['test_loss']:.3f}")
        return None
    if last > 0.75 * first and m["hits10"] < 0.15:
        return (f"margin loss barely moves: {first:.3f} -> {last:.3f} over {len(L)} steps; val hits@10 "
                f"{m['hits10_init']:.3f} -> {m['hits10']:.3f} (chance 0.033)")
    return None


def _setup(run: str) -> triage.Setup:
    tr, va, _, _ = load_data(run, None, 0)
    model, opt = build(run, None, 0)
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn, batches=train_batches(tr),
                        val_batches=[va[i:i + BATCH] for i in range(0, len(va), BATCH)],
                        total_steps=EPOCHS * len(train_batches(tr)))


def setup_healthy() -> triage.Setup:
    return _setup("healthy")


def setup_paper_lr_on_mean_loss() -> triage.Setup:
    return _setup("paper_lr_on_mean_loss")


def setup_reciprocals_split_after_augmenting() -> triage.Setup:
    return _setup("reciprocals_split_after_augmenting")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        vs = [None] if r == "healthy" else [None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing]
        for v in vs:
            t = time.perf_counter()
            trd = train(r, Path("/tmp/h3"), 0, v)
            print(r, v, f"{time.perf_counter() - t:.1f}s", symptom(r, trd), trd.metrics,
                  [round(x, 3) for x in trd.train_losses[::42]], [round(x, 3) for x in trd.val_losses])
