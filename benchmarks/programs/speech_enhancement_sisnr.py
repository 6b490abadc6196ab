"""A small Conv-TasNet denoiser trained on negative SI-SNR, on synthetic voiced signals plus noise made in code.

Follows the Conv-TasNet recipes (kaituoxu/Conv-TasNet `src/conv_tasnet.py`, `src/pit_criterion.py`,
`src/solver.py`; asteroid's `ConvTasNet` and `losses/sdr.py` `SingleSrcNegSDR("sisdr")`, its
`egs/*/ConvTasNet/train.py`): a learned 1-D conv encoder (kernel L, stride L/2) with a ReLU, a separator of
dilated depthwise-separable TCN blocks with global layer norm and PReLU, a sigmoid mask, a transposed-conv
decoder whose output is `[batch, n_src, time]`; the loss is minus the scale-invariant SNR (both signals made
zero-mean, `s_target = <est, s> s / ||s||^2`, `10 log10(||s_target||^2 / ||est - s_target||^2)`), so it is
negative once the model works (kaituoxu/Conv-TasNet#1 asks exactly why the loss is negative); Adam at 1e-3,
global-norm clipping at 5 (asteroid's `gradient_clip_val=5`, kaituoxu's `max_norm`), ReduceLROnPlateau
(factor 0.5) on the validation loss stepped once an epoch, and an epoch checkpoint holding the model, the
optimizer, the scheduler, the epoch and the per-epoch train / validation losses (kaituoxu's `serialize`
keeps `tr_loss` / `cv_loss` in the package as well).

Data: 1-second-like clips of 1024 samples: a voiced source (a fundamental gliding in pitch with four
harmonics, under a syllable envelope) plus white or low-passed noise at -5..5 dB SNR; train / validation
clips drawn from separate seeds. The metric the owner watches is the validation SI-SNR improvement (SI-SNRi,
dB) over the noisy mixture.

Runs:
- healthy: the recipe as written. Its loss is negative by nature (about +10 in the first epoch, a fresh
  model's estimate being worse than the mixture, about -5 and still falling at the checkpoint, the end of epoch
  5 of 7); validation SI-SNRi climbs past 5 dB.
- sisnr_broadcast: the owner's decoder returns `[B, 1, T]` (one source) while the clean batch is `[B, T]`,
  and their own `si_snr(est, clean)` reduces over the last axis with `keepdim=True`: `[B,1,T] * [B,T]`
  broadcasts to `[B, B, T]`, so every estimate is scored against every clean signal in the batch and the
  loss is the mean over all pairs. Nothing raises (no warning either: it is not `F.mse_loss`); the loss
  sits near +26 and the honest validation SI-SNRi stays below 0 dB (the recipe passes 5 dB). The silent extra-dimension
  broadcast in a loss is a recurring bug (prob-ml/bliss#1063 "loss shape broadcast mismatch caused by extra
  dim of size 1", auspicious3000/autovc#94 "shape mismatch in loss calculation ... seriously hurts
  learning", IntelLabs/matsciml#347). Root cause `wrong_loss`: the loss the outputs call for (the same
  SI-SNR on matching shapes, variant `squeeze`) trains; the owner's first tries, a lower LR (`lr_low`,
  1e-4) and a higher one (`lr_high`, 3e-3), leave the plateau.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="speech_enhancement_sisnr",
    kind="speech enhancement (time-domain masking, SI-SNR)",
    original="kaituoxu/Conv-TasNet: src/conv_tasnet.py, src/pit_criterion.py, src/solver.py "
             "(and asteroid: losses/sdr.py, egs ConvTasNet train.py)",
    runs={
        "healthy": Run(cause="healthy", story=(
            "Conv-TasNet-lite denoiser on negative SI-SNR: the loss is negative and keeps falling "
            "(about -5 dB at the epoch-5 checkpoint), validation SI-SNRi rising.")),
        "sisnr_broadcast": Run(
            cause="wrong_loss",
            story=("My si_snr(est, clean) got the decoder's [B, 1, T] output against the [B, T] clean batch; it "
                   "broadcast to [B, B, T] and averaged every estimate against every clean clip. The loss sat "
                   "at about +26 and validation SI-SNRi stayed below 0 dB while the recipe passes 5 dB here."),
            fix="squeeze", competing=("lr_low", "lr_high")),
    },
)

T = 1024
BATCH = 16
N_TRAIN, N_VAL = 512, 128            # 32 training batches an epoch
STEPS_PER_EPOCH = N_TRAIN // BATCH
EPOCHS_RUN = 7
CKPT_EPOCH = 5                       # the epoch checkpoint triaged (5 epochs done)
LR = 1e-3
CLIP = 5.0
EPS = 1e-8


# ------------------------------------------------------------------------------------------------------ data
def make_clips(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(T).float()
    f0 = 0.01 + 0.03 * torch.rand(n, 1, generator=g)                       # cycles / sample
    glide = (torch.rand(n, 1, generator=g) - 0.5) * 0.02
    inst = f0 + glide * t / T
    phase = 2 * math.pi * torch.cumsum(inst.expand(n, T), dim=1)
    amps = torch.rand(n, 4, generator=g) * torch.tensor([1.0, 0.6, 0.4, 0.25])
    clean = sum(amps[:, k:k + 1] * torch.sin((k + 1) * phase) for k in range(4))
    syll = 2 + torch.randint(0, 3, (n, 1), generator=g)                    # syllables per clip
    env = torch.sin(math.pi * syll * t / T).abs() ** 1.5
    clean = clean * env
    white = torch.randn(n, T, generator=g)
    lowpassed = torch.nn.functional.avg_pool1d(torch.randn(n, 1, T + 7, generator=g), 8, stride=1).squeeze(1) * 2.5
    use_white = (torch.rand(n, 1, generator=g) < 0.5).float()
    noise = use_white * white + (1 - use_white) * lowpassed
    snr_db = -5 + 10 * torch.rand(n, 1, generator=g)
    p_s = clean.pow(2).mean(1, keepdim=True)
    p_n = noise.pow(2).mean(1, keepdim=True)
    noise = noise * torch.sqrt(p_s / (p_n * 10 ** (snr_db / 10)))
    mix = clean + noise
    scale = mix.abs().amax(1, keepdim=True) + 1e-8                         # peak-normalise the pair
    return mix / scale, clean / scale


def batches_of(mix, clean, epoch: int | None, seed: int):
    idx = torch.arange(len(mix))
    if epoch is not None:
        idx = torch.randperm(len(mix), generator=torch.Generator().manual_seed(seed * 100 + epoch))
    return [(mix[idx[i:i + BATCH]], clean[idx[i:i + BATCH]]) for i in range(0, len(mix) - BATCH + 1, BATCH)]


# ----------------------------------------------------------------------------------------------------- model
class GlobalLayerNorm(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(1, ch, 1))
        self.beta = nn.Parameter(torch.zeros(1, ch, 1))

    def forward(self, x):
        mean = x.mean(dim=(1, 2), keepdim=True)
        var = ((x - mean) ** 2).mean(dim=(1, 2), keepdim=True)
        return self.gamma * (x - mean) / torch.sqrt(var + 1e-8) + self.beta


class TemporalBlock(nn.Module):
    def __init__(self, B, H, P, dilation):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(B, H, 1, bias=False), nn.PReLU(), GlobalLayerNorm(H),
            nn.Conv1d(H, H, P, padding=(P - 1) * dilation // 2, dilation=dilation, groups=H, bias=False),
            nn.PReLU(), GlobalLayerNorm(H), nn.Conv1d(H, B, 1, bias=False))

    def forward(self, x):
        return x + self.net(x)


class ConvTasNet(nn.Module):
    """N filters of length L, B bottleneck, H conv channels, P kernel, X blocks, C sources (1: enhancement)."""

    def __init__(self, N=32, L=16, B=32, H=64, P=3, X=4, C=1):
        super().__init__()
        self.L, self.N, self.C = L, N, C
        self.encoder = nn.Conv1d(1, N, L, stride=L // 2, bias=False)
        self.separator = nn.Sequential(
            GlobalLayerNorm(N), nn.Conv1d(N, B, 1, bias=False),
            *[TemporalBlock(B, H, P, 2 ** i) for i in range(X)],
            nn.PReLU(), nn.Conv1d(B, C * N, 1, bias=False))
        self.decoder = nn.ConvTranspose1d(N, 1, L, stride=L // 2, bias=False)

    def forward(self, mixture):                     # [B, T] -> [B, C, T]
        w = torch.relu(self.encoder(mixture.unsqueeze(1)))               # [B, N, K]
        mask = torch.sigmoid(self.separator(w)).view(w.shape[0], self.C, self.N, -1)
        est = self.decoder((w.unsqueeze(1) * mask).view(-1, self.N, w.shape[-1]))   # [B*C, 1, T']
        est = est.view(w.shape[0], self.C, -1)
        return nn.functional.pad(est, (0, mixture.shape[-1] - est.shape[-1]))


# ------------------------------------------------------------------------------------------------------ loss
def si_snr(est: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SI-SNR in dB over the last axis, per pair of signals (shapes broadcast, as the owner wrote it)."""
    est = est - est.mean(dim=-1, keepdim=True)
    target = target - target.mean(dim=-1, keepdim=True)
    dot = (est * target).sum(dim=-1, keepdim=True)
    s_target = dot * target / (target.pow(2).sum(dim=-1, keepdim=True) + EPS)
    e_noise = est - s_target
    return 10 * torch.log10(s_target.pow(2).sum(-1) / (e_noise.pow(2).sum(-1) + EPS) + EPS)


