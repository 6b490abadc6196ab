"""The seven families' networks, each trunk -> neck -> head, with the options faults need (config.ModelConfig).

Shapes: mlp/resnet (B, 64) digits; cnn_bn (B, 1, 8, 8) digits; rnn (B, T, 3) traces; transformer_lm
(B, T) token ids -> (B, T, VOCAB) logits; tabular_regressor (B, 10) -> (B, 1); binary_classifier
(B, 20) -> (B, 1) logit.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from suite.config import ModelConfig
from suite.data import PAD, TRACE_CHANNELS, TRACE_CLASSES, VOCAB

ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


class ExampleNorm(nn.Module):
    """Each example (each position, for tokens) scaled to zero mean and unit variance over its own
    features: (x - mean) / sqrt(var + eps). With eps = 0 a constant example is 0 / 0."""

    def __init__(self, eps: float, dims: tuple[int, ...]):
        super().__init__()
        self.eps, self.dims = eps, dims

    def forward(self, x):
        centred = x - x.mean(self.dims, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(self.dims, keepdim=True) + self.eps)


class Neck(nn.Sequential):
    """`depth` x (Linear -> activation [-> dropout]): the layers between trunk and head."""

    def __init__(self, inputs: int, width: int, cfg: ModelConfig):
        layers: list[nn.Module] = []
        for i in range(cfg.neck_depth):
            linear = nn.Linear(inputs if i == 0 else width, width)
            if cfg.neck_bias is not None:
                nn.init.constant_(linear.bias, cfg.neck_bias)
            layers += [linear, ACTIVATIONS[cfg.neck_activation]()]
            if cfg.dropout:
                layers.append(nn.Dropout(cfg.dropout))
        super().__init__(*layers)


class Net(nn.Module):
    """trunk -> neck -> head. With detach="output" the head's output is detached and a learnable
    per-output bias added after the cut (a calibration term): only that bias ever gets a gradient."""

    def __init__(self, trunk: nn.Module, neck: nn.Module, head: nn.Module, detach: Optional[str] = None):
        super().__init__()
        self.trunk, self.neck, self.head = trunk, neck, head
        self.detach = detach
        if detach == "output":
            self.calibration = nn.Parameter(torch.zeros(head.out_features))

    def forward(self, x):
        out = self.head(self.neck(self.trunk(x)))
        if self.detach == "output":  # the bug: a stop-gradient meant for a teacher's logits, on the model's own
            return out.detach() + self.calibration
        return out


def _first_layers(cfg: ModelConfig, first: nn.Module, norm_dims: tuple[int, ...],
                  width: Optional[int] = None) -> list[nn.Module]:
    """[ExampleNorm] -> first layer [-> LayerNorm over `width`, for families without a norm of their own]."""
    layers: list[nn.Module] = []
    if cfg.example_norm_eps is not None:
        layers.append(ExampleNorm(cfg.example_norm_eps, norm_dims))
    layers.append(first)
    if cfg.input_norm and width is not None:
        layers.append(nn.LayerNorm(width))
    return layers


def mlp(cfg: ModelConfig) -> Net:
    trunk = nn.Sequential(*_first_layers(cfg, nn.Linear(64, 64), (1,), 64), nn.ReLU())
    return _finish(Net(trunk, Neck(64, 64, cfg), nn.Linear(64, 10), cfg.detach), cfg)


def cnn_bn(cfg: ModelConfig) -> Net:
    trunk = nn.Sequential(
        *_first_layers(cfg, nn.Conv2d(1, 8, 3, padding=1), (1, 2, 3)),
        nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),                  # (B, 8, 4, 4)
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten())                                  # (B, 16 * 2 * 2)
    return _finish(Net(trunk, Neck(64, 32, cfg), nn.Linear(32, 10), cfg.detach), cfg)


class ResidualBlock(nn.Module):
    """h + Linear(act(Linear(LayerNorm(h)))); without skips (and norm) just the inner layers."""

    def __init__(self, width: int, cfg: ModelConfig):
        super().__init__()
        self.skips = cfg.skips
        self.norm = nn.LayerNorm(width) if cfg.skips else nn.Identity()
        self.inner = nn.Sequential(nn.Linear(width, 2 * width), ACTIVATIONS[cfg.block_activation](),
                                   nn.Linear(2 * width, width))
        self.after = nn.Identity() if cfg.skips else ACTIVATIONS[cfg.block_activation]()

    def forward(self, h):
        out = self.inner(self.norm(h))
        return h + out if self.skips else self.after(out)


def resnet(cfg: ModelConfig) -> Net:
    blocks = [ResidualBlock(32, cfg) for _ in range(3)]
    trunk = nn.Sequential(*_first_layers(cfg, nn.Linear(64, 32), (1,), 32), nn.ReLU(), *blocks,
                          nn.LayerNorm(32) if cfg.skips else nn.Identity())
    return _finish(Net(trunk, Neck(32, 32, cfg), nn.Linear(32, 10), cfg.detach), cfg)


class TraceEncoder(nn.Module):
    """(B, T, 3) traces -> Linear -> LayerNorm -> LSTM -> max over time: (B, 32)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.prep = nn.Sequential(*_first_layers(cfg, nn.Linear(TRACE_CHANNELS, 16), (1, 2)),
                                  nn.LayerNorm(16))
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        with torch.no_grad():  # forget-gate bias 1 (Jozefowicz et al. 2015), split over the two bias vectors
            for bias in (self.lstm.bias_ih_l0, self.lstm.bias_hh_l0):
                bias[32:64] = 0.5

    def forward(self, x):
        out, _ = self.lstm(self.prep(x))  # (B, T, 32)
        return out.amax(1)


