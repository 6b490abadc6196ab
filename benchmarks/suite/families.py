"""The seven model families: data, model, loss and good learning rates, and `build_setup(cfg)`, which
turns a RunConfig into the `triage.Setup` the run's owner would write (fresh objects each call, seeded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch.nn import functional as F

import triage
from suite.loop import PER_EPOCH
from suite import data, models, newkinds
from suite.config import DataConfig, RunConfig, Schedule


@dataclass(frozen=True)
class Family:
    name: str
    task: str                              # "classify" | "lm" | "regress" | "binary"; held out (blind):
                                           # "multilabel" | "huber" | "classify_smoothed" | "self_loss"
    classes: int                           # classes, vocabulary size, or 1 for regression
    normalises_inputs: bool                # a norm layer right after the first layer (BatchNorm, LayerNorm)
    good_lr: dict[str, float]              # a learning rate that trains well, per optimizer
    examples: Callable[[int], tuple[torch.Tensor, ...]]
    description: str


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("mlp", "classify", 10, False, {"sgd": 0.05, "adamw": 3e-3}, data.digits_vectors,
           "ReLU MLP 64-64-64-10 on the 8x8 digits"),
    Family("cnn_bn", "classify", 10, True, {"sgd": 0.05, "adamw": 3e-3}, data.digits_images,
           "two conv+BatchNorm+ReLU layers, max-pool, MLP head, on the digits as 1x8x8 images"),
    Family("resnet", "classify", 10, True, {"sgd": 0.05, "adamw": 3e-3}, data.digits_vectors,
           "residual MLP: stem, 3 pre-LayerNorm residual blocks, head, on the digits"),
    Family("rnn", "classify", data.TRACE_CLASSES, True, {"sgd": 0.07, "adamw": 5e-3}, data.sensor_traces,
           "LSTM over 20-step sensor traces (pulse shape classification)"),
    Family("transformer_lm", "lm", data.VOCAB, True, {"sgd": 0.2, "adamw": 5e-3}, data.markov_text,
           "2-block causal transformer LM on a Markov language of 16 tokens"),
    Family("tabular_regressor", "regress", 1, False, {"sgd": 0.02, "adamw": 3e-3}, data.friedman_table,
           "ReLU MLP regressor (MSE) on Friedman #1 made in code"),
    Family("binary_classifier", "binary", 2, False, {"sgd": 0.1, "adamw": 5e-3}, data.screening_table,
           "GELU/ReLU MLP with one logit and BCEWithLogitsLoss on a screening table (30% positives)"),
]}

FAMILY_NAMES = tuple(FAMILIES)

# Families added for issues 20/21, held out whole and measured blind (cases.BLIND_SPLIT): never tune on them.
BLIND_FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("multilabel", "multilabel", newkinds.ATTRIBUTES, False, {"sgd": 0.05, "adamw": 3e-3},
           newkinds.digit_attributes, "ReLU MLP with 4 logits and BCEWithLogitsLoss: 4 attributes of each digit"),
    Family("huber_regressor", "huber", 1, False, {"sgd": 0.02, "adamw": 3e-3}, data.friedman_table,
           "the tabular regressor trained with the Huber loss (delta 1)"),
    Family("smoothed_classifier", "classify_smoothed", 10, False, {"sgd": 0.05, "adamw": 3e-3},
           newkinds.digits_pair, "the digits MLP trained with label_smoothing=0.1 (a loss floor above zero)"),
    Family("self_loss_lm", "self_loss", data.VOCAB, True, {"sgd": 0.2, "adamw": 5e-3}, newkinds.padded_text,
           "the transformer LM with a Hugging Face-style forward: model(**batch).loss, padded, -100 labels"),
    Family("peft_lm", "self_loss", data.VOCAB, True, {"sgd": 0.03, "adamw": 1e-3}, newkinds.dialect_text,
           "a tiny GPT-2 (transformers, from a config) pretrained in code, fine-tuned with peft's LoRA"),
]}
FAMILIES.update(BLIND_FAMILIES)
BLIND_FAMILY_NAMES = tuple(BLIND_FAMILIES)


# --- losses -----------------------------------------------------------------------------------------

def _outputs(model, x, on_copy: bool) -> torch.Tensor:
    out = model(x)
    if on_copy:  # the bug: a NumPy copy "so backward works"; no gradient reaches the model from it
        out = torch.tensor(out.detach().cpu().numpy(), requires_grad=True)
    return out


def _classify_loss(kind: str, on_copy: bool) -> Callable:
    def loss_fn(model, batch):
        x, y, weights = batch
        per_example = _class_loss(kind, _outputs(model, x, on_copy), y)
        return (per_example * weights).mean()  # per-example weights (class balancing), mean 1
    return loss_fn


def _class_loss(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example loss of (..., K) outputs against (...) class ids."""
    if kind == "default":
        return F.cross_entropy(out.transpose(1, -1), y, reduction="none") if out.dim() > 2 else \
            F.cross_entropy(out, y, reduction="none")
    if kind == "softmax_ce":  # the bug: probabilities into a loss that applies log_softmax again
        return _class_loss("default", out.softmax(-1), y)
    if kind == "smoothed_ce":  # the bug: label_smoothing=0.9, a typo for 0.1: the target is nearly uniform
        return F.cross_entropy(out.transpose(1, -1), y, reduction="none", label_smoothing=0.9) if out.dim() > 2 \
            else F.cross_entropy(out, y, reduction="none", label_smoothing=0.9)
    raise ValueError(f"unknown classification loss {kind!r}")


