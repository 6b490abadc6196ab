"""FixMatch semi-supervised classification on a small tabular task made in code: a few labelled examples and
many unlabelled ones per step, pseudo-labels from a weak view kept above a confidence threshold and used as
the targets of a strong view, an EMA model for evaluation.

Public original followed: kekmodel/FixMatch-pytorch (train.py; LeeDoYup/TorchSSL's fixmatch is the same
recipe). What I read of train.py: the labelled and unlabelled loaders zipped, the unlabelled batch `mu` times
larger and made of two views `(inputs_u_w, inputs_u_s)`; one forward on `torch.cat((inputs_x, inputs_u_w,
inputs_u_s))` so BatchNorm sees the three together, the logits split back with `logits[batch_size:].chunk(2)`;
`Lx = cross_entropy(logits_x, targets_x)`; `pseudo_label = softmax(logits_u_w.detach())`, `max_probs, targets_u =
max(pseudo_label)`, `mask = max_probs.ge(threshold)`; `Lu = (cross_entropy(logits_u_s, targets_u,
reduction='none') * mask).mean()`; `loss = Lx + lambda_u * Lu`; SGD(momentum 0.9, nesterov=True) with weight decay
off for biases and BatchNorm (the `no_decay` groups); `get_cosine_schedule_with_warmup(num_cycles=7/16)` stepped
every iteration; `ModelEMA` updated after each step and used for the test; the checkpoint
`{'epoch', 'state_dict', 'ema_state_dict', 'acc', 'best_acc', 'optimizer', 'scheduler'}` written once per
"epoch" of `eval_step` iterations. Here: 16 features, 6 classes (Gaussian clusters in 3-d mapped curved into 16-d), 5
labelled examples per class, 3000 unlabelled; an MLP with BatchNorm in place of the WideResNet; batch 16
labelled + 4x16 unlabelled (two views each); weak view = small jitter, strong view = feature dropout plus larger
noise (RandAugment's tabular stand-in); threshold 0.95, lambda_u 1, lr 0.03, wd 5e-4, EMA 0.99 (the original's
0.999 is for a million steps); 40 iterations an "epoch", 12 epochs.

Runs
- healthy: FixMatch as written. The labelled loss falls towards 0, the mask rate (unlabelled examples above
  the threshold) climbs past 0.9 and the EMA model's test loss falls to 0.01-0.04 (accuracy 0.98-0.997). Checkpoint
  after epoch 3 (step 120 of 480), while the EMA model's test loss is still falling.
- softmax_head (cause `wrong_loss`): the owner ended the classifier with `nn.Softmax(dim=1)` so that the model
  "outputs probabilities" for the threshold, and kept the training code as it was: `F.cross_entropy` then takes
  probabilities as logits (a double softmax), and the pseudo-label confidence `softmax(probs).max()` can never
  exceed e/(e+5) = 0.35 with 6 classes. The mask rate is 0 for the whole run (no unlabelled example is ever
  used) and the labelled loss sits at the floor of cross-entropy on probabilities (log((e+5)/e) = 1.04), the EMA
  model's test loss at ~1.05-1.09 where the healthy run's reaches 0.01-0.04. (On this easy task the argmax is
  still mostly right, 0.96-0.998 test accuracy: what the owner sees is a FixMatch that never uses a single
  unlabelled example and a loss that will not move; symptom: labelled loss > 0.9 and mask rate < 0.05 over the
  last epoch.)
  Real users meet both halves of it: the mask rate of FixMatch going to and staying at 0 (google-research/fixmatch
  issue #79, "the number of unlabeled examples that have pseudo labels with confidence above threshold converges
  to zero"; TorchSSL issue #53, "the mask_ratio keeps being 0"), and a softmax layer fed to CrossEntropyLoss,
  the best-known double-softmax mistake. The fix that removes the symptom is the loss the outputs call for (the
  model returning logits; `remove_softmax`): `wrong_loss`, decided by "the loss the outputs call for trains (e.g.
  cross-entropy on probabilities: a double softmax)". Competing fixes a FixMatch user tries first on "mask
  rate 0": a lower threshold (`threshold_0.5`; confidences of at most 0.35 stay under it) and a 10x larger
  learning rate (`lr_x10`); both leave the labelled loss above 1.04 and the mask at 0. Checkpoint after epoch 8
  (step 320), once the stall has shown.
"""

from __future__ import annotations

import math
from copy import deepcopy
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from _program import Program, Run, Trained

PROGRAM = Program(
    name="fixmatch_semisupervised",
    kind="semi-supervised (FixMatch, pseudo-labels + EMA)",
    original="kekmodel/FixMatch-pytorch: train.py",
    runs={
        "healthy": Run(cause="healthy", story=(
            "FixMatch with 30 labels: labelled loss falls, mask rate climbs past 0.9, EMA test loss falls; "
            "checkpoint mid-run.")),
        "softmax_head": Run(cause="wrong_loss", story=(
            "I added nn.Softmax at the end of the classifier so the model gives probabilities for the "
            "threshold. Since then the mask rate is 0.00 at every step and the labelled loss will not go below ~1.1."),
            fix="remove_softmax", competing=("threshold_0.5", "lr_x10")),
    },
)