def rnn(cfg: ModelConfig) -> Net:
    return _finish(Net(TraceEncoder(cfg), Neck(32, 32, cfg), nn.Linear(32, TRACE_CLASSES), cfg.detach), cfg)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):  # (B, T, dim)
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)  # (B, nh, T, T), in the autocast dtype
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, cfg: ModelConfig):
        super().__init__()
        self.post_norm, self.skips = cfg.post_norm, cfg.skips
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads=4)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), ACTIVATIONS[cfg.block_activation](), nn.Linear(2 * dim, dim))

    def forward(self, x):
        if self.post_norm:
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.ffn(x))
        if not self.skips:
            return self.ffn(self.norm2(self.attn(self.norm1(x))))
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class TokenTrunk(nn.Module):
    """Token + position embeddings -> 2 causal transformer blocks -> LayerNorm: (B, T) -> (B, T, 32)."""

    def __init__(self, cfg: ModelConfig, dim: int = 32, seq_len: int = 16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.pos = nn.Parameter(0.1 * torch.randn(seq_len, dim))
        self.embed_scale = cfg.embed_scale
        self.norm_in = ExampleNorm(cfg.example_norm_eps, (2,)) if cfg.example_norm_eps is not None else nn.Identity()
        self.blocks = nn.Sequential(*[TransformerBlock(dim, cfg) for _ in range(2)])
        self.norm_out = nn.LayerNorm(dim)

    def forward(self, tokens):
        # The hand-written input norm (when present) sees the bare token embedding: PAD's is all zeros.
        h = self.norm_in(self.embed(tokens) * self.embed_scale) + self.pos[: tokens.shape[1]]
        return self.norm_out(self.blocks(h))


def transformer_lm(cfg: ModelConfig) -> Net:
    return _finish(Net(TokenTrunk(cfg), Neck(32, 32, cfg), nn.Linear(32, VOCAB), cfg.detach), cfg)


def tabular_regressor(cfg: ModelConfig) -> Net:
    trunk = nn.Sequential(*_first_layers(cfg, nn.Linear(10, 64), (1,), 64), nn.ReLU())
    return _finish(Net(trunk, Neck(64, 64, cfg), nn.Linear(64, 1), cfg.detach), cfg)


def binary_classifier(cfg: ModelConfig) -> Net:
    trunk = nn.Sequential(*_first_layers(cfg, nn.Linear(20, 48), (1,), 48), nn.GELU())
    return _finish(Net(trunk, Neck(48, 32, cfg), nn.Linear(32, 1), cfg.detach), cfg)


def multilabel_mlp(cfg: ModelConfig) -> Net:
    """The digits MLP with one logit per attribute (the multilabel family)."""
    trunk = nn.Sequential(*_first_layers(cfg, nn.Linear(64, 64), (1,), 64), nn.ReLU())
    return _finish(Net(trunk, Neck(64, 64, cfg), nn.Linear(64, 4), cfg.detach), cfg)


def _finish(net: Net, cfg: ModelConfig) -> Net:
    if cfg.init_std is not None:
        unit_variance_init(net, cfg.init_std)
    return net


def unit_variance_init(net: nn.Module, std: float) -> None:
    """The faulty init: every weight matrix N(0, std^2) whatever its fan-in, biases zero
    (norm layers and embeddings keep theirs)."""
    for module in net.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, std=std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LSTM):
            for name, p in module.named_parameters():
                nn.init.normal_(p, std=std) if "weight" in name else nn.init.zeros_(p)


BUILDERS = {"mlp": mlp, "cnn_bn": cnn_bn, "resnet": resnet, "rnn": rnn, "transformer_lm": transformer_lm,
            "tabular_regressor": tabular_regressor, "binary_classifier": binary_classifier}