def _lm_loss(kind: str, on_copy: bool) -> Callable:
    def loss_fn(model, batch):
        tokens, targets, weights = batch
        per_token = _class_loss(kind, _outputs(model, tokens, on_copy), targets)  # logits (B, T, V) -> (B, T)
        # Per-sequence weights (data-mixing weights, mean 1) times each sequence's mean token loss.
        return (per_token.mean(1) * weights).mean()
    return loss_fn


def _regress_loss(kind: str, on_copy: bool) -> Callable:
    def loss_fn(model, batch):
        x, y = batch[0], batch[1]
        out = _outputs(model, x, on_copy)  # (B, 1)
        if kind == "default":
            return F.mse_loss(out.squeeze(-1), y)
        if kind == "broadcast_mse":  # the bug: (B, 1) - (B,) broadcasts to (B, B): every pair of rows
            return ((out - y) ** 2).mean()
        if kind == "sigmoid_mse":    # the bug: a [0, 1] output squashing for standardised targets
            return F.mse_loss(torch.sigmoid(out.squeeze(-1)), y)
        raise ValueError(f"unknown regression loss {kind!r}")
    return loss_fn


def _binary_loss(kind: str, on_copy: bool) -> Callable:
    def loss_fn(model, batch):
        x, y = batch[0], batch[1]
        logit = _outputs(model, x, on_copy).squeeze(-1)  # (B,)
        if kind == "default":
            return F.binary_cross_entropy_with_logits(logit, y)
        if kind == "double_sigmoid":  # the bug: probabilities into a loss that applies the sigmoid again
            return F.binary_cross_entropy_with_logits(torch.sigmoid(logit), y)
        if kind == "smoothed_bce":  # the bug: targets smoothed by 0.9, a typo for 0.1: 0.45 / 0.55
            return F.binary_cross_entropy_with_logits(logit, y * 0.1 + 0.45)
        raise ValueError(f"unknown binary loss {kind!r}")
    return loss_fn


NEW_LOSSES = {"multilabel": newkinds.multilabel_loss, "huber": newkinds.huber_loss,
              "classify_smoothed": newkinds.smoothed_ce_loss, "self_loss": newkinds.self_loss}


