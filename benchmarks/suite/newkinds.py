"""The held-out kinds of run added for issues 20 and 21 (measured blind): three heads/losses the suite
never had (multi-label BCE, Huber regression, label-smoothed cross-entropy), a language model that
computes its own loss (`model(**batch).loss`, -100 ignored labels, padded sequences), and a LoRA
fine-tune of a small GPT-2 built from a config (peft; no download), whose base is pretrained in code.

Data helpers return example tensors like `suite.data`'s; token families are turned into dict batches
({"input_ids", "attention_mask", "labels"}) after the snapshot is cut (`as_dict_batches`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from suite import data
from suite.config import ModelConfig

IGNORE = -100          # the label Hugging Face-style losses ignore
ATTRIBUTES = 4         # multilabel: even, >= 5, prime, has a closed loop


# --- data -------------------------------------------------------------------------------------------

def digit_attributes(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as 64-vectors with 4 binary attributes each (N, 4) floats: even, >= 5, prime, has a
    closed loop (0, 6, 8, 9). Several can be on at once: a multi-label target."""
    x, y, _ = data.digits_vectors(seed)
    attributes = torch.stack([y % 2 == 0, y >= 5, (y == 2) | (y == 3) | (y == 5) | (y == 7),
                              (y == 0) | (y == 6) | (y == 8) | (y == 9)], 1).float()
    return x, attributes


def digits_pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _ = data.digits_vectors(seed)
    return x, y


DIALECT = (0.5, 2.0, 1.2)  # the fine-tune's language: the same successors, the likeliest one changed


