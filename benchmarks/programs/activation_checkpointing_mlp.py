"""A deep residual MLP trained with activation (gradient) checkpointing on every layer.

Written after the PyTorch docs of `torch.utils.checkpoint.checkpoint` (which recommend `use_reentrant=False`
and warn that the reentrant variant needs an input that requires grad) and Hugging Face transformers'
gradient-checkpointing plumbing (`PreTrainedModel.gradient_checkpointing_enable(gradient_checkpointing_kwargs=
{"use_reentrant": ...})` setting `self._gradient_checkpointing_func = functools.partial(checkpoint, **kwargs)`,
and each layer stack running `if self.gradient_checkpointing and self.training: hidden =
self._gradient_checkpointing_func(layer.__call__, hidden)`). Every module of the stack, the input projection
included, runs under checkpoint to save activation memory. AdamW with linear warmup and decay (transformers'
`get_linear_schedule_with_warmup`, a `LambdaLR` stepped per optimizer step), cross-entropy over 4 classes,
batches as dicts `{"inputs": float (B, 16), "labels": long (B,)}`. Checkpoint: `{"model", "optimizer",
"scheduler", "global_step"}`.

Runs
- healthy: `gradient_checkpointing_kwargs={"use_reentrant": False}` as PyTorch recommends; 240 steps,
  checkpoint at step 120 (still improving).
- reentrant_checkpoint: the owner enabled checkpointing with `use_reentrant=True` (the old default, which
  many repos still pass explicitly). The first checkpointed module is the input projection, whose input is
  the raw batch with no `requires_grad`: reentrant checkpoint then returns an output that does not require
  grad ("UserWarning: None of the inputs have requires_grad=True. Gradients will be None", printed once and
  ignored), so no layer of the stack gets a gradient; only the classifier head trains, on random features.
  Exactly the situation of open_clip issue #573 ("None of the inputs have requires_grad=True... made this
  warning disappear by adding use_reentrant=False ... this also increased performance") and of the
  transformers/PEFT reports that led to `enable_input_require_grads()`. The loss stalls far above the
  healthy run's. Root cause `no_gradient_flow` (the graph is cut before the loss for almost every weight;
  the fix `use_reentrant=False` removes it). Competing fix a user tries first: a 10x higher LR (`lr_x10`),
  which leaves it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="activation_checkpointing_mlp",
    kind="memory",
    original="PyTorch docs torch.utils.checkpoint + transformers modeling_utils.gradient_checkpointing_enable "
             "(HF gradient_checkpointing usage)",
    runs={
        "healthy": Run(cause="healthy", story="Deep residual MLP, every layer under checkpoint(use_reentrant=False),"
                       " AdamW + linear warmup/decay; checkpoint at step 120 of 240 while the loss still falls."),
        "reentrant_checkpoint": Run(
            cause="no_gradient_flow",
            story="Enabled gradient checkpointing with use_reentrant=True; a warning about inputs without "
                  "requires_grad appeared once and the loss barely moved.",
            fix="use_reentrant_false", competing=("lr_x10",)),
    },
)

N_IN, N_CLASSES, WIDTH, DEPTH = 16, 4, 64, 6
N_TRAIN, N_VALID, BS, STEPS, WARMUP = 8192, 1024, 128, 240, 24


class ResidualBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(self.norm(h))))


class DeepResMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(N_IN, WIDTH)] + [ResidualBlock(WIDTH) for _ in range(DEPTH)])
        self.final_norm = nn.LayerNorm(WIDTH)
        self.classifier = nn.Linear(WIDTH, N_CLASSES)
        self.gradient_checkpointing = False
        self._gradient_checkpointing_func = None

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        kwargs = gradient_checkpointing_kwargs if gradient_checkpointing_kwargs is not None else {"use_reentrant": True}
        self._gradient_checkpointing_func = functools.partial(checkpoint, **kwargs)
        self.gradient_checkpointing = True

    def forward(self, inputs):
        h = inputs
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                h = self._gradient_checkpointing_func(layer.__call__, h)
            else:
                h = layer(h)
        return self.classifier(self.final_norm(h))


def make_data(seed):
    rng = np.random.default_rng(8000 + seed)
    n = N_TRAIN + N_VALID
    x = rng.normal(size=(n, N_IN)).astype(np.float32)
    a = 0.5 * x[:, 0] + x[:, 1] * x[:, 2]
    b = x[:, 3] ** 2 + x[:, 4] ** 2 - 1.4
    y = (a > 0).astype(np.int64) * 2 + (b > 0).astype(np.int64)
    flip = rng.random(n) < 0.03
    y[flip] = rng.integers(0, N_CLASSES, flip.sum())
    mk = lambda s: {"inputs": torch.tensor(x[s]), "labels": torch.tensor(y[s])}
    return mk(slice(0, N_TRAIN)), mk(slice(N_TRAIN, n))


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(step):
        if step < num_warmup_steps:
            return float(step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def loss_fn(model, batch):
    return F.cross_entropy(model(batch["inputs"]), batch["labels"])


def batches(ds, n_batches, bs, seed):
    g = torch.Generator().manual_seed(seed)
    n = len(ds["labels"])
    out, order, pos = [], torch.randperm(n, generator=g), 0
    for _ in range(n_batches):
        if pos + bs > n:
            order, pos = torch.randperm(n, generator=g), 0
        i = order[pos:pos + bs]
        pos += bs
        out.append({"inputs": ds["inputs"][i], "labels": ds["labels"][i]})
    return out


def build(seed, run, variant):
    train_ds, valid_ds = make_data(seed)
    model = DeepResMLP()
    reentrant = run == "reentrant_checkpoint" and variant != "use_reentrant_false"
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    lr = 1e-2 if variant == "lr_x10" else 1e-3
    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    no_decay = [p for n, p in model.named_parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr)
    sched = get_linear_schedule_with_warmup(opt, WARMUP, STEPS)
    return model, opt, sched, train_ds, valid_ds


@torch.no_grad()
def evaluate(model, ds):
    model.eval()
    logits = model(ds["inputs"])
    model.train()
    return float(F.cross_entropy(logits, ds["labels"])), float((logits.argmax(1) == ds["labels"]).float().mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    import warnings

    torch.manual_seed(seed)
    model, opt, sched, train_ds, valid_ds = build(seed, run, variant)
    ckpt = Path(out_dir) / "checkpoint.pt"
    ckpt_step = 120 if run == "healthy" else STEPS
    losses, vls, accs = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("once")   # the checkpoint warning shows once in the owner's log
        for step, batch in enumerate(batches(train_ds, STEPS, BS, seed), start=1):
            loss = loss_fn(model, batch)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(loss.item())
            if step % 60 == 0:
                vl, acc = evaluate(model, valid_ds)
                vls.append(vl)
                accs.append(acc)
            if step == ckpt_step:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "scheduler": sched.state_dict(), "global_step": step}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vls, metrics={"val_acc": accs[-1],
                                                                                 "val_loss": vls[-1]})


def symptom(run: str, trained: Trained) -> str | None:
    tl = trained.train_losses
    first, last = float(np.mean(tl[:10])), float(np.mean(tl[-30:]))
    if last > 0.6 * first:
        return (f"train loss {first:.3f} -> {last:.3f} over {len(tl)} steps; validation accuracy "
                f"{trained.metrics['val_acc']:.3f}")
    return None


def _setup(run):
    import triage

    model, opt, sched, train_ds, valid_ds = build(0, run, None)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn,
                        batches=batches(train_ds, 48, BS, 1234),
                        val_batches=batches(valid_ds, 8, BS, 4321),
                        grad_clip=1.0, total_steps=STEPS, scheduler_interval="step")


def setup_healthy():
    return _setup("healthy")


def setup_reentrant_checkpoint():
    return _setup("reentrant_checkpoint")
