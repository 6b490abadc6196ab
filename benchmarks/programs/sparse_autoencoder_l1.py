"""A sparse autoencoder (dictionary learning) trained on synthetic "model activations" with an L1 penalty.

Public originals followed: openai/sparse_autoencoder (sparse_autoencoder/model.py: `latents =
ReLU(encoder(x - pre_bias) + latent_bias)`, `recons = decoder(latents) + pre_bias`, the decoder's columns kept
at unit norm and the gradient component parallel to each column removed before the step), jbloom's SAELens
(the training runner: Adam, an LR schedule of warm-up, constant, then a linear decay over `lr_decay_steps` at
the end, `l1_warm_up_steps` warming the L1 coefficient linearly from 0, activations normalised to a mean norm
of sqrt(d_in), dead latents counted as latents that never fired over a window) and Anthropic's "Towards
Monosemanticity" / its 2024 updates (unit-norm decoder columns, the pre-encoder bias initialised at the data's
centre, "we decay the learning rate linearly to 0 in the last 20% of training", quoted in SAELens issue #30).
What is written here: 32-dimensional "activations" made of sparse non-negative combinations of 64 ground-truth
unit directions (each active with probability 4%), plus a common offset and Gaussian noise, rescaled to a mean
norm of sqrt(32); an SAE of 128 latents (encoder initialised as the decoder's transpose, pre_bias at the
data mean); loss = MSE (summed over dims, averaged over the batch) + l1_coefficient * sum|latents| (the L1
coefficient 0.8, warmed up over the first 60 steps); Adam lr 3e-3; a LambdaLR of 20 warm-up steps, constant, and a
linear decay to 0 over the last 20% of the planned steps, stepped every step; after each step the decoder's
columns renormalised. The loss's floor is not 0 (the L1 term stays, and the run trades reconstruction for
sparsity). Metrics: fraction of variance unexplained (FVU), L0, dead latents (no activation over 4096 held-out
activations), and how well the dictionary recovers the ground-truth directions (mean max cosine).

Runs
- healthy: 2000 steps as planned. FVU falls to ~0.1 with L0 ~10 (from ~60) and the ground-truth directions
  recovered (mean max cosine ~0.99); the summed loss levels out at its non-zero floor (~6.5: the L1 term stays).
  Checkpoint mid-run (step 800), while the loss is still falling as the code gets sparser.
- schedule_in_epochs (cause `lr_schedule_decayed`): the owner built the LR lambda from `n_epochs` (20 passes
  over an activation buffer) where the scheduler is stepped once per step: the "last 20% of training" decay is
  from step 16 to step 20, and the lambda is clamped at 0 after it (max(0, ...)). The loss drops during the first
  20 steps, then nothing moves for the rest of the run: FVU stuck near 1 (no better than predicting the
  mean) and L0 ~60 of 128, nowhere near sparse. Mixing the
  scheduler's unit (epochs vs steps) is a common way to end with an LR of 0 (huggingface/smollm issue #37: "the
  lr decays to 0 at 300k step ... so lr from 300k to 600k steps is all zero"; NVlabs/instant-ngp issue #1418:
  "what is a step?"). The scheduler's LR at the checkpoint is 0 against its peak 1e-3: `lr_schedule_decayed`.
  The fix (`schedule_in_steps`) builds the lambda from the number of steps. Competing fixes a user of an SAE
  tries first on "many dead latents, reconstruction stuck": a 10x smaller L1 coefficient (`l1_coef_x0.1`) and
  a 10x larger learning rate (`lr_x10`, 10 x 0 is still 0); both leave the run stuck. Checkpoint at step 800,
  where the stall has shown for 780 steps (symptom: loss within 2% between steps 100-150 and 750-800, FVU > 0.25).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from _program import Program, Run, Trained

PROGRAM = Program(
    name="sparse_autoencoder_l1",
    kind="sparse autoencoder / dictionary learning (L1)",
    original="openai/sparse_autoencoder: sparse_autoencoder/model.py; jbloom SAELens training runner",
    runs={
        "healthy": Run(cause="healthy", story=(
            "SAE with L1 on synthetic activations: FVU ~0.1 at L0 ~10; the loss levels out at "
            "its non-zero floor (the L1 term). Mid-run checkpoint.")),
        "schedule_in_epochs": Run(cause="lr_schedule_decayed", story=(
            "My SAE stopped improving after ~20 steps: FVU stuck near 1 and L0 ~60, nothing sparse. I had built "
            "the LR warm-up/decay lambda from the number of epochs while stepping it every step."),
            fix="schedule_in_steps", competing=("l1_coef_x0.1", "lr_x10")),
    },
)

D_IN, N_FEATURES, N_LATENTS = 32, 64, 128
BATCH = 256
LR = 3e-3
L1_COEF = 0.8
L1_WARMUP = 60
LR_WARMUP = 20
STEPS = 2000
N_EPOCHS = 20          # the activation buffer is passed over 20 times: 100 steps an epoch
CKPT_STEP = 800


# ----------------------------------------------------------------------------------------------- data
class ActivationSource:
    """Synthetic 'residual stream' activations: sparse combinations of fixed directions + offset + noise."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.features = torch.nn.functional.normalize(torch.randn(N_FEATURES, D_IN, generator=g), dim=1)
        self.offset = 1.5 * torch.randn(D_IN, generator=g) / math.sqrt(D_IN)
        self.scale = 1.0
        self.g = g
        probe = self.sample(4096)
        self.scale = math.sqrt(D_IN) / probe.norm(dim=1).mean().item()   # SAELens: mean norm -> sqrt(d_in)

    def sample(self, n: int):
        active = torch.rand(n, N_FEATURES, generator=self.g) < 0.04
        mags = 0.5 + torch.rand(n, N_FEATURES, generator=self.g)
        x = (active * mags) @ self.features + self.offset + 0.03 * torch.randn(n, D_IN, generator=self.g)
        return x * self.scale