N_FEAT, N_CLASSES = 16, 6
N_LABELED_PER_CLASS = 5
N_UNLABELED = 3000
BATCH, MU = 16, 4
LR, WDECAY, THRESHOLD, LAMBDA_U, EMA_DECAY = 0.03, 5e-4, 0.95, 1.0, 0.99
EVAL_STEP, EPOCHS = 40, 12
TOTAL_STEPS = EVAL_STEP * EPOCHS


# ----------------------------------------------------------------------------------------------- data
def make_task(seed: int):
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(3, N_FEAT, generator=g) / math.sqrt(3)
    centres = torch.randn(N_CLASSES, 3, generator=g) * 3.5

    def draw(n):
        y = torch.randint(N_CLASSES, (n,), generator=g)
        z = centres[y] + 0.55 * torch.randn(n, 3, generator=g)
        x = z @ proj + 0.3 * torch.tanh(z @ proj) + 0.2 * torch.randn(n, N_FEAT, generator=g)
        return x, y

    x, y = draw(2000)                                                   # x_u_split: a few labels per class
    idx = torch.cat([(y == c).nonzero().flatten()[:N_LABELED_PER_CLASS] for c in range(N_CLASSES)])
    x_l, y_l = x[idx], y[idx]
    x_u, _ = draw(N_UNLABELED)                                          # their labels are thrown away
    x_t, y_t = draw(1000)
    return (x_l, y_l), x_u, (x_t, y_t)


def weak(x, g):
    return x + 0.05 * torch.randn(x.shape, generator=g)


def strong(x, g):
    keep = (torch.rand(x.shape, generator=g) > 0.3).float()
    return x * keep + 0.25 * torch.randn(x.shape, generator=g)


def iteration_batches(task, seed: int, start: int, n: int):
    """Iterations start..start+n-1 of the run: the zipped labelled and unlabelled loaders (RandomSampler)."""
    (x_l, y_l), x_u, _ = task
    out = []
    for it in range(start, start + n):
        g = torch.Generator().manual_seed(seed * 100003 + it)
        li = torch.randint(len(x_l), (BATCH,), generator=g)
        ui = torch.randint(len(x_u), (BATCH * MU,), generator=g)
        out.append({"x": weak(x_l[li], g), "y": y_l[li], "u_w": weak(x_u[ui], g), "u_s": strong(x_u[ui], g)})
    return out


# ----------------------------------------------------------------------------------------------- model
class Net(nn.Module):
    def __init__(self, softmax_head=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_FEAT, 128), nn.BatchNorm1d(128), nn.LeakyReLU(0.1),
                                  nn.Linear(128, 128), nn.BatchNorm1d(128), nn.LeakyReLU(0.1))
        self.fc = nn.Linear(128, N_CLASSES)
        self.out = nn.Softmax(dim=1) if softmax_head else nn.Identity()

    def forward(self, x):
        return self.out(self.fc(self.body(x)))


class ModelEMA:
    def __init__(self, model, decay):
        self.ema = deepcopy(model).eval()
        self.decay = decay
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model):
        msd = model.state_dict()
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                v.mul_(self.decay).add_(msd[k].detach(), alpha=1 - self.decay)
            else:
                v.copy_(msd[k])


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, num_cycles=7. / 16.):
    def _lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        no_progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0., math.cos(math.pi * num_cycles * no_progress))
    return LambdaLR(optimizer, _lr_lambda)


def build(run: str, variant: str | None):
    softmax_head = run == "softmax_head" and variant != "remove_softmax"
    model = Net(softmax_head=softmax_head)
    no_decay = ["bias", "bn"]
    named = list(model.named_parameters())
    is_bn = {n for n, p in named if p.dim() == 1}     # BatchNorm weights and every bias
    groups = [{"params": [p for n, p in named if n not in is_bn], "weight_decay": WDECAY},
              {"params": [p for n, p in named if n in is_bn], "weight_decay": 0.0}]
    lr = LR * (10 if variant == "lr_x10" else 1)
    opt = torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    sched = get_cosine_schedule_with_warmup(opt, 0, TOTAL_STEPS)
    threshold = 0.5 if variant == "threshold_0.5" else THRESHOLD
    return model, opt, sched, threshold, no_decay