def loss_fn_for(family: Family, kind: str, weight: float = 1.0, on_copy: bool = False) -> Callable:
    if family.task in NEW_LOSSES:
        assert kind == "default" and weight == 1.0 and not on_copy, "the new kinds carry no loss faults"
        return NEW_LOSSES[family.task]
    loss_fn = {"classify": _classify_loss, "lm": _lm_loss, "regress": _regress_loss,
               "binary": _binary_loss}[family.task](kind, on_copy)
    if weight == 1.0:
        return loss_fn

    def weighted(model, batch):
        return weight * loss_fn(model, batch)
    return weighted


# --- the run's own train_step (loop bugs) --------------------------------------------------------

def train_step_for(kind: Optional[str], loss_fn: Callable, cfg: Optional[RunConfig] = None,
                   extra: Optional[dict] = None) -> Optional[Callable]:
    if kind is None:
        return None
    if kind in OWN_LOOPS:
        return OWN_LOOPS[kind](loss_fn, cfg, extra or {})

    def zero_grad_after_backward(model, optimizer, batch):
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.zero_grad()  # the bug: moved here in a clean-up; the gradients are gone before step()
        optimizer.step()
        return loss.detach()

    def loss_from_item(model, optimizer, batch):
        optimizer.zero_grad()
        value = loss_fn(model, batch).item()
        loss = torch.tensor(value, requires_grad=True)  # the bug: a new leaf; no gradient reaches the model
        loss.backward()
        optimizer.step()
        return loss.detach()

    steps = {f.__name__: f for f in (zero_grad_after_backward, loss_from_item)}
    return steps[kind]


# --- a run's own loop (the loops axis, issue 21): correct loops that are not the reference loop ---

def _manual_sgd(loss_fn, cfg, extra):
    """No optimizer object: a hand-written SGD update with clipping (PyTorch's word-language-model example),
    declared as README says (`manual_lr`, no optimizer): the step is handed the LR of each step."""
    def manual_sgd(model, lr, batch):
        model.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)
        return loss.detach()
    return manual_sgd


def _two_optimizers(loss_fn, cfg, extra):
    """The body and the head each with its own optimizer, handed to triage by name as README says
    (`optimizers={"body": ..., "head": ...}`): the step gets them as one set."""
    def two_optimizers(model, optimizers, batch):
        for optimizer in optimizers.values():
            optimizer.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        for optimizer in optimizers.values():
            optimizer.step()
        return loss.detach()
    return two_optimizers


def _lbfgs_closure(loss_fn, cfg, extra):
    """A closure optimizer: LBFGS re-evaluates the loss inside step()."""
    def lbfgs_closure(model, optimizer, batch):
        def closure():
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            return loss
        loss = optimizer.step(closure)
        return loss.detach()
    return lbfgs_closure


ACCUMULATE = 4


def _accumulate(loss_fn, cfg, extra):
    """Gradient accumulation over 4 calls (zero_grad and step every fourth), with a GradScaler under fp16."""
    scaler = extra.get("scaler")
    calls = [0]

    def accumulate(model, optimizer, batch):
        with torch.autocast("cpu", dtype=torch.float16, enabled=cfg.precision == "fp16"):
            loss = loss_fn(model, batch)
        (scaler.scale(loss / ACCUMULATE) if scaler else loss / ACCUMULATE).backward()
        calls[0] += 1
        if calls[0] % ACCUMULATE == 0:
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
        return loss.detach().float()
    return accumulate


OWN_LOOPS = {"manual_sgd": _manual_sgd, "two_optimizers": _two_optimizers, "lbfgs_closure": _lbfgs_closure,
             "accumulate": _accumulate}


# --- optimizer and schedule ------------------------------------------------------------------------

def make_optimizer(cfg: RunConfig, params) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if cfg.optimizer == "lbfgs":
        return torch.optim.LBFGS(params, lr=cfg.lr, max_iter=1, history_size=10)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


