"""FT-Transformer on a table of numerical and categorical columns, 3-class target.

Written after rtdl's FT-Transformer (Gorishniy et al. 2021; rtdl `FTTransformer`, `FeatureTokenizer`,
`CLSToken`, `Transformer` with pre-norm blocks whose first block skips the attention norm, ReGLU feed-forward,
a head of LayerNorm -> ReLU -> Linear on the [CLS] token) and its recipe: `AdamW` with the parameters split
into two groups, weight decay on the transformer's weight matrices and none on the feature tokenizer, the
[CLS] token, LayerNorms and biases (rtdl's `make_parameter_groups` / `optim_param_groups`), a plain epoch loop
with cross-entropy, validation each epoch. A batch is the pair of inputs rtdl's model takes plus the target,
as a dict: `{"x_num": float (B, 8), "x_cat": long (B, 3), "y": long (B,)}`. Checkpoint: `{"model",
"optimizer", "epoch", "step"}` written at the end of an epoch.

Runs
- healthy: lr 3e-4, weight decay 1e-5 (the paper's defaults region), 8 epochs; checkpoint after epoch 4.
- lr_too_high: the owner reused lr=0.1 from the SGD config of an MLP baseline in the same project (an LR
  meant for SGD handed to AdamW is a classic slip). The FT-Transformer paper tunes the LR in [1e-5, 1e-3];
  at 0.1 with no warmup the attention and LayerNorm'd tokens are thrown around every step: the loss never
  leaves the neighbourhood of the class-frequency loss (~1.0 against 0.5 at 3e-4) and validation accuracy
  stays near 0.5. Root cause `lr_too_high` (the fix lowering the LR to 3e-4 removes it). Competing fix a user tries
  first: clipping the gradient norm at 1.0 (`clip_1`), which leaves it (AdamW's step does not scale with the
  gradient's norm).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
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
    name="ft_transformer_tabular",
    kind="tabular",
    original="rtdl (Yandex research): rtdl/modules.py FTTransformer + make_parameter_groups; paper's bin/ft_transformer.py",
    runs={
        "healthy": Run(cause="healthy", story="FT-Transformer, AdamW 3e-4 with no-decay groups; checkpoint at "
                       "epoch 4 of 8 while validation loss is still falling."),
        "lr_too_high": Run(
            cause="lr_too_high",
            story="Reused lr=0.1 from my SGD baseline's config; the loss hovers near the class-frequency "
                  "loss for all 8 epochs.",
            fix="lr_3e-4", competing=("clip_1",)),
    },
)

N_NUM, CARDS, N_CLASSES = 8, (4, 6, 3), 3
N_TRAIN, N_VALID, BS, EPOCHS = 2048, 512, 128, 8
D_TOKEN, N_BLOCKS, N_HEADS = 32, 2, 4


class FeatureTokenizer(nn.Module):
    def __init__(self, n_num, cards, d):
        super().__init__()
        s = 1 / math.sqrt(d)
        self.num_weight = nn.Parameter(torch.empty(n_num, d).uniform_(-s, s))
        self.num_bias = nn.Parameter(torch.empty(n_num, d).uniform_(-s, s))
        self.register_buffer("cat_offsets", torch.tensor((0,) + tuple(np.cumsum(cards)[:-1])), persistent=False)
        self.cat_embeddings = nn.Embedding(sum(cards), d)
        nn.init.uniform_(self.cat_embeddings.weight, -s, s)
        self.cat_bias = nn.Parameter(torch.empty(len(cards), d).uniform_(-s, s))

    def forward(self, x_num, x_cat):
        num = self.num_weight[None] * x_num[..., None] + self.num_bias[None]
        cat = self.cat_embeddings(x_cat + self.cat_offsets[None]) + self.cat_bias[None]
        return torch.cat([num, cat], 1)


class CLSToken(nn.Module):
    def __init__(self, d):
        super().__init__()
        s = 1 / math.sqrt(d)
        self.weight = nn.Parameter(torch.empty(d).uniform_(-s, s))

    def forward(self, x):
        return torch.cat([x, self.weight.view(1, 1, -1).expand(len(x), 1, -1)], 1)


class ReGLU(nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return a * F.relu(b)


class Block(nn.Module):
    def __init__(self, d, heads, d_ffn, first):
        super().__init__()
        self.attention_norm = nn.Identity() if first else nn.LayerNorm(d)
        self.attention = nn.MultiheadAttention(d, heads, dropout=0.2, batch_first=True)
        self.ffn_norm = nn.LayerNorm(d)
        self.linear_first = nn.Linear(d, 2 * d_ffn)
        self.linear_second = nn.Linear(d_ffn, d)
        self.act = ReGLU()
        self.ffn_dropout = nn.Dropout(0.1)

    def forward(self, x):
        h = self.attention_norm(x)
        h, _ = self.attention(h, h, h, need_weights=False)
        x = x + h
        h = self.linear_second(self.ffn_dropout(self.act(self.linear_first(self.ffn_norm(x)))))
        return x + h


class FTTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.feature_tokenizer = FeatureTokenizer(N_NUM, CARDS, D_TOKEN)
        self.cls_token = CLSToken(D_TOKEN)
        d_ffn = int(D_TOKEN * 4 / 3)
        self.blocks = nn.ModuleList([Block(D_TOKEN, N_HEADS, d_ffn, i == 0) for i in range(N_BLOCKS)])
        self.head_norm = nn.LayerNorm(D_TOKEN)
        self.head = nn.Linear(D_TOKEN, N_CLASSES)

    def forward(self, x_num, x_cat):
        x = self.cls_token(self.feature_tokenizer(x_num, x_cat))
        for block in self.blocks:
            x = block(x)
        return self.head(F.relu(self.head_norm(x[:, -1])))


def make_parameter_groups(model, weight_decay):
    no_decay = ("feature_tokenizer", "cls_token", "norm", ".bias")
    decay, nodecay = [], []
    for name, p in model.named_parameters():
        (nodecay if any(k in name for k in no_decay) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]


def make_data(seed):
    rng = np.random.default_rng(2000 + seed)
    n = N_TRAIN + N_VALID
    x_num = rng.normal(size=(n, N_NUM)).astype(np.float32)
    x_cat = np.stack([rng.integers(0, c, n) for c in CARDS], 1)
    w = rng.normal(size=(N_NUM, N_CLASSES))
    cat_eff = [rng.normal(0, 1.0, (c, N_CLASSES)) for c in CARDS]
    logits = np.tanh(x_num) @ w + 0.7 * (x_num[:, :1] * x_num[:, 1:2])
    logits = logits + sum(e[x_cat[:, i]] for i, e in enumerate(cat_eff))
    y = (logits + rng.gumbel(size=logits.shape) * 0.7).argmax(1)
    split = lambda a, dt: (torch.tensor(a[:N_TRAIN], dtype=dt), torch.tensor(a[N_TRAIN:], dtype=dt))
    (xn_tr, xn_va), (xc_tr, xc_va), (y_tr, y_va) = (split(x_num, torch.float32), split(x_cat, torch.long),
                                                    split(y, torch.long))
    return {"x_num": xn_tr, "x_cat": xc_tr, "y": y_tr}, {"x_num": xn_va, "x_cat": xc_va, "y": y_va}


def loader(ds, bs, shuffle, seed):
    n = len(ds["y"])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    return [{k: v[order[i:i + bs]] for k, v in ds.items()} for i in range(0, n, bs)]


def loss_fn(model, batch):
    return F.cross_entropy(model(batch["x_num"], batch["x_cat"]), batch["y"])


def build(seed, run, variant):
    train_ds, valid_ds = make_data(seed)
    model = FTTransformer()
    lr = 1e-1 if run == "lr_too_high" and variant != "lr_3e-4" else 3e-4
    opt = torch.optim.AdamW(make_parameter_groups(model, 1e-5), lr=lr)
    clip = 1.0 if variant == "clip_1" else None
    return model, opt, clip, train_ds, valid_ds


@torch.no_grad()
def evaluate(model, valid_ds):
    model.eval()
    logits = model(valid_ds["x_num"], valid_ds["x_cat"])
    model.train()
    return float(F.cross_entropy(logits, valid_ds["y"])), float((logits.argmax(1) == valid_ds["y"]).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, opt, clip, train_ds, valid_ds = build(seed, run, variant)
    out_dir = Path(out_dir)
    ckpt = out_dir / "checkpoint.pt"
    ckpt_epoch = 4 if run == "healthy" else EPOCHS
    losses, vls, accs, step = [], [], [], 0
    for epoch in range(EPOCHS):
        for batch in loader(train_ds, BS, True, seed * 1000 + epoch):
            opt.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            step += 1
            losses.append(loss.item())
        vl, acc = evaluate(model, valid_ds)
        vls.append(vl)
        accs.append(acc)
        if epoch + 1 == ckpt_epoch:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1,
                        "step": step}, ckpt)
    prior = torch.bincount(valid_ds["y"], minlength=N_CLASSES).float() / len(valid_ds["y"])
    chance = float(-(prior * prior.log()).sum())
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vls,
                   metrics={"val_loss": vls[-1], "best_val_loss": min(vls), "val_acc": accs[-1], "chance": chance})


def symptom(run: str, trained: Trained) -> str | None:
    vl, chance, acc = trained.metrics["val_loss"], trained.metrics["chance"], trained.metrics["val_acc"]
    tl = trained.train_losses
    last = float(np.mean(tl[-20:]))
    if last > 0.75 * chance:
        return (f"train loss {np.mean(tl[:10]):.3f} -> {last:.3f} (class-frequency loss {chance:.3f}); "
                f"val loss {vl:.3f}, val accuracy {acc:.3f} after {len(trained.val_losses)} epochs")
    return None


def _setup(run):
    import triage

    model, opt, clip, train_ds, valid_ds = build(0, run, None)
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn,
                        batches=[b for e in (11, 12, 13) for b in loader(train_ds, BS, True, e)],  # 3 epochs: 48 batches
                        val_batches=loader(valid_ds, 256, False, 0),
                        grad_clip=clip, total_steps=EPOCHS * math.ceil(N_TRAIN / BS))


def setup_healthy():
    return _setup("healthy")


def setup_lr_too_high():
    return _setup("lr_too_high")
