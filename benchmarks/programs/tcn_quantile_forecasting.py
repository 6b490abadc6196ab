"""Temporal convolutional network forecasting three quantiles of a noisy seasonal series with the pinball loss.

Follows darts' TCNModel (darts/models/forecasting/tcn_model.py: `_ResidualBlock`s of two dilated causal Conv1d
(left padding (kernel_size-1)*dilation), ReLU, dropout and a 1x1 conv on the skip path when the widths differ,
dilations base**i) trained with a quantile likelihood, and pytorch-forecasting's QuantileLoss
(pytorch_forecasting/metrics/quantile.py: `errors = target - y_pred[..., i]`,
`torch.max((q - 1) * errors, q * errors)`), both read through the code/doc search. Windows of 48 past values
predict the next 12 at quantiles (0.1, 0.5, 0.9); the head reads the last time step's features and emits 12 x 3
values. Adam(lr=1e-3), shuffled batches of 32, a general checkpoint each epoch (`epoch`, `model_state_dict`,
`optimizer_state_dict`). The series: daily-like seasonality (period 24) whose noise grows and shrinks with the
season (so the quantile band matters), standardised with the train mean and std; 70/30 chronological split.

Runs
- healthy: the pinball loss as pytorch-forecasting writes it; the checkpoint is taken at epoch 2 of 6, while the
  validation loss still falls. The loss's floor is 0, reached only by a perfect forecast; a trained model sits
  well above it (~0.08 here), which is right for quantiles of a noisy series.
- pinball_sign_typo: the user typed the pinball loss as `torch.max((1 - q) * errors, q * errors)` (1 - q for
  q - 1). Above the target a forecast now costs min(q, 1-q) * error NEGATIVELY, so the loss is unbounded below
  and every quantile is pushed upwards without end: the train loss goes negative (a pinball loss never is) and
  falls for ever while the forecasts drift above the data. A hand-written pinball loss is a common thing to get
  subtly wrong (two sign conventions, e and -e, q and q - 1, coexist in the literature); I found no public thread
  for this exact typo, so it is a plausible slip rather than a documented one. Root
  cause: wrong_loss (the fix is the loss: (q - 1)). Competing fixes a user tries first: a 10x lower LR (the
  drift is slower but the loss still goes negative) and gradient clipping at 1.0 (Adam's step does not shrink).
  The checkpoint is the epoch-3 one, once the loss is negative.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="tcn_quantile_forecasting",
    kind="forecasting",
    original="unit8co/darts: models/forecasting/tcn_model.py + pytorch-forecasting metrics/quantile.py QuantileLoss",
    runs={
        "healthy": Run(cause="healthy", story="TCN with a (0.1, 0.5, 0.9) pinball loss; checkpoint at epoch 2 of 6 "
                                              "while validation loss still falls; the loss floor is 0 but a "
                                              "good quantile forecast of noisy data sits near 0.08."),
        "pinball_sign_typo": Run(
            cause="wrong_loss",
            story="I wrote the quantile loss myself; the loss went negative after an epoch and keeps falling, "
                  "and all three quantile forecasts sit far above the data.",
            fix="pinball_q_minus_1",
            competing=("lr_x0.1", "grad_clip_1"),
        ),
    },
)

QUANTILES = (0.1, 0.5, 0.9)
INPUT_LEN, HORIZON = 48, 12
N_POINTS = 1600
BATCH = 32
EPOCHS = 6
LR = 1e-3


def make_series(seed):
    rng = np.random.default_rng(seed)
    t = np.arange(N_POINTS)
    season = np.sin(2 * math.pi * t / 24 + rng.uniform(0, 6.3))
    noise_scale = 0.25 + 0.35 * (1 + np.sin(2 * math.pi * t / 24 + 1.0)) / 2
    return (5 + 2 * season + rng.normal(0, 1, N_POINTS) * noise_scale).astype(np.float32)


def make_data(seed):
    s = make_series(seed)
    n_train = int(0.7 * N_POINTS)
    z = (s - s[:n_train].mean()) / s[:n_train].std()

    def windows(a):
        idx = range(len(a) - INPUT_LEN - HORIZON + 1)
        x = np.stack([a[i:i + INPUT_LEN] for i in idx])[:, None, :]
        y = np.stack([a[i + INPUT_LEN:i + INPUT_LEN + HORIZON] for i in idx])
        return torch.from_numpy(x), torch.from_numpy(y)
    return windows(z[:n_train]), windows(z[n_train - INPUT_LEN:])


class _ResidualBlock(nn.Module):
    def __init__(self, in_ch, out_ch, kernel_size, dilation, dropout):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv1 = nn.Conv1d(in_ch, out_ch, kernel_size, dilation=dilation)
        self.conv2 = nn.Conv1d(out_ch, out_ch, kernel_size, dilation=dilation)
        self.dropout = nn.Dropout(dropout)
        self.conv3 = nn.Conv1d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x):
        residual = x
        x = self.dropout(F.relu(self.conv1(F.pad(x, (self.pad, 0)))))
        x = self.dropout(F.relu(self.conv2(F.pad(x, (self.pad, 0)))))
        if self.conv3 is not None:
            residual = self.conv3(residual)
        return x + residual


class TCNQuantile(nn.Module):
    def __init__(self, num_filters=32, kernel_size=3, num_layers=4, dropout=0.1):
        super().__init__()
        self.res_blocks = nn.ModuleList([_ResidualBlock(1 if i == 0 else num_filters, num_filters, kernel_size, 2 ** i,
                                                        dropout) for i in range(num_layers)])
        self.head = nn.Linear(num_filters, HORIZON * len(QUANTILES))

    def forward(self, x):
        for block in self.res_blocks:
            x = block(x)
        return self.head(x[:, :, -1]).view(-1, HORIZON, len(QUANTILES))


def quantile_loss(y_pred, target, typo=False):
    losses = []
    for i, q in enumerate(QUANTILES):
        errors = target - y_pred[..., i]
        if typo:
            losses.append(torch.max((1 - q) * errors, q * errors).unsqueeze(-1))
        else:
            losses.append(torch.max((q - 1) * errors, q * errors).unsqueeze(-1))
    return torch.cat(losses, dim=-1).mean()


def _typo(run, variant):
    return run == "pinball_sign_typo" and variant != "pinball_q_minus_1"


def _make_loss(run, variant):
    typo = _typo(run, variant)

    def loss(model, batch):
        x, y = batch
        return quantile_loss(model(x), y, typo)
    return loss


def _build(seed, variant):
    torch.manual_seed(seed)
    model = TCNQuantile()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR * (0.1 if variant == "lr_x0.1" else 1))
    return model, optimizer


def _loader(x, y, seed, epoch):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(x), generator=g)
    return [(x[perm[i:i + BATCH]], y[perm[i:i + BATCH]]) for i in range(0, len(x), BATCH)]


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    (xtr, ytr), (xva, yva) = make_data(seed)
    model, optimizer = _build(seed, variant)
    loss_fn = _make_loss(run, variant)
    ckpt_epoch = 2 if run == "healthy" else 3
    ckpt = out_dir / "tcn_quantile.pt"
    losses, val_losses = [], []
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for xb, yb in _loader(xtr, ytr, seed, epoch):
            loss = loss_fn(model, (xb, yb))
            optimizer.zero_grad()
            loss.backward()
            if variant == "grad_clip_1":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            val_losses.append(float(loss_fn(model, (xva, yva))))
        if epoch == ckpt_epoch:
            torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict(), "loss": losses[-1]}, ckpt)
    with torch.no_grad():
        pred = model(xva)
        honest = float(quantile_loss(pred, yva))
        cover_90 = float((yva <= pred[..., 2]).float().mean())
        cover_10 = float((yva <= pred[..., 0]).float().mean())
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_pinball": honest, "cover_q90": cover_90, "cover_q10": cover_10,
                            "train_tail": float(np.mean(losses[-20:]))})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["val_pinball"] > 0.3 or not (0.75 < m["cover_q90"] < 0.98):
            return (f"healthy run failed: validation pinball {m['val_pinball']:.2f}, q0.9 covers "
                    f"{m['cover_q90']:.0%}")
        return None
    if m["train_tail"] < 0:
        return (f"train loss went negative ({m['train_tail']:.2f} over the last 20 steps; a pinball loss is >= 0); "
                f"validation pinball {m['val_pinball']:.2f}, {m['cover_q10']:.0%} of targets lie under the q0.1 "
                f"forecast")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    (xtr, ytr), (xva, yva) = make_data(0)
    model, optimizer = _build(0, None)
    batches = (_loader(xtr, ytr, 0, 4) + _loader(xtr, ytr, 0, 5))[:48]   # epochs 4 and 5 of the run
    val = [(xva[i:i + 128], yva[i:i + 128]) for i in range(0, len(xva), 128)]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=_make_loss(run, None), batches=batches,
                        val_batches=val, total_steps=EPOCHS * math.ceil(len(xtr) / BATCH))


def setup_healthy():
    return _setup("healthy")


def setup_pinball_sign_typo():
    return _setup("pinball_sign_typo")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      symptom(r, tr), [round(x, 3) for x in tr.val_losses])
