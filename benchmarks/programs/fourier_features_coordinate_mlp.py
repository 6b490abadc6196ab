"""A coordinate MLP with Gaussian Fourier-feature positional encoding fitted to one image (NeRF-style 2D image
regression): (x, y) in the unit square -> [sin(2 pi B x), cos(2 pi B x)] -> a ReLU MLP -> a sigmoid intensity.
Trained on every other pixel, scored on the pixels it never saw.

Written after tancik/fourier-feature-networks `Demo.ipynb` (and the PyTorch translations of it; read through the
`search` tool, code corpus): `coords = linspace(0, 1, H, endpoint=False)`, `x_test = stack(meshgrid(coords,
coords), -1)`, `train_data = [x_test[::2, ::2], img[::2, ::2]]`, `input_mapping(x, B) = concat([sin(2 pi x @ B.T),
cos(2 pi x @ B.T)])` with `B = scale * randn(mapping_size, 2)` for scales 1, 10 and 100, a 4-layer ReLU MLP with a
sigmoid output, Adam, MSE, PSNR; and after yenchenlin/nerf-pytorch `run_nerf.py`'s training loop: a random batch of
`N_rand` rays (here pixels) from the shuffled training set each step, reshuffled when exhausted; Adam at `lrate`
5e-4; the learning rate set by hand every step, `decay_rate = 0.1; decay_steps = args.lrate_decay * 1000;
new_lrate = args.lrate * decay_rate ** (global_step / decay_steps)` (`--lrate_decay` is "exponential learning rate
decay (in 1000 steps)", 250 by default); `img2mse`, `mse2psnr`; and checkpoints every `i_weights` steps as
`{:06d}.tar` holding `{"global_step", "network_fn_state_dict", "optimizer_state_dict"}` (no fine network here).
Here: a 64x64 grey test image made in code (a smooth shading, a few disks and bars, a 3-cycle grating) with
Gaussian sensor noise of std 0.02; training pixels the 32x32 even grid (1024), validation the other 3072 pixels;
`N_rand` 256; Fourier scale 1.5 with mapping size 64; a 4-layer 64-wide MLP; 3000 steps, a checkpoint every 200.

The healthy run is an unusual one: its loss has a floor that is not 0. The targets carry sensor noise (variance
0.0004) that no function of the coordinates predicts on held-out pixels, and the interpolation between training
pixels is imperfect, so the validation MSE levels off at ~0.0007-0.0015 (PSNR 28-31 dB, by seed) and stays there;
only the training MSE keeps creeping down (the MLP slowly memorises the training pixels' noise).

Runs
- healthy: scale 1.5, `lrate_decay` 250 (i.e. 250k steps, the LR barely moves over this run); checkpoint
  `000400.tar` (step 400), while validation is still improving.
- lrate_decay_in_steps: the owner copied a `decay_lr` helper that reads `decay_steps = args.lrate_decay` (some NeRF
  re-implementations take the decay in steps) but kept nerf-pytorch's config value `lrate_decay = 250`, which that
  file means in thousands of steps. The LR is multiplied by 0.1 every 250 steps instead of every 250,000: 5e-7 by
  step 750, 5e-16 at step 3000. The loss drops for the first ~300 steps, then freezes: the training MSE over the
  last 750 steps equals that of the 750 before (the healthy schedule keeps lowering it several-fold). The unit
  confusion is a real one: nerf-pytorch's `--lrate_decay` help text ("exponential learning rate decay (in 1000
  steps)") and its `decay_steps = args.lrate_decay * 1000` line exist because the flag is not in steps, while
  re-implementations (e.g. a `decay_lr(args, global_step, optimizer)` with `decay_steps = args.lrate_decay`, found
  through the code search) expect a value in steps. Root cause `lr_schedule_decayed`: the LR at the checkpoint
  (step 3000) is ~1e-15 of its 5e-4 peak; the decay in thousands of steps (`decay_in_thousands`) trains. Competing
  fix a user tries first: a 10x higher `lrate` (`lrate_x10`), which the same decay crushes just as fast.
- fourier_scale_too_high: the owner took the Fourier-feature scale that looked sharpest on the training pixels
  (`scale = 20`, between the demo's own "gauss_10" and "gauss_100") for an image sampled at 32x32 training points.
  Frequencies above the training grid's Nyquist limit (16 cycles) let the MLP interpolate the training pixels
  exactly, noise included, with high-frequency speckle in between: the training MSE falls to ~1e-6 while the
  validation MSE on the held-out pixels rises ~50% above its early best (PSNR down ~2 dB, to 15-19 dB). The paper's
  and the demo's comparison of scales shows exactly this ("too high a scale" overfits, with noisy high-frequency
  artefacts). Root cause `overfitting`: train falls while validation rises; a scale matched to the sampling
  (`scale_1.5`) generalises (held-out PSNR ~30 dB). Competing fix a user tries first: a 10x lower LR (`lrate_x0.1`),
  which only delays the same memorising by a few hundred steps. The checkpoint is the last one (step 3000).

Triage setup: the model (the encoding matrix B is a buffer), Adam, `loss_fn` = MSE of a `{"coords", "rgb"}` batch of
256 pixels, 48 batches of the training pixels in the order the run would draw them after the checkpoint, the
held-out pixels as `val_batches`, and a LambdaLR giving nerf-pytorch's per-step exponential decay as the run
configures it (`scheduler_interval="step"`).
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
    name="fourier_features_coordinate_mlp",
    kind="coordinate MLP with positional encoding (NeRF-style image fitting)",
    original="tancik/fourier-feature-networks: Demo.ipynb (input_mapping, every-other-pixel split) + "
             "yenchenlin/nerf-pytorch: run_nerf.py (N_rand batches, lrate_decay schedule, {:06d}.tar checkpoints)",
    runs={
        "healthy": Run(cause="healthy", story="Fourier-feature MLP fitted to a noisy 64x64 image from every other "
                       "pixel; held-out MSE falls toward its floor (~0.001, it cannot reach 0: sensor noise); "
                       "checkpoint at step 400."),
        "lrate_decay_in_steps": Run(
            cause="lr_schedule_decayed",
            story="The loss dropped for a few hundred steps and then froze completely for the remaining 2700 steps. "
                  "A 10x higher lrate did not help.",
            fix="decay_in_thousands", competing=("lrate_x10",)),
        "fourier_scale_too_high": Run(
            cause="overfitting",
            story="Training pixels fit almost perfectly, but the held-out pixels get worse the longer it trains "
                  "(noisy speckle between the training pixels). A lower LR only slowed it down.",
            fix="scale_1.5", competing=("lrate_x0.1",)),
    },
)

H = 64
NOISE = 0.02
MAPPING, WIDTH, N_RAND = 64, 64, 256
LRATE, ITERS, I_WEIGHTS = 5e-4, 3000, 200
CKPT_STEP = {"healthy": 400}


def make_image(seed: int):
    g = np.random.default_rng(100 + seed)
    c = (np.arange(H) + 0.5) / H
    yy, xx = np.meshgrid(c, c, indexing="ij")
    img = 0.35 + 0.25 * xx * yy + 0.1 * np.sin(2 * np.pi * 3 * (xx * math.cos(0.6 + seed) + yy * math.sin(0.6 + seed)))
    for _ in range(4):                                   # disks
        cx, cy, r, v = g.uniform(0.15, 0.85), g.uniform(0.15, 0.85), g.uniform(0.06, 0.16), g.uniform(-0.3, 0.3)
        img = img + v * ((xx - cx) ** 2 + (yy - cy) ** 2 < r ** 2)
    for _ in range(2):                                   # bars
        x0, w, v = g.uniform(0.1, 0.8), g.uniform(0.04, 0.1), g.uniform(-0.2, 0.2)
        img = img + v * ((xx > x0) & (xx < x0 + w) & (yy > 0.2) & (yy < 0.8))
    img = np.clip(img, 0.05, 0.95) + NOISE * g.standard_normal((H, H))
    return torch.tensor(img, dtype=torch.float32)


def make_data(seed: int):
    img = make_image(seed)
    coords = torch.arange(H, dtype=torch.float32) / H                   # linspace(0, 1, H, endpoint=False)
    grid = torch.stack(torch.meshgrid(coords, coords, indexing="ij"), -1)   # (H, H, 2)
    train_mask = torch.zeros(H, H, dtype=torch.bool)
    train_mask[::2, ::2] = True
    train = {"coords": grid[train_mask], "rgb": img[train_mask][:, None]}
    val = {"coords": grid[~train_mask], "rgb": img[~train_mask][:, None]}
    return train, val


def ray_batches(train, seed: int, start_step: int, n_steps: int):
    """nerf-pytorch's `i_batch` walk over the shuffled training rays: N_rand per step, reshuffled when used up."""
    n = len(train["coords"])
    per_epoch = n // N_RAND
    out = []
    for step in range(start_step, start_step + n_steps):
        epoch, i = divmod(step, per_epoch)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 10007 + epoch))
        idx = perm[i * N_RAND:(i + 1) * N_RAND]
        out.append({"coords": train["coords"][idx], "rgb": train["rgb"][idx]})
    return out


