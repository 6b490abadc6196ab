"""A small DDPM denoiser on sklearn's 8x8 digits: noise prediction, min-SNR-weighted MSE, EMA, cosine + warmup.

Follows huggingface/diffusers examples/unconditional_image_generation/train_unconditional.py (read: images
normalised to [-1, 1]; `noise = torch.randn(clean_images.shape)`; `timesteps = torch.randint(0,
noise_scheduler.config.num_train_timesteps, (bsz,))`; `noisy_images = noise_scheduler.add_noise(clean_images,
noise, timesteps)`; `model_output = model(noisy_images, timesteps).sample`; for prediction_type "epsilon"
`loss = F.mse_loss(model_output.float(), noise.float())`; `accelerator.clip_grad_norm_(model.parameters(), 1.0)`;
`torch.optim.AdamW(lr, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-08)`; `get_scheduler("cosine",
num_warmup_steps, num_training_steps)` stepped every optimizer step; `EMAModel(..., decay=0.9999)` stepped after
each update; a checkpoint every `checkpointing_steps` as checkpoint-{global_step}) and the min-SNR-gamma loss
weighting of diffusers' examples/text_to_image/train_text_to_image.py (`--snr_gamma 5.0`:
`snr = compute_snr(noise_scheduler, timesteps)`, `mse_loss_weights = torch.stack([snr, snr_gamma *
torch.ones_like(timesteps)], dim=1).min(dim=1)[0] / snr`, `loss = (mse per example * mse_loss_weights).mean()`).
diffusers is not installed: the DDPM noise schedule (linear betas 1e-4 .. 0.02 over 1000 steps, `add_noise`,
`rescale_zero_terminal_snr` as DDPMScheduler(rescale_betas_zero_snr=True) does it), `compute_snr`,
`get_cosine_schedule_with_warmup` (a LambdaLR) and the EMA are written here. The denoiser is a small conv net
with a sinusoidal timestep embedding (UNet2DModel's idea in small). The owner saves one dict per checkpoint
{'global_step', 'model', 'optimizer', 'lr_scheduler', 'ema'}.

Runs
- healthy: the recipe with the plain linear schedule. The epsilon-MSE cannot reach 0 (at small t the noise is
  barely recoverable from the image) and is noisy step to step (each step draws its own timesteps): after a
  fast first drop from ~1 to ~0.1 it creeps to ~0.05-0.07. Checkpoint: checkpoint-200 of 448 steps, still
  improving.
- zero_snr_nan: the owner resumed from checkpoint-200 with the noise schedule switched to zero terminal SNR
  (Lin et al. 2023, "Common Diffusion Noise Schedules and Sample Steps are Flawed", which proposes fine-tuning
  to it; DDPMScheduler(rescale_betas_zero_snr=True)) and kept --snr_gamma 5. At t = 999 the SNR is exactly 0, the weight min(0, 5) / 0 is 0/0 = NaN, and the first batch that
  draws t = 999 (one timestep in 1000, a batch of 32: a few percent of the steps) turns the loss, then the
  gradients and every weight, to NaN. This is TiankaiHang/Min-SNR-Diffusion-Training PR #4 "Fix zero / infinite
  weight position when using rescaled betas for zero-terminal SNR" ("Without this fix, step loss goes to NaN and
  the model is broken") and bghira/SimpleTuner PR #187 "SDXL: zero terminal SNR goes to NaN without this line".
  Root cause: numerical_instability (a division with a domain edge; guarding it, weight 1 where snr == 0, the
  limit of min(snr, gamma) / snr, removes the NaN). Competing fix a user tries first: a 10x lower learning rate
  (the same 0/0 is hit at the same step). Gradient clipping is already on (1.0), as in the example.
  The NaN comes 9-61 steps after the resume (seeds 0-2). Checkpoint: the last periodic one before the NaN
  (checkpointing every 10 steps; checkpoint-200 for seed 0), whose weights are finite.
"""

from __future__ import annotations

import math
import sys
import time
from copy import deepcopy
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="ddpm_diffusion",
    kind="generative",
    original="huggingface/diffusers: examples/unconditional_image_generation/train_unconditional.py "
             "(+ min-SNR weighting of examples/text_to_image/train_text_to_image.py)",
    runs={
        "healthy": Run(cause="healthy", story="DDPM denoiser on digits with min-SNR weighting, cosine + warmup, EMA; "
                                              "loss drops fast then creeps (floor far above 0); checkpoint at step "
                                              "200 of 448."),
        "zero_snr_nan": Run(
            cause="numerical_instability",
            story="I resumed from checkpoint-200 with a zero-terminal-SNR noise schedule (snr_gamma 5 kept); the loss "
                  "went to NaN a few steps later; lowering the LR did not help.",
            fix="guard_snr",
            competing=("lr_x0.1",),
        ),
    },
)