def make_loss_fn(run: str, variant: str | None = None):
    squeeze = not (run == "sisnr_broadcast" and variant != "squeeze")

    def loss_fn(model, batch):
        mixture, clean = batch
        est = model(mixture)                        # [B, 1, T]
        if squeeze:
            est = est.squeeze(1)                    # the recipe: one source, [B, T] against [B, T]
        return -si_snr(est, clean).mean()
    return loss_fn


@torch.no_grad()
def sisnr_improvement(model, mix, clean) -> float:
    model.eval()
    est = model(mix).squeeze(1)
    model.train()
    return float((si_snr(est, clean) - si_snr(mix, clean)).mean())


def build(variant: str | None = None):
    model = ConvTasNet()
    lr = {"lr_low": 1e-4, "lr_high": 3e-3}.get(variant, LR)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=2)
    return model, opt, sched


# ----------------------------------------------------------------------------------------------------- train
def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    tr_mix, tr_clean = make_clips(N_TRAIN, seed)
    cv_mix, cv_clean = make_clips(N_VAL, seed + 50_000)
    cv_batches = batches_of(cv_mix, cv_clean, None, seed)
    model, opt, sched = build(variant)
    loss_fn = make_loss_fn(run, variant)
    step_losses, tr_loss, cv_loss, sisnri = [], [], [], []
    ckpt = out_dir / f"epoch{CKPT_EPOCH}.pth.tar"
    for epoch in range(EPOCHS_RUN):
        model.train()
        total = 0.0
        for batch in batches_of(tr_mix, tr_clean, epoch, seed):
            loss = loss_fn(model, batch)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            step_losses.append(float(loss.item()))
            total += step_losses[-1]
        tr_loss.append(total / STEPS_PER_EPOCH)
        model.eval()
        with torch.no_grad():
            cv = float(np.mean([loss_fn(model, b).item() for b in cv_batches]))
        model.train()
        cv_loss.append(cv)
        sched.step(cv)
        sisnri.append(sisnr_improvement(model, cv_mix, cv_clean))
        if epoch + 1 == CKPT_EPOCH:
            torch.save({"model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
                        "scheduler": sched.state_dict(), "epoch": epoch + 1,
                        "tr_loss": torch.tensor(tr_loss), "cv_loss": torch.tensor(cv_loss)}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=step_losses, val_losses=cv_loss,
                   metrics={"sisnri_ckpt": sisnri[CKPT_EPOCH - 1], "sisnri_last": sisnri[-1],
                            "train_loss_last_epoch": tr_loss[-1], "sisnri_first": sisnri[0]})