def val_batches(val):
    n = len(val["coords"])
    return [{"coords": val["coords"][i:i + 1024], "rgb": val["rgb"][i:i + 1024]} for i in range(0, n, 1024)]


class FourierMLP(nn.Module):
    def __init__(self, scale: float, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("B", scale * torch.randn(MAPPING, 2, generator=g))
        layers, d = [], 2 * MAPPING
        for _ in range(3):
            layers += [nn.Linear(d, WIDTH), nn.ReLU()]
            d = WIDTH
        self.net = nn.Sequential(*layers, nn.Linear(d, 1))

    def input_mapping(self, x):
        x_proj = (2.0 * math.pi * x) @ self.B.T
        return torch.cat([torch.sin(x_proj), torch.cos(x_proj)], dim=-1)

    def forward(self, x):
        return torch.sigmoid(self.net(self.input_mapping(x)))


def img2mse(x, y):
    return torch.mean((x - y) ** 2)


def mse2psnr(x):
    return -10.0 * math.log10(max(x, 1e-12))


def loss_fn(model, batch):
    return img2mse(model(batch["coords"]), batch["rgb"])


def config(run: str, variant: str | None):
    scale = 20.0 if run == "fourier_scale_too_high" and variant != "scale_1.5" else 1.5
    lrate = LRATE * {"lrate_x10": 10.0, "lrate_x0.1": 0.1}.get(variant, 1.0)
    lrate_decay = 250
    in_steps = run == "lrate_decay_in_steps" and variant != "decay_in_thousands"
    decay_steps = lrate_decay if in_steps else lrate_decay * 1000
    return scale, lrate, decay_steps


def build(run: str, seed: int, variant: str | None):
    scale, lrate, decay_steps = config(run, variant)
    torch.manual_seed(seed)
    model = FourierMLP(scale, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lrate, betas=(0.9, 0.999))
    return model, optimizer, lrate, decay_steps


@torch.no_grad()
def evaluate(model, batches):
    total, n = 0.0, 0
    for b in batches:
        total += float(img2mse(model(b["coords"]), b["rgb"])) * len(b["rgb"])
        n += len(b["rgb"])
    return total / n


def ckpt_step(run: str) -> int:
    return CKPT_STEP.get(run, ITERS)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_set, val = make_data(seed)
    vb = val_batches(val)
    model, optimizer, lrate, decay_steps = build(run, seed, variant)
    last = ckpt_step(run)
    losses, vals, val_steps, lr = [], [], [], lrate
    ckpt = None
    batches = ray_batches(train_set, seed, 0, last)
    for i, batch in enumerate(batches, start=1):
        loss = loss_fn(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        # nerf-pytorch: update the learning rate by hand after every step
        lr = lrate * (0.1 ** ((i) / decay_steps))
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        losses.append(loss.item())
        if i % 50 == 0:
            vals.append(evaluate(model, vb))
            val_steps.append(i)
        if i % I_WEIGHTS == 0:
            ckpt = Path(out_dir) / f"{i:06d}.tar"
            torch.save({"global_step": i, "network_fn_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict()}, ckpt)
    half = len(vals) // 2
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"steps": last, "train_mse": float(np.mean(losses[-50:])),
                            "train_first": float(np.mean(losses[:10])), "val_min": min(vals),
                            "val_min_step": val_steps[int(np.argmin(vals))], "val_last": vals[-1],
                            "val_half": vals[half - 1], "val_first": vals[0], "lr_final": lr, "lr_peak": lrate})


def symptom(run: str, trained: Trained) -> str | None:
    m, tl = trained.metrics, trained.train_losses
    said = []
    if run in ("healthy", "fourier_scale_too_high"):
        # a rise a user sees: by a quarter, and by more than 5x the noise variance (0.0004) in MSE
        if m["val_last"] > 1.25 * m["val_min"] and m["val_last"] - m["val_min"] > 0.002 and m["train_mse"] < m["val_min"]:
            said.append(f"training MSE {m['train_first']:.4f} -> {m['train_mse']:.5f} while held-out MSE rose from "
                        f"{m['val_min']:.4f} (step {m['val_min_step']}) to {m['val_last']:.4f} at step {m['steps']} "
                        f"(PSNR {mse2psnr(m['val_min']):.1f} -> {mse2psnr(m['val_last']):.1f} dB)")
    if run in ("healthy", "lrate_decay_in_steps"):
        n = len(tl) // 4                                  # the last quarter of the run against the quarter before
        before, after = float(np.mean(tl[-2 * n:-n])), float(np.mean(tl[-n:]))
        if after > 0.9 * before:
            said.append(f"training MSE {m['train_first']:.4f} -> {before:.5f} (steps {len(tl) - 2 * n}-{len(tl) - n})"
                        f" -> {after:.5f} (last {n} steps): frozen; held-out PSNR {mse2psnr(m['val_last']):.1f} dB "
                        f"at step {m['steps']}; lr now {m['lr_final']:.1e} (peak {m['lr_peak']:.0e})")
    return "; ".join(said) or None


def _setup(run: str):
    import triage

    train_set, val = make_data(0)
    model, optimizer, lrate, decay_steps = build(run, 0, None)
    at = ckpt_step(run)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.1 ** (step / decay_steps))
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=ray_batches(train_set, 0, at, 48),
                        val_batches=val_batches(val), scheduler=sched, scheduler_interval="step",
                        total_steps=ITERS)


def setup_healthy():
    return _setup("healthy")


def setup_lrate_decay_in_steps():
    return _setup("lrate_decay_in_steps")


def setup_fourier_scale_too_high():
    return _setup("fourier_scale_too_high")
