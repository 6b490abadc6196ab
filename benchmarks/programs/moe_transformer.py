"""A small sparse mixture-of-experts transformer language model with a load-balancing loss.

Written after the public top-k routing MoE language models: HF transformers' `modeling_mixtral.py`
(`MixtralSparseMoeBlock`: a linear router, softmax over the expert logits, `topk` of 2, the top-k weights
renormalised, each expert a gated-free MLP applied to the tokens routed to it, combined with `index_add_`;
and `load_balancing_loss_func`: num_experts x sum over experts of (fraction of tokens dispatched to it) x
(mean router probability), added to the LM loss times `router_aux_loss_coef`) and the Switch Transformer
recipe (aux coefficient 1e-2), and the "makeMoE" from-scratch notebooks (a char-level decoder with MoE
blocks replacing the feed-forward). Here: 2 decoder blocks, 4 experts, top-2, AdamW with a decay/no-decay
split, linear warmup then constant LR (`LambdaLR` stepped every iteration), clip 1.0, a step-keyed
checkpoint `{"model", "optimizer", "scheduler", "step", "history"}` every 25 steps. Data made in code: a
sparse Markov chain over 48 tokens in windows of 32.

The total loss is cross-entropy + 0.01 x aux, and the aux term is at least 1 per layer at perfect
balance, so the loss's floor is ~0.02, not 0 (the healthy run is a run whose loss cannot reach 0).

Runs
- healthy: lr 2e-3. Checkpoint at step 75 of 100, still improving.
- lr_too_high: the user passed `--lr 0.3`, an SGD-sized LR, to this AdamW loop (the makeMoE-style scripts take
  the LR from the command line). Routers swing, expert loads flip, the loss climbs back to the unigram level
  and sits there; MoE training instability at high LR is the well-known failure of sparse models (Switch
  Transformer paper, section 2.4, "Improved training stability"; no user issue was looked up).
  Root cause `lr_too_high`: the lower LR removes it. Fix `lower_lr` (2e-3). Competing `more_aux`: the aux
  coefficient raised 1e-2 -> 1e-1 (what users reach for when they see the expert loads flip), which leaves it.
  Checkpoint: the last periodic one (step 100) once the loss has sat at that level for 80 steps.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="moe_transformer",
    kind="moe",
    original="huggingface/transformers models/mixtral/modeling_mixtral.py (MixtralSparseMoeBlock, load_balancing_loss_func) + makeMoE",
    runs={
        "healthy": Run(cause="healthy", story="Top-2 of 4 experts MoE LM at lr 2e-3; checkpoint at step 75 of 100."),
        "lr_too_high": Run(
            cause="lr_too_high",
            story="Ran the MoE LM with --lr 0.3; the loss jumped up, came back down only to the unigram "
                  "level and sits there with the expert loads flipping.",
            fix="lower_lr",
            competing=("more_aux",),
        ),
    },
)

VOCAB, BLOCK = 48, 32


class Expert(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1 = nn.Linear(d, 2 * d)
        self.w2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class SparseMoeBlock(nn.Module):
    def __init__(self, d, num_experts=4, top_k=2):
        super().__init__()
        self.gate = nn.Linear(d, num_experts, bias=False)
        self.experts = nn.ModuleList([Expert(d) for _ in range(num_experts)])
        self.num_experts, self.top_k = num_experts, top_k

    def forward(self, x):
        B, T, C = x.shape
        h = x.reshape(-1, C)
        router_logits = self.gate(h)
        routing_weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        topw, selected = torch.topk(routing_weights, self.top_k, dim=-1)
        topw = topw / topw.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(h)
        mask = F.one_hot(selected, num_classes=self.num_experts).permute(2, 1, 0)  # (E, k, N)
        for e in range(self.num_experts):
            idx, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            y = self.experts[e](h[tok]) * topw[tok, idx, None]
            out.index_add_(0, tok, y)
        # load balancing (Switch / Mixtral): E * sum_e f_e * P_e
        dispatch = F.one_hot(selected, self.num_experts).float().sum(1).mean(0) / self.top_k
        prob = routing_weights.mean(0)
        aux = self.num_experts * (dispatch * prob).sum()
        return out.view(B, T, C), aux, dispatch


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.moe = SparseMoeBlock(d)

    def forward(self, x, causal):
        a = self.ln1(x)
        x = x + self.attn(a, a, a, attn_mask=causal, need_weights=False)[0]
        m, aux, load = self.moe(self.ln2(x))
        return x + m, aux, load


class MoELM(nn.Module):
    def __init__(self, d=48, n_head=4, n_layer=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(BLOCK, d)
        self.blocks = nn.ModuleList([Block(d, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=idx.device), 1)
        aux_total, loads = 0.0, []
        for b in self.blocks:
            x, aux, load = b(x, causal)
            aux_total = aux_total + aux
            loads.append(load)
        self.last_loads = loads
        return self.head(self.ln_f(x)), aux_total


def lm_loss(model, batch, aux_coef):
    x, y = batch
    logits, aux = model(x)
    return F.cross_entropy(logits.view(-1, VOCAB), y.view(-1)) + aux_coef * aux


# ----------------------------------------------------------------------------- data


def make_stream(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(777)
    succ = torch.randint(0, VOCAB, (VOCAB, 2), generator=g)
    gs = torch.Generator().manual_seed(seed)
    out = torch.empty(n, dtype=torch.long)
    w = 0
    r = torch.rand(n, generator=gs)
    jumps = torch.randint(0, VOCAB, (n,), generator=gs)
    for i in range(n):
        out[i] = w
        if r[i] < 0.1:
            w = int(jumps[i])
        else:
            w = int(succ[w, 0 if r[i] < 0.7 else 1])
    return out


def batches_from(stream, n_batches, bs, g):
    out = []
    for _ in range(n_batches):
        ix = torch.randint(0, len(stream) - BLOCK - 1, (bs,), generator=g)
        x = torch.stack([stream[i:i + BLOCK] for i in ix])
        y = torch.stack([stream[i + 1:i + BLOCK + 1] for i in ix])
        out.append((x, y))
    return out


def hparams(run: str, variant: str | None) -> dict:
    hp = dict(lr=2e-3, aux_coef=1e-2, weight_decay=0.1, warmup=10, steps=100, ckpt_step=75, bs=12, clip=1.0,
              save_every=25)
    if run == "lr_too_high":
        hp.update(lr=3e-1, ckpt_step=100)
        if variant == "lower_lr":
            hp["lr"] = 2e-3
        elif variant == "more_aux":
            hp["aux_coef"] = 1e-1
    return hp


def build(hp):
    model = MoELM()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=hp["lr"], betas=(0.9, 0.95))
    warm = hp["warmup"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    return model, opt, sched


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    hp = hparams(run, variant)
    torch.manual_seed(seed)
    stream = make_stream(30000, seed)
    g = torch.Generator().manual_seed(seed)
    model, opt, sched = build(hp)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "ckpt.pt"
    losses = []
    model.train()
    for step in range(1, hp["steps"] + 1):
        x, y = batches_from(stream, 1, hp["bs"], g)[0]
        loss = lm_loss(model, (x, y), hp["aux_coef"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % hp["save_every"] == 0 and step <= hp["ckpt_step"] and math.isfinite(loss.item()):
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                        "step": step, "history": {"loss": list(losses)}}, ckpt)
        if step >= hp["ckpt_step"]:
            break
    return Trained(checkpoint=ckpt, train_losses=losses)


def symptom(run: str, trained: Trained) -> str | None:
    tl = trained.train_losses
    if not all(math.isfinite(v) for v in tl):
        bad = next(i for i, v in enumerate(tl) if not math.isfinite(v))
        return f"loss went non-finite at step {bad + 1}"
    low = min(sum(tl[i:i + 5]) / 5 for i in range(len(tl) - 4))
    end = sum(tl[-20:]) / 20
    if end > 2.0:
        return f"loss {tl[0]:.2f} -> best 5-step mean {low:.2f} -> {end:.2f} over the last 20 of {len(tl)} steps (the same model at lr 2e-3 is below 1.7 by step 75)"
    return None


def _setup(run: str):
    import triage

    hp = hparams(run, None)
    torch.manual_seed(0)
    model, opt, sched = build(hp)
    stream = make_stream(30000, 0)
    g = torch.Generator().manual_seed(0)
    batches = batches_from(stream, 48, hp["bs"], g)
    return triage.Setup(
        model=model,
        optimizer=opt,
        scheduler=sched,
        loss_fn=lambda model, batch: lm_loss(model, batch, hp["aux_coef"]),
        batches=batches,
        grad_clip=hp["clip"],
        total_steps=hp["steps"],
    )


def setup_healthy():
    return _setup("healthy")


def setup_lr_too_high():
    return _setup("lr_too_high")