SISNRI_OK = 3.0     # dB: the recipe passes 5 dB on these clips by epoch 7


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if not all(math.isfinite(v) for v in trained.train_losses):
        return "loss went to NaN"
    if m["sisnri_last"] < SISNRI_OK:
        return (f"validation SI-SNRi only {m['sisnri_last']:.1f} dB after {EPOCHS_RUN} epochs "
                f"({m['sisnri_first']:.1f} dB after 1); training loss {m['train_loss_last_epoch']:+.2f} "
                f"in the last epoch")
    return None


# ---------------------------------------------------------------------------------------------------- setups
def _setup(run: str):
    import triage

    seed = 0
    model, opt, sched = build()
    tr_mix, tr_clean = make_clips(N_TRAIN, seed)
    cv_mix, cv_clean = make_clips(N_VAL, seed + 50_000)
    return triage.Setup(
        model=model, optimizer=opt, scheduler=sched,
        loss_fn=make_loss_fn(run),
        batches=[b for e in (CKPT_EPOCH, CKPT_EPOCH + 1) for b in batches_of(tr_mix, tr_clean, e, seed)],  # 64
        val_batches=batches_of(cv_mix, cv_clean, None, seed),
        grad_clip=CLIP,
        scheduler_interval="epoch", steps_per_epoch=STEPS_PER_EPOCH,
        total_steps=EPOCHS_RUN * STEPS_PER_EPOCH,
    )


def setup_healthy():
    return _setup("healthy")


def setup_sisnr_broadcast():
    return _setup("sisnr_broadcast")


if __name__ == "__main__":
    torch.set_num_threads(1)
    run = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    tr = train(run, Path("."), seed=0)
    print(symptom(run, tr), tr.metrics)