@functools.lru_cache(maxsize=8)
def padded_text(seed: int, dialect: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The Markov language (suite.data.markov_text; with `dialect`, its successors reweighted) cut to
    random lengths 8..16 and padded: input ids (N, SEQ_LEN) with PAD after each sequence's end, labels
    (N, SEQ_LEN) = the input ids with -100 on the padding (the model shifts them itself, as GPT-2 does)."""
    tokens, _, _ = data.markov_text(seed, DIALECT) if dialect else data.markov_text(seed)
    g = torch.Generator().manual_seed(3000 + seed)
    lengths = torch.randint(data.SEQ_LEN // 2, data.SEQ_LEN + 1, (len(tokens),), generator=g)
    pad = torch.arange(data.SEQ_LEN)[None, :] >= lengths[:, None]
    return tokens.masked_fill(pad, data.PAD), tokens.masked_fill(pad, IGNORE)


def dialect_text(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fine-tune's data (peft_lm): the language the base was pretrained on, reweighted."""
    return padded_text(seed, dialect=True)


def as_dict_batches(batches: list[tuple[torch.Tensor, ...]]) -> list[dict[str, torch.Tensor]]:
    return [{"input_ids": ids, "attention_mask": (labels != IGNORE).long(), "labels": labels}
            for ids, labels in batches]


def raw_units(x: torch.Tensor, scale: float, offset: float) -> torch.Tensor:
    """Standardised features back in raw units: offset + scale * z (e.g. incomes around 1e5)."""
    return offset + scale * x


# --- models -----------------------------------------------------------------------------------------

@dataclass
class LMOutput:
    loss: Optional[torch.Tensor]
    logits: torch.Tensor


class SelfLossLM(nn.Module):
    """A causal LM with a Hugging Face-style forward: model(input_ids, attention_mask, labels) returns
    .loss (next-token cross-entropy, the labels shifted inside, -100 ignored) and .logits."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        from suite.models import Neck, TokenTrunk  # the LM family's blocks

        self.trunk, self.neck = TokenTrunk(cfg), Neck(32, 32, cfg)
        self.head = nn.Linear(32, data.VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.neck(self.trunk(input_ids)))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=IGNORE)
        return LMOutput(loss, logits)


def tiny_gpt2(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=data.VOCAB, n_positions=data.SEQ_LEN, n_embd=32, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1,
                        pad_token_id=data.PAD)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


PRETRAIN_STEPS = 60


@functools.lru_cache(maxsize=4)
def _pretrained_gpt2_state(seed: int) -> dict:
    """The base model "pretrained" in code: 60 AdamW steps on the Markov language; the fine-tune's data
    is a dialect of it (newkinds.dialect_text), so the base knows the tokens and has room to improve."""
    with torch.random.fork_rng():
        model = tiny_gpt2(seed)
        tokens = padded_text(seed + 100)
        batches = as_dict_batches(data.batches_of(tokens, 0, 20, 16))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for i in range(PRETRAIN_STEPS):
            opt.zero_grad()
            model(**batches[i % len(batches)]).loss.backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def peft_gpt2(cfg: ModelConfig, seed: int):
    """The pretrained tiny GPT-2 with peft's LoRA on its attention and MLP projections; everything else
    frozen by design (peft does it)."""
    from peft import LoraConfig, get_peft_model

    model = tiny_gpt2(seed)
    model.load_state_dict(_pretrained_gpt2_state(seed))
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)
    return get_peft_model(model, lora)


# --- a pretrained backbone for linear probes --------------------------------------------------------

PROBE_PRETRAIN_STEPS = 100


@functools.lru_cache(maxsize=32)
def pretrained_state(family: str, seed: int, model_cfg: ModelConfig) -> dict:
    """The family's net trained 100 AdamW steps (lr 3e-3) on its own clean task, in code: the backbone a
    linear probe starts from. Cached; the caller's RNG state is left as it was."""
    from suite.families import FAMILIES, build_data_for, loss_fn_for
    from suite.models import BUILDERS

    with torch.random.fork_rng():
        torch.manual_seed(10_000 + seed)
        model = BUILDERS[family](model_cfg)
        batches = build_data_for(family, seed)
        loss_fn = loss_fn_for(FAMILIES[family], "default")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for i in range(PROBE_PRETRAIN_STEPS):
            opt.zero_grad()
            loss_fn(model, batches[i % len(batches)]).backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- losses -----------------------------------------------------------------------------------------

def multilabel_loss(model, batch):
    x, y = batch
    return F.binary_cross_entropy_with_logits(model(x), y)


def huber_loss(model, batch):
    x, y = batch
    return F.huber_loss(model(x).squeeze(-1), y, delta=1.0)


def smoothed_ce_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, label_smoothing=0.1)


def self_loss(model, batch):
    return model(**batch).loss


def huber_constant(y: torch.Tensor) -> float:
    """The Huber loss of the best constant prediction (searched over the targets' quantiles)."""
    candidates = torch.quantile(y, torch.linspace(0.05, 0.95, 91))
    return min(float(F.huber_loss(torch.full_like(y, float(c)), y, delta=1.0)) for c in candidates)


def multilabel_constant(y: torch.Tensor) -> float:
    """Mean binary entropy of the attributes' frequencies (BCE's mean over labels)."""
    p = y.float().mean(0).clamp(1e-6, 1 - 1e-6)
    return float((-(p * p.log() + (1 - p) * (1 - p).log())).mean())


def smoothed_constant(y: torch.Tensor, classes: int, smoothing: float = 0.1) -> float:
    """The smoothed cross-entropy of the best constant prediction: the class frequencies mixed with the
    uniform target as the loss mixes them."""
    p = torch.bincount(y, minlength=classes).float() / len(y)
    target = (1 - smoothing) * p + smoothing / classes
    return float(-(target * target.log()).sum())


def token_constant(labels: torch.Tensor) -> float:
    """Entropy of the predicted tokens' frequencies (labels shifted by one, -100 left out)."""
    y = labels[:, 1:].reshape(-1)
    y = y[y != IGNORE]
    p = torch.bincount(y, minlength=data.VOCAB).float() / len(y)
    p = p[p > 0]
    return float(-(p * p.log()).sum())