T = 1000
BATCH = 32
EPOCHS = 8
LR = 1e-3
WARMUP = 20
SNR_GAMMA = 5.0
CHECKPOINTING_STEPS = 10
RESUME_STEP = 200          # zero_snr_nan: resumed from checkpoint-200 with the zero-terminal-SNR schedule


# --- the noise schedule ---------------------------------------------------------------------------------------
def rescale_zero_terminal_snr(betas):
    alphas_bar_sqrt = torch.cumprod(1.0 - betas, dim=0).sqrt()
    a0, aT = alphas_bar_sqrt[0].clone(), alphas_bar_sqrt[-1].clone()
    alphas_bar_sqrt = (alphas_bar_sqrt - aT) * (a0 / (a0 - aT))
    alphas_bar = alphas_bar_sqrt ** 2
    alphas = torch.cat([alphas_bar[0:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


class DDPMScheduler:
    def __init__(self, num_train_timesteps=T, beta_start=1e-4, beta_end=0.02, rescale_betas_zero_snr=False):
        self.num_train_timesteps = num_train_timesteps
        betas = torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float64)
        if rescale_betas_zero_snr:
            betas = rescale_zero_terminal_snr(betas)
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).float()

    def add_noise(self, original, noise, timesteps):
        sqrt_alpha_prod = self.alphas_cumprod[timesteps].sqrt().view(-1, 1, 1, 1)
        sqrt_one_minus = (1 - self.alphas_cumprod[timesteps]).sqrt().view(-1, 1, 1, 1)
        return sqrt_alpha_prod * original + sqrt_one_minus * noise


def compute_snr(noise_scheduler, timesteps):
    alpha = noise_scheduler.alphas_cumprod[timesteps].sqrt()
    sigma = (1.0 - noise_scheduler.alphas_cumprod[timesteps]).sqrt()
    return (alpha / sigma) ** 2


# --- the denoiser ---------------------------------------------------------------------------------------------
def timestep_embedding(timesteps, dim=32):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = timesteps.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, ch, temb_ch):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, ch)
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.temb_proj = nn.Linear(temb_ch, ch)
        self.norm2 = nn.GroupNorm(8, ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


class TinyUNet(nn.Module):
    def __init__(self, ch=32, temb_ch=64):
        super().__init__()
        self.time_embedding = nn.Sequential(nn.Linear(32, temb_ch), nn.SiLU(), nn.Linear(temb_ch, temb_ch))
        self.conv_in = nn.Conv2d(1, ch, 3, padding=1)
        self.blocks = nn.ModuleList([ResBlock(ch, temb_ch) for _ in range(3)])
        self.norm_out = nn.GroupNorm(8, ch)
        self.conv_out = nn.Conv2d(ch, 1, 3, padding=1)

    def forward(self, sample, timesteps):
        temb = self.time_embedding(timestep_embedding(timesteps))
        h = self.conv_in(sample)
        for block in self.blocks:
            h = block(h, temb)
        return self.conv_out(F.silu(self.norm_out(h)))


class EMAModel:
    def __init__(self, model, decay=0.9999):
        self.shadow = deepcopy(model).requires_grad_(False)
        self.decay, self.optimization_step = decay, 0

    @torch.no_grad()
    def step(self, model):
        self.optimization_step += 1
        d = min(self.decay, (1 + self.optimization_step) / (10 + self.optimization_step))
        for s, p in zip(self.shadow.parameters(), model.parameters()):
            s.mul_(d).add_(p.detach(), alpha=1 - d)


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, num_cycles=0.5):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


# --- the run --------------------------------------------------------------------------------------------------
def make_data():
    from sklearn.datasets import load_digits

    d = load_digits()
    return torch.tensor(d.data, dtype=torch.float32).view(-1, 1, 8, 8) / 8.0 - 1.0     # [0, 16] -> [-1, 1]


def _epoch_batches(images, seed, epoch):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(images), generator=g)
    n = len(images) // BATCH * BATCH
    return [{"input": images[perm[i:i + BATCH]]} for i in range(0, n, BATCH)]


def make_loss(noise_scheduler, guard_snr: bool):
    def loss_fn(model, batch):
        clean_images = batch["input"]
        noise = torch.randn(clean_images.shape)
        bsz = clean_images.shape[0]
        timesteps = torch.randint(0, noise_scheduler.num_train_timesteps, (bsz,)).long()
        noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
        model_output = model(noisy_images, timesteps)
        snr = compute_snr(noise_scheduler, timesteps)
        mse_loss_weights = torch.stack([snr, SNR_GAMMA * torch.ones_like(timesteps)], dim=1).min(dim=1)[0] / snr
        if guard_snr:
            mse_loss_weights[snr == 0] = 1.0
        loss = F.mse_loss(model_output.float(), noise.float(), reduction="none")
        loss = loss.mean(dim=list(range(1, len(loss.shape)))) * mse_loss_weights
        return loss.mean()
    return loss_fn