# ----------------------------------------------------------------------------------------------- model
class SparseAutoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre_bias = nn.Parameter(torch.zeros(D_IN))
        self.encoder = nn.Linear(D_IN, N_LATENTS, bias=False)
        self.latent_bias = nn.Parameter(torch.zeros(N_LATENTS))
        self.decoder = nn.Linear(N_LATENTS, D_IN, bias=False)
        w = torch.nn.functional.normalize(torch.randn(D_IN, N_LATENTS), dim=0)
        with torch.no_grad():
            self.decoder.weight.copy_(w)
            self.encoder.weight.copy_(w.t())

    def encode(self, x):
        return torch.relu(self.encoder(x - self.pre_bias) + self.latent_bias)

    def forward(self, x):
        latents = self.encode(x)
        return latents, self.decoder(latents) + self.pre_bias

    @torch.no_grad()
    def unit_norm_decoder_(self):
        self.decoder.weight.div_(self.decoder.weight.norm(dim=0, keepdim=True))

    @torch.no_grad()
    def remove_parallel_grad_(self):
        w, g = self.decoder.weight, self.decoder.weight.grad
        if g is not None:
            g.sub_((g * w).sum(dim=0, keepdim=True) * w)


def lr_lambda_for(total: int):
    decay_start = int(0.8 * total)

    def lr_lambda(step: int) -> float:
        if step < LR_WARMUP:
            return (step + 1) / LR_WARMUP
        if step < decay_start:
            return 1.0
        return max(0.0, (total - step) / max(1, total - decay_start))
    return lr_lambda


def build(run: str, variant: str | None, source: ActivationSource):
    model = SparseAutoencoder()
    with torch.no_grad():
        model.pre_bias.copy_(source.sample(4096).mean(dim=0))    # the data's centre (a median in the original)
    lr = LR * (10 if variant == "lr_x10" else 1)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    planned = N_EPOCHS if (run == "schedule_in_epochs" and variant != "schedule_in_steps") else STEPS
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda_for(planned))
    coef = L1_COEF * (0.1 if variant == "l1_coef_x0.1" else 1.0)
    return model, opt, sched, coef


def terms(model, x, coef):
    latents, recons = model(x)
    mse = (recons - x).pow(2).sum(dim=1).mean()
    l1 = latents.abs().sum(dim=1).mean()
    return {"mse": mse, "l1": coef * l1}