def make_scheduler(schedule: Optional[Schedule], optimizer: torch.optim.Optimizer):
    if schedule is None:
        return None
    if schedule.kind == "exponential":
        return torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=schedule.gamma)
    if schedule.kind == "warmup_cosine":
        warmup, total = schedule.warmup, schedule.total

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    scheduler = _axis_scheduler(schedule, optimizer)
    if schedule.per_epoch:
        setattr(scheduler, PER_EPOCH, True)
    return scheduler


def _axis_scheduler(schedule: Schedule, optimizer: torch.optim.Optimizer):
    """The schedule axis (issue 20): the schedulers real runs use, built as their owners write them."""
    sched, warmup, total = torch.optim.lr_scheduler, schedule.warmup, schedule.total
    if schedule.kind == "linear_warmup":
        return sched.SequentialLR(optimizer, [sched.LinearLR(optimizer, start_factor=0.01, total_iters=warmup),
                                              sched.CosineAnnealingLR(optimizer, T_max=total - warmup)],
                                  milestones=[warmup])
    if schedule.kind == "lambda_warmup":
        return sched.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))  # a closure, as people write it
    if schedule.kind == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=total)
    if schedule.kind == "onecycle":
        return sched.OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups], total_steps=total,
                                pct_start=warmup / total)
    if schedule.kind == "plateau":
        return sched.ReduceLROnPlateau(optimizer, factor=0.5, patience=10)
    if schedule.kind == "hf_linear_warmup":  # transformers' own: a LambdaLR over a functools.partial
        from transformers import get_linear_schedule_with_warmup
        return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=total)
    if schedule.kind == "warm_restarts":
        return sched.CosineAnnealingWarmRestarts(optimizer, T_0=50)
    if schedule.kind == "chained":
        return sched.ChainedScheduler([sched.LinearLR(optimizer, start_factor=0.01, total_iters=warmup),
                                       sched.ExponentialLR(optimizer, gamma=0.999)])
    if schedule.kind == "step":
        return sched.StepLR(optimizer, step_size=1, gamma=schedule.gamma)
    raise ValueError(f"unknown schedule {schedule.kind!r}")


# --- the Setup --------------------------------------------------------------------------------------

def build_data(cfg: RunConfig):
    family = FAMILIES[cfg.family]
    train, val = data.snapshot(family.examples(cfg.seed), cfg.data, cfg.seed, family.classes)
    if family.task == "self_loss":
        return newkinds.as_dict_batches(train), newkinds.as_dict_batches(val)
    return train, val


def build_data_for(family: str, seed: int) -> list:
    """The family's clean training batches (pretraining a backbone)."""
    return build_data(RunConfig(family=family, optimizer="adamw", lr=0.0, seed=seed, data=DataConfig()))[0]


def _build_model(cfg: RunConfig) -> torch.nn.Module:
    if cfg.family == "peft_lm":
        return newkinds.peft_gpt2(cfg.model, cfg.seed)
    if cfg.family == "self_loss_lm":
        return newkinds.SelfLossLM(cfg.model)
    builder = {"multilabel": models.multilabel_mlp, "huber_regressor": models.tabular_regressor,
               "smoothed_classifier": models.mlp}.get(cfg.family) or models.BUILDERS[cfg.family]
    model = builder(cfg.model)
    if cfg.model.pretrained:  # a backbone trained before, and a fresh head for this task (a linear probe)
        model.load_state_dict(newkinds.pretrained_state(cfg.family, cfg.seed,
                                                        replace(cfg.model, pretrained=False)))
        model.head.reset_parameters()
    return model