def _zero_snr(run):
    return run == "zero_snr_nan"


def _build(run, seed, variant, resumed=True):
    torch.manual_seed(seed)
    model = TinyUNet()
    noise_scheduler = DDPMScheduler(num_train_timesteps=T, rescale_betas_zero_snr=_zero_snr(run) and resumed)
    lr = LR * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-08)
    steps_per_epoch = 1797 // BATCH
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, WARMUP, steps_per_epoch * EPOCHS)
    loss_fn = make_loss(noise_scheduler, guard_snr=(variant == "guard_snr"))
    return model, optimizer, lr_scheduler, loss_fn


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    images = make_data()
    model, optimizer, lr_scheduler, loss_fn = _build(run, seed, variant, resumed=False)
    ema_model = EMAModel(model)
    global_step, losses, ckpt, nan_step = 0, [], None, None
    for epoch in range(EPOCHS):
        model.train()
        for batch in _epoch_batches(images, seed, epoch):
            if _zero_snr(run) and global_step == RESUME_STEP:
                # --resume_from_checkpoint checkpoint-200 --rescale_betas_zero_snr: same weights, optimizer and
                # LR schedule, the new noise schedule
                noise_scheduler = DDPMScheduler(num_train_timesteps=T, rescale_betas_zero_snr=True)
                loss_fn = make_loss(noise_scheduler, guard_snr=(variant == "guard_snr"))
            loss = loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            ema_model.step(model)
            global_step += 1
            losses.append(loss.item())
            if nan_step is None and not math.isfinite(losses[-1]):
                nan_step = global_step
            periodic = global_step % CHECKPOINTING_STEPS == 0
            if (run == "healthy" and global_step == 200) or (
                    run != "healthy" and periodic and nan_step is None and global_step >= RESUME_STEP):
                ckpt = out_dir / f"checkpoint-{global_step}.pt"
                torch.save({"global_step": global_step, "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(), "lr_scheduler": lr_scheduler.state_dict(),
                            "ema": ema_model.shadow.state_dict()}, ckpt)
    metrics = {"first": sum(losses[:50]) / 50, "last": sum(losses[-50:]) / 50,
               "steps": global_step}
    if nan_step is not None:
        metrics["nan_step"] = nan_step
    return Trained(checkpoint=ckpt, train_losses=losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if "nan_step" in m:
        return (f"loss went to NaN at step {m['nan_step']:.0f}, {m['nan_step'] - RESUME_STEP:.0f} steps after resuming "
                f"with the zero-terminal-SNR schedule (first 50 steps' mean loss {m['first']:.3f})")
    if run == "healthy" and not m["last"] < 0.85 * m["first"]:
        return f"healthy denoiser did not train: loss {m['first']:.3f} -> {m['last']:.3f}"
    return None


def _ckpt_step(run):
    if run == "healthy":
        return 200
    # the owner's log: the last checkpoint-N before the NaN (seed 0)
    return (_nan_step(0) - 1) // CHECKPOINTING_STEPS * CHECKPOINTING_STEPS


def _nan_step(seed):
    """The step at which a batch after the resume first draws t = T - 1, replaying the run's RNG without training."""
    torch.manual_seed(seed)
    TinyUNet()
    images = make_data()
    step = 0
    for epoch in range(EPOCHS):
        for batch in _epoch_batches(images, seed, epoch):
            step += 1
            torch.randn(batch["input"].shape)
            t = torch.randint(0, T, (batch["input"].shape[0],))
            if step > RESUME_STEP and bool((t == T - 1).any()):
                return step
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    images = make_data()
    model, optimizer, lr_scheduler, loss_fn = _build(run, 0, None)
    step = _ckpt_step(run)
    steps_per_epoch = 1797 // BATCH
    batches = []
    for epoch in range(EPOCHS):
        batches += _epoch_batches(images, 0, epoch)
    batches = batches[step:step + 48]                     # the batches the run took after the checkpoint
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches,
                        scheduler=lr_scheduler, grad_clip=1.0, total_steps=steps_per_epoch * EPOCHS)


def setup_healthy():
    return _setup("healthy")


def setup_zero_snr_nan():
    return _setup("zero_snr_nan")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for s in range(3):
        print("nan step", s, _nan_step(s))
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            if r == "healthy" and v is not None:
                continue
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      tr.checkpoint.name if tr.checkpoint else None,
                      [round(x, 3) for x in tr.train_losses[::40]], symptom(r, tr))
