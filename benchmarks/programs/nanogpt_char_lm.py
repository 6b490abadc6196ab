"""A tiny character-level GPT trained the nanoGPT way.

Follows karpathy/nanoGPT `train.py` + `model.py` (read through the public source: the GPT module with
`c_attn`/`c_proj`/`c_fc` names and a `lm_head` tied to `wte`, `configure_optimizers` putting every >=2-D
parameter in a weight-decay group and biases/LayerNorm gains in a no-decay group, AdamW betas (0.9, 0.95),
`get_batch` drawing random windows from one long token array, the LR set by hand each iteration from
`get_lr(it)` (linear warmup, cosine decay to `min_lr` at `lr_decay_iters`), gradient accumulation with the
loss divided by `gradient_accumulation_steps`, `clip_grad_norm_(grad_clip)`, `estimate_loss()` on train and
val every `eval_interval`, and the checkpoint dict `{model, optimizer, model_args, iter_num, best_val_loss,
config}` written to `out_dir/ckpt.pt` with `always_save_checkpoint`). The text is made in code: sentences of
random draws from a small word list (a "shakespeare_char"-sized toy), split 90/10 into train and val.
The log of `estimate_loss` goes to `out_dir/log.jsonl` (where nanoGPT would send it to wandb).

Runs
- healthy: 30k characters of text, the baby-GPT config. Checkpoint mid-run (iter 140 of 200) while val loss
  still falls.
- overfitting: the same model on a 200-character text (the user's own small corpus, as with
  shakespeare_char where nanoGPT's own config says "we expect to overfit on this small dataset"), dropout 0.
  The model memorises the train windows: train loss keeps falling while val loss turns up. This is what
  karpathy/nanoGPT issue #493 ("Overfitting of the small GPU model": the val-loss minimum after 7 evals on
  Shakespeare) and #97 (val 3.75 against train 0.98) report. Root cause `overfitting` (the decider is the
  logged val curve turning up while train falls). Fix `more_data`: train on a 30x larger (6k characters) text. Competing:
  `dropout` (dropout 0 -> 0.1, the knob nanoGPT's shakespeare_char config reaches for), which slows the
  memorising a little but the val curve still turns up inside the run.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="nanogpt_char_lm",
    kind="lm",
    original="karpathy/nanoGPT train.py + model.py (shakespeare_char config)",
    runs={
        "healthy": Run(cause="healthy", story="Baby GPT on a 30k-character text; mid-run checkpoint, val loss still falling."),
        "overfitting": Run(
            cause="overfitting",
            story="Trained the baby GPT with dropout 0 on my own 200-character text; val loss bottomed out early "
                  "and climbed while the train loss kept dropping.",
            fix="more_data",
            competing=("dropout",),
        ),
    },
)

# ----------------------------------------------------------------------------- model (after model.py)


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head, self.n_embd, self.dropout = cfg.n_head, cfg.n_embd, cfg.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=LayerNorm(cfg.n_embd, cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:
            logits, loss = self.lm_head(x[:, [-1], :]), None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


# ----------------------------------------------------------------------------- data (a toy "prepare.py")

WORDS = ("the", "king", "queen", "lord", "sweet", "death", "love", "night", "fair", "blood", "thou", "art",
         "shall", "come", "speak", "heaven", "sword", "crown", "heart", "grief", "noble", "mine", "good",
         "hence", "away", "tears", "sleep", "honour", "gentle", "father", "mother", "friend")


def make_text(n_chars: int, seed: int) -> str:
    g = torch.Generator().manual_seed(1000 + seed)
    out, size = [], 0
    while size < n_chars:
        n = int(torch.randint(3, 9, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (n,), generator=g).tolist()
        s = " ".join(WORDS[i] for i in idx) + (".\n" if n % 2 else ",\n")
        out.append(s)
        size += len(s)
    return "".join(out)


def config_for(run: str, variant: str | None) -> dict:
    # train.py's globals, as the user's config file sets them
    cfg = dict(out_dir="out", eval_interval=20, eval_iters=10, always_save_checkpoint=True,
               gradient_accumulation_steps=2, batch_size=8, block_size=32,
               n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True,
               learning_rate=2e-3, max_iters=200, weight_decay=1e-1, beta1=0.9, beta2=0.95, grad_clip=1.0,
               decay_lr=True, warmup_iters=10, lr_decay_iters=200, min_lr=2e-4, train_chars=30000,
               ckpt_iter=140)
    if run == "overfitting":
        cfg.update(train_chars=200, ckpt_iter=200)
        if variant == "more_data":
            cfg["train_chars"] = 6000
        elif variant == "dropout":
            cfg["dropout"] = 0.1
    return cfg


def make_data(cfg: dict, seed: int):
    text = make_text(cfg["train_chars"], seed)
    val_text = make_text(6000, seed + 777)
    chars = sorted(set("".join(WORDS) + " .,\n"))
    stoi = {c: i for i, c in enumerate(chars)}
    train = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    val = torch.tensor([stoi[c] for c in val_text], dtype=torch.long)
    return train, val, len(chars)


def get_batch(data: torch.Tensor, cfg: dict, g: torch.Generator):
    bs, T = cfg["batch_size"], cfg["block_size"]
    ix = torch.randint(len(data) - T, (bs,), generator=g)
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    return x, y


def get_lr(it: int, cfg: dict) -> float:
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if it > cfg["lr_decay_iters"]:
        return cfg["min_lr"]
    ratio = (it - cfg["warmup_iters"]) / (cfg["lr_decay_iters"] - cfg["warmup_iters"])
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg["min_lr"] + coeff * (cfg["learning_rate"] - cfg["min_lr"])


def build(cfg: dict, vocab_size: int):
    model_args = dict(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"],
                      block_size=cfg["block_size"], bias=cfg["bias"], vocab_size=vocab_size, dropout=cfg["dropout"])
    model = GPT(GPTConfig(**model_args))
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    return model, optimizer, model_args


# ----------------------------------------------------------------------------- train.py's loop


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    cfg = config_for(run, variant)
    torch.manual_seed(1337 + seed)
    train_data, val_data, vocab = make_data(cfg, seed)
    model, optimizer, model_args = build(cfg, vocab)
    g = torch.Generator().manual_seed(seed)
    eg = torch.Generator().manual_seed(seed + 99)

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split, data in (("train", train_data), ("val", val_data)):
            losses = torch.zeros(cfg["eval_iters"])
            for k in range(cfg["eval_iters"]):
                X, Y = get_batch(data, cfg, eg)
                losses[k] = model(X, Y)[1].item()
            out[split] = losses.mean().item()
        model.train()
        return out

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "log.jsonl"
    log.write_text("")
    ckpt_path = out_dir / "ckpt.pt"
    train_losses, evals = [], []
    best_val_loss = 1e9
    gas = cfg["gradient_accumulation_steps"]
    X, Y = get_batch(train_data, cfg, g)
    iter_num = 0
    while True:
        lr = get_lr(iter_num, cfg) if cfg["decay_lr"] else cfg["learning_rate"]
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % cfg["eval_interval"] == 0:
            losses = estimate_loss()
            evals.append((iter_num, losses["train"], losses["val"]))
            with log.open("a") as f:
                f.write(json.dumps({"iter": iter_num, "train/loss": losses["train"], "val/loss": losses["val"],
                                    "lr": lr}) + "\n")
            if losses["val"] < best_val_loss or cfg["always_save_checkpoint"]:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > 0 and iter_num <= cfg["ckpt_iter"]:
                    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss,
                                "config": cfg}, ckpt_path)
        if iter_num >= cfg["ckpt_iter"]:
            break
        for micro_step in range(gas):
            logits, loss = model(X, Y)
            loss = loss / gas
            X, Y = get_batch(train_data, cfg, g)
            loss.backward()
        if cfg["grad_clip"] != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train_losses.append(loss.item() * gas)
        iter_num += 1
        if iter_num > cfg["max_iters"]:
            break
    return Trained(checkpoint=ckpt_path, train_losses=train_losses, val_losses=[e[2] for e in evals],
                   metrics={"evals": evals}, history=log)


def symptom(run: str, trained: Trained) -> str | None:
    evals = trained.metrics["evals"]
    vals = [v for _, _, v in evals]
    best = min(range(len(vals)), key=vals.__getitem__)
    it_b, tr_b, va_b = evals[best]
    it_e, tr_e, va_e = evals[-1]
    if va_e > 1.08 * va_b and tr_e < tr_b - 0.05:
        return (f"val loss {va_b:.3f} at iter {it_b} -> {va_e:.3f} at iter {it_e} while train loss "
                f"{tr_b:.3f} -> {tr_e:.3f}")
    if run == "healthy" and vals[-1] > 0.9 * vals[0]:
        return f"val loss {vals[0]:.3f} -> {vals[-1]:.3f}: did not learn"
    return None


# ----------------------------------------------------------------------------- triage entries


def _setup(run: str):
    import triage

    cfg = config_for(run, None)
    torch.manual_seed(1337)
    train_data, val_data, vocab = make_data(cfg, 0)
    model, optimizer, _ = build(cfg, vocab)
    g = torch.Generator().manual_seed(0)
    batches = [get_batch(train_data, cfg, g) for _ in range(48)]
    val_batches = [get_batch(val_data, cfg, g) for _ in range(10)]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: get_lr(it, cfg) / cfg["learning_rate"])
    gas = cfg["gradient_accumulation_steps"]
    state = {"micro": 0}

    def train_step(model, optimizer, batch):
        # train.py's inner loop: loss / gradient_accumulation_steps per micro-batch, clip and step every gas-th
        X, Y = batch
        _, loss = model(X, Y)
        (loss / gas).backward()
        state["micro"] += 1
        if state["micro"] % gas == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss

    return triage.Setup(
        model=model,
        optimizer=optimizer,
        loss_fn=lambda model, batch: model(batch[0], batch[1])[1],
        batches=batches,
        val_batches=val_batches,
        scheduler=scheduler,
        grad_clip=cfg["grad_clip"],
        train_step=train_step,
        total_steps=cfg["max_iters"],
    )


def setup_healthy():
    return _setup("healthy")


def setup_overfitting():
    return _setup("overfitting")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    run = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    with tempfile.TemporaryDirectory() as d:
        t = train(run, Path(d))
        print(t.metrics["evals"], symptom(run, t))