def build_setup(cfg: RunConfig, default_init: bool = False) -> triage.Setup:
    """The run as its owner wrote it. Seeded: two calls give the same initial weights.

    With `default_init`, every module's reset_parameters() replaces the run's own init (the
    counterfactual "PyTorch's default initialisation").
    """
    family = FAMILIES[cfg.family]
    torch.manual_seed(cfg.seed)
    model = _build_model(cfg)
    if default_init:
        for module in model.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
    if cfg.freeze == "requires_grad":
        # the bug: the model frozen for an export step (requires_grad_(False)) and only the output bias
        # re-enabled for "calibration", left in the training script
        model.requires_grad_(False)
        model.head.bias.requires_grad_(True)
    if cfg.freeze == "probe_requires_grad":  # by design: a linear probe, the backbone frozen
        model.requires_grad_(False)
        model.head.requires_grad_(True)
    # the bug: the optimizer built from the output bias only (a "re-fit the class prior" step's optimizer)
    params = [model.head.bias] if cfg.freeze == "optimizer" else model.parameters()
    if cfg.freeze == "probe_optimizer":  # by design: only the head is handed to the optimizer
        params = model.head.parameters()
    extra = {}
    if cfg.train_step == "two_optimizers":
        head = list(model.head.parameters())
        params = [p for p in model.parameters() if all(p is not h for h in head)]
        extra["head_optimizer"] = torch.optim.AdamW(head, lr=cfg.head_lr, weight_decay=0.01)
    if cfg.train_step == "accumulate" and cfg.precision == "fp16":
        extra["scaler"] = torch.amp.GradScaler("cpu")
    optimizer = make_optimizer(cfg, params)
    train, val = build_data(cfg)
    loss_fn = loss_fn_for(family, cfg.loss, cfg.loss_weight, cfg.loss_on_copy)
    scheduler = make_scheduler(cfg.schedule, optimizer)
    # A run's own loop declared as README says: its optimizers by name, a schedule stepped once an epoch.
    declared: dict = {}
    if cfg.train_step == "two_optimizers":
        declared["optimizers"], optimizer = {"body": optimizer, "head": extra["head_optimizer"]}, None
    if cfg.train_step == "manual_sgd":  # no optimizer object: the update is the step's own
        declared["manual_lr"], optimizer = cfg.lr, None
    if cfg.schedule is not None and cfg.schedule.per_epoch:
        declared.update(scheduler_interval="epoch", steps_per_epoch=len(train))
    return triage.Setup(
        model=model, optimizer=optimizer, loss_fn=loss_fn, batches=train, val_batches=val or None,
        scheduler=scheduler, precision=cfg.precision, grad_clip=cfg.grad_clip,
        train_step=train_step_for(cfg.train_step, loss_fn, cfg, extra), total_steps=cfg.total_steps,
        scaler=extra.get("scaler"), **declared)


def constant_level(cfg: RunConfig) -> float:
    """The loss of the best constant prediction on the clean training targets: the entropy of the
    label (token) frequencies for a classifier, the binary classifier or LM, the target variance for a
    regressor (times the run's loss weight)."""
    family = FAMILIES[cfg.family]
    clean = data.snapshot(family.examples(cfg.seed), type(cfg.data)(n_batches=cfg.data.n_batches,
                          batch_size=cfg.data.batch_size, train_examples=cfg.data.train_examples),
                          cfg.seed, family.classes)[0]
    if family.task == "multilabel":
        return newkinds.multilabel_constant(torch.cat([b[1] for b in clean]))
    if family.task == "self_loss":
        return newkinds.token_constant(torch.cat([b[1] for b in clean]))
    y = torch.cat([b[1].reshape(-1) for b in clean])
    if family.task == "huber":
        return newkinds.huber_constant(y)
    if family.task == "classify_smoothed":
        return newkinds.smoothed_constant(y, family.classes)
    if family.task == "regress":
        return cfg.loss_weight * float(y.var(unbiased=False))
    if family.task == "binary":
        y = y.long()
    p = torch.bincount(y, minlength=family.classes).float() / len(y)
    p = p[p > 0]
    return cfg.loss_weight * float(-(p * p.log()).sum())