def make_loss_fn(threshold):
    def loss_fn(model, batch):
        x, y = batch["x"], batch["y"]
        if "u_w" not in batch:                 # a validation batch: labelled only
            return {"Lx": F.cross_entropy(model(x), y), "Lu": x.new_zeros(())}
        bs = x.shape[0]
        logits = model(torch.cat((x, batch["u_w"], batch["u_s"])))
        logits_x = logits[:bs]
        logits_u_w, logits_u_s = logits[bs:].chunk(2)
        lx = F.cross_entropy(logits_x, y, reduction="mean")
        pseudo = torch.softmax(logits_u_w.detach(), dim=-1)
        max_probs, targets_u = torch.max(pseudo, dim=-1)
        mask = max_probs.ge(threshold).float()
        lu = (F.cross_entropy(logits_u_s, targets_u, reduction="none") * mask).mean()
        loss_fn.mask_rate = mask.mean().item()
        return {"Lx": lx, "Lu": LAMBDA_U * lu}
    loss_fn.mask_rate = 0.0
    return loss_fn


@torch.no_grad()
def test(model, task):
    x_t, y_t = task[2]
    out = model(x_t)
    return F.cross_entropy(out, y_t).item(), (out.argmax(1) == y_t).float().mean().item()


def ckpt_epoch(run):
    return 3 if run == "healthy" else 8


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    task = make_task(seed)
    model, opt, sched, threshold, _ = build(run, variant)
    loss_fn = make_loss_fn(threshold)
    ema = ModelEMA(model, EMA_DECAY)
    losses, lxs, masks, test_losses, accs = [], [], [], [], []
    best_acc, ckpt = 0.0, Path(out_dir) / "checkpoint.pth.tar"
    model.zero_grad()
    for epoch in range(EPOCHS):
        model.train()
        for batch in iteration_batches(task, seed, epoch * EVAL_STEP, EVAL_STEP):
            t = loss_fn(model, batch)
            loss = t["Lx"] + t["Lu"]
            loss.backward()
            losses.append(loss.item()); lxs.append(t["Lx"].item()); masks.append(loss_fn.mask_rate)
            opt.step()
            sched.step()
            ema.update(model)
            model.zero_grad()
        tl, acc = test(ema.ema, task)
        test_losses.append(tl); accs.append(acc)
        best_acc = max(best_acc, acc)
        if epoch + 1 == ckpt_epoch(run):
            torch.save({"epoch": epoch + 1, "state_dict": model.state_dict(), "ema_state_dict": ema.ema.state_dict(),
                        "acc": acc, "best_acc": best_acc, "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict()}, ckpt)
            at_ckpt = {"acc_at_ckpt": acc, "test_loss_at_ckpt": tl}
    metrics = {"lx_last40": sum(lxs[-40:]) / 40, "lx_first40": sum(lxs[:40]) / 40,
               "mask_last40": sum(masks[-40:]) / 40, "mask_max": max(masks), "final_acc": accs[-1],
               "final_test_loss": test_losses[-1], **at_ckpt}
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=test_losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["lx_last40"] > 0.3 or m["mask_last40"] < 0.3 or m["final_acc"] < 0.7:
            return (f"labelled loss {m['lx_last40']:.2f}, mask rate {m['mask_last40']:.2f}, EMA test accuracy "
                    f"{m['final_acc']:.2f}")
        return None
    if m["lx_last40"] > 0.9 and m["mask_last40"] < 0.05:
        return (f"mask rate {m['mask_last40']:.2f} over the last epoch (max {m['mask_max']:.2f} over the run) and "
                f"labelled loss {m['lx_first40']:.2f} -> {m['lx_last40']:.2f} after {TOTAL_STEPS} steps; EMA test "
                f"loss {m['final_test_loss']:.2f}, accuracy {m['final_acc']:.2f}")
    return None


# ----------------------------------------------------------------------------------------------- triage entries
def _setup(run: str):
    import triage

    torch.manual_seed(0)
    task = make_task(0)
    model, opt, sched, threshold, _ = build(run, None)
    start = ckpt_epoch(run) * EVAL_STEP
    batches = iteration_batches(task, 0, start, 48)      # the iterations the run took after its checkpoint
    x_t, y_t = task[2]
    val = [{"x": x_t[i:i + 125], "y": y_t[i:i + 125]} for i in range(0, len(x_t), 125)]
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=make_loss_fn(threshold),
                        batches=batches, val_batches=val, total_steps=TOTAL_STEPS, steps_per_epoch=EVAL_STEP)


def setup_healthy():
    return _setup("healthy")


def setup_softmax_head():
    return _setup("softmax_head")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for run, v in [("healthy", None), ("softmax_head", None), ("softmax_head", "remove_softmax"),
                   ("softmax_head", "threshold_0.5"), ("softmax_head", "lr_x10")]:
        t = time.perf_counter()
        tr = train(run, Path("/tmp"), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
        print(run, v, round(time.perf_counter() - t, 1), {k: round(x, 3) for k, x in tr.metrics.items()},
              [round(a, 2) for a in tr.val_losses], symptom(run, tr))
