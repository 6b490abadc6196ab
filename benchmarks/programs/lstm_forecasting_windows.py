"""One-step-ahead LSTM forecaster on sliding windows of a synthetic seasonal series.

Follows the common PyTorch time-series tutorials (e.g. the "LSTM for time series prediction in PyTorch"
(machinelearningmastery) and the PyTorch-forum style `create_dataset(dataset, lookback)` recipe, found with the code
search): the series is split chronologically (first 70% train, last 30% validation), standardised with the TRAIN
mean and std, cut into windows of `lookback`=24 values whose target is the next value, fed as (B, 24, 1) to
`nn.LSTM(input_size=1, hidden_size=32, batch_first=True)` + `nn.Linear(32, 1)` on the last hidden state, trained
with `nn.MSELoss()` and Adam(lr=3e-3) over shuffled DataLoader batches of 32, with the validation MSE printed each
epoch and a general checkpoint (`epoch`, `model_state_dict`, `optimizer_state_dict`, `loss`) saved each epoch as in
PyTorch's "Saving and loading a general checkpoint" recipe. The series: a daily (period 24) and a weekly
(period 168) seasonality, a slow trend and noise, hourly, 2400 points.

Runs
- healthy: targets kept as (B, 1) windows (`series[i+24:i+25]`); the checkpoint is the epoch-2 one of 6, while the
  validation loss still falls.
- target_shape_broadcast: the user built the target as `series[i + lookback]` (a scalar per window), so a batch of
  targets is (B,) while the model returns (B, 1). `nn.MSELoss()(out, y)` broadcasts the two to (B, B) and compares
  every prediction with every target of the batch (PyTorch only warns: "Using a target size (torch.Size([32])) that
  is different to the input size (torch.Size([32, 1])). This will likely lead to incorrect results due to
  broadcasting"). The minimiser of that loss is the batch mean: the forecaster learns to predict a constant, and
  train MSE sits at the series' variance (~1 in standardised units) and the forecast's validation MSE at ~1.7
  (the trend lifts the validation period above the train mean) however long it trains. PyTorch
  added that warning for exactly the (n, 1) against (n,) case (pytorch/pytorch PR #18349, after issue #16045),
  and forecasting code still ships it: jsboige/CoursIA PR #926 fixes "MSE broadcasting bug pred_len=1" where
  MSELoss compared (64, 1) predictions with (64,) targets as a (64, 64) matrix in four forecasters.
  Root cause: wrong_loss (the fix is in the loss call: compare (B,1) with (B,1)). Competing fixes a user tries
  first: a 10x larger LR and training twice as many epochs; the loss's minimum is still the constant.
  The checkpoint is the epoch-3 one, once the plateau shows.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="lstm_forecasting_windows",
    kind="forecasting",
    original="PyTorch LSTM time-series tutorials (create_dataset sliding windows + nn.LSTM + MSELoss)",
    runs={
        "healthy": Run(cause="healthy", story="LSTM one-step forecaster on standardised sliding windows; "
                                              "checkpoint at epoch 2 of 6 while validation MSE still falls."),
        "target_shape_broadcast": Run(
            cause="wrong_loss",
            story="My targets are (B,) and the model outputs (B, 1); I ignored the MSELoss size warning. Train and "
                  "val loss stay at ~1.0 from the first epoch and the forecast is a flat line.",
            fix="target_unsqueeze",
            competing=("lr_x10", "epochs_x2"),
        ),
    },
)

N_POINTS = 2400
LOOKBACK = 24
BATCH = 32
EPOCHS = 6
LR = 3e-3


def make_series(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(N_POINTS, dtype=np.float64)
    phase = rng.uniform(0, 2 * math.pi, 2)
    y = (10 + 0.002 * t + 3 * np.sin(2 * math.pi * t / 24 + phase[0]) + 1.5 * np.sin(2 * math.pi * t / 168 + phase[1])
         + rng.normal(0, 0.4, N_POINTS))
    return y.astype(np.float32)


def create_dataset(series: np.ndarray, lookback: int, scalar_target: bool):
    X, y = [], []
    for i in range(len(series) - lookback):
        X.append(series[i:i + lookback])
        y.append(series[i + lookback] if scalar_target else series[i + lookback:i + lookback + 1])
    return torch.tensor(np.array(X))[..., None], torch.tensor(np.array(y))


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=1, hidden_size=32, num_layers=1, batch_first=True)
        self.linear = nn.Linear(32, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.linear(out[:, -1, :])


def _scalar_target(run, variant):
    return run == "target_shape_broadcast"


def make_data(seed: int, run: str):
    series = make_series(seed)
    n_train = int(0.7 * len(series))
    mean, std = series[:n_train].mean(), series[:n_train].std()
    z = (series - mean) / std
    scalar = _scalar_target(run, None)
    train = create_dataset(z[:n_train], LOOKBACK, scalar)
    val = create_dataset(z[n_train - LOOKBACK:], LOOKBACK, scalar)
    return train, val


def _make_loss(run, variant):
    loss_fn = nn.MSELoss()
    fix = variant == "target_unsqueeze"

    def loss(model, batch):
        x, y = batch
        out = model(x)
        if fix and y.dim() == 1:
            y = y.unsqueeze(-1)
        return loss_fn(out, y)
    return loss


def _build(seed, variant):
    torch.manual_seed(seed)
    model = Forecaster()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR * (10 if variant == "lr_x10" else 1))
    return model, optimizer


def _loader(X, y, seed, epoch):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(X), generator=g)
    return [(X[perm[i:i + BATCH]], y[perm[i:i + BATCH]]) for i in range(0, len(X), BATCH)]


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    import warnings

    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    (Xtr, ytr), (Xva, yva) = make_data(seed, run)
    model, optimizer = _build(seed, variant)
    loss_fn = _make_loss(run, variant)
    epochs = EPOCHS * (2 if variant == "epochs_x2" else 1)
    ckpt_epoch = 2 if run == "healthy" else 3
    ckpt = out_dir / "lstm_forecaster.pt"
    losses, val_losses = [], []
    honest = nn.MSELoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the user's run printed MSELoss's size warning and went on
        for epoch in range(1, epochs + 1):
            model.train()
            for xb, yb in _loader(Xtr, ytr, seed, epoch):
                loss = loss_fn(model, (xb, yb))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            model.eval()
            with torch.no_grad():
                val_losses.append(float(loss_fn(model, (Xva, yva))))
            if epoch == ckpt_epoch:
                torch.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                            "optimizer_state_dict": optimizer.state_dict(), "loss": losses[-1]}, ckpt)
    with torch.no_grad():
        true_val = float(honest(model(Xva).squeeze(-1), yva.reshape(-1)))
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"true_val_mse": true_val, "epochs": epochs})


def symptom(run: str, trained: Trained) -> str | None:
    v = trained.metrics["true_val_mse"]
    if run == "healthy":
        if v > 0.15:
            return f"healthy run failed to train: validation MSE {v:.2f} (standardised units)"
        return None
    if v > 0.5:
        tail = float(np.mean(trained.train_losses[-20:]))
        return (f"train loss flat at {tail:.2f} after {trained.metrics['epochs']} epochs; validation MSE of the "
                f"forecast {v:.2f} (the healthy forecaster scores ~0.05)")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    (Xtr, ytr), (Xva, yva) = make_data(0, run)
    model, optimizer = _build(0, None)
    batches = _loader(Xtr, ytr, 0, 100)[:48]
    val = [(Xva[i:i + 128], yva[i:i + 128]) for i in range(0, len(Xva), 128)]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=_make_loss(run, None), batches=batches,
                        val_batches=val, total_steps=EPOCHS * math.ceil(len(Xtr) / BATCH))


def setup_healthy():
    return _setup("healthy")


def setup_target_shape_broadcast():
    return _setup("target_shape_broadcast")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 3) for x in tr.val_losses])