def make_train_step(coef_of_step):
    state = {"step": 0}

    def train_step(model, optimizer, batch):
        """SAELens-style step: loss, backward, drop the gradient along each decoder column, Adam, renorm."""
        t = terms(model, batch, coef_of_step(state["step"]))
        loss = t["mse"] + t["l1"]
        optimizer.zero_grad()
        loss.backward()
        model.remove_parallel_grad_()
        optimizer.step()
        model.unit_norm_decoder_()
        state["step"] += 1
        return loss
    return train_step


@torch.no_grad()
def evaluate(model, x, source):
    latents, recons = model(x)
    fvu = ((recons - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum()).item()
    l0 = (latents > 0).float().sum(1).mean().item()
    dead = int(((latents > 0).sum(0) == 0).sum())
    cos = source.features @ torch.nn.functional.normalize(model.decoder.weight, dim=0)
    mmcs = cos.max(dim=1).values.mean().item()
    return fvu, l0, dead, mmcs


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    source = ActivationSource(seed)
    held_out = source.sample(4096)
    model, opt, sched, coef = build(run, variant, source)
    step_fn = make_train_step(lambda s: coef * min(1.0, (s + 1) / L1_WARMUP))
    losses, mses, log = [], [], []
    ckpt = Path(out_dir) / f"sae_step{CKPT_STEP}.pt"
    for step in range(1, STEPS + 1):
        x = source.sample(BATCH)
        loss = step_fn(model, opt, x)
        sched.step()
        losses.append(loss.item())
        if step % 50 == 0:
            fvu, l0, dead, mmcs = evaluate(model, held_out, source)
            log.append({"step": step, "fvu": fvu, "l0": l0, "dead": dead, "lr": opt.param_groups[0]["lr"]})
        if step == CKPT_STEP:
            fvu_ck, l0_ck, dead_ck, _ = evaluate(model, held_out, source)
            torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "l1_coefficient": coef, "history": list(losses)}, ckpt)
    fvu, l0, dead, mmcs = evaluate(model, held_out, source)
    mid = sum(losses[100:150]) / 50
    metrics = {"fvu": fvu, "l0": l0, "dead": dead, "mmcs": mmcs, "fvu_at_ckpt": fvu_ck, "dead_at_ckpt": dead_ck,
               "loss_100_150": mid, "loss_750_800": sum(losses[750:800]) / 50,
               "loss_last50": sum(losses[-50:]) / 50, "lr_at_ckpt": log[CKPT_STEP // 50 - 1]["lr"]}
    return Trained(checkpoint=ckpt, train_losses=losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["fvu"] > 0.2 or m["mmcs"] < 0.9:
            return f"FVU {m['fvu']:.2f}, ground-truth recovery {m['mmcs']:.2f} after {STEPS} steps"
        return None
    stalled = abs(m["loss_100_150"] - m["loss_750_800"]) < 0.02 * m["loss_100_150"]
    if m["fvu"] > 0.25 and stalled:
        return (f"loss {m['loss_100_150']:.3f} at steps 100-150 and {m['loss_750_800']:.3f} at steps 750-800: "
                f"stuck, FVU {m['fvu']:.2f} and L0 {m['l0']:.0f} of {N_LATENTS} at step {STEPS}")
    return None


# ----------------------------------------------------------------------------------------------- triage entries
def _setup(run: str):
    import triage

    torch.manual_seed(0)
    source = ActivationSource(0)
    model, opt, sched, coef = build(run, None, source)
    source.sample(4096)          # the run's held-out set
    batches = [source.sample(BATCH) for _ in range(48)]
    val = [source.sample(BATCH) for _ in range(8)]
    return triage.Setup(model=model, optimizer=opt, scheduler=sched,
                        loss_fn=lambda m, x: terms(m, x, coef), auxiliary_terms=("l1",),
                        train_step=make_train_step(lambda s: coef), batches=batches, val_batches=val,
                        total_steps=STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_schedule_in_epochs():
    return _setup("schedule_in_epochs")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for run, v in [("healthy", None), ("schedule_in_epochs", None), ("schedule_in_epochs", "schedule_in_steps"),
                   ("schedule_in_epochs", "l1_coef_x0.1")]:
        t = time.perf_counter()
        tr = train(run, Path("/tmp"), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
        print(run, v, round(time.perf_counter() - t, 1), {k: round(x, 3) for k, x in tr.metrics.items()},
              symptom(run, tr))
