"""N-BEATS (generic) trained with a MAPE loss on windows of many daily demand series.

Follows ServiceNow/N-BEATS (Element AI's reference code, read through the code search: common/torch/losses.py,
models/nbeats.py and the experiments' trainer): `NBeatsBlock`s of 4 fully connected ReLU layers whose `theta`
is split by a `GenericBasis` into a backcast (lookback) and a forecast (horizon); the model runs the blocks on the
flipped input, subtracts each backcast from the residual (times the input mask) and sums the forecasts. Training
draws random windows (a random series and a random cut point each, as its `TimeseriesSampler` does), minimises a
scale-free loss (MAPE here, one of its `mape` / `smape_2` / `mase` options) with Adam(lr=1e-3), clips the global
grad norm at 1.0 and halves the LR at fixed fractions of the iterations (the reference sets the group LR by hand
every `iterations // lr_decay_step`; here the same schedule is a `StepLR` stepped every iteration). The reference's
MAPE divides by the target through `divide_no_nan`, which gives a zero target a zero weight.

Data: 32 synthetic daily demand series of 500 days (weekly seasonality, a level per store, noise), lookback 21
days, horizon 7, batches of 32 windows. One store was closed for one day: that day's demand is exactly 0.

Runs
- healthy: the reference MAPE (`divide_no_nan`); the checkpoint is taken at iteration 100 of 300 while the loss
  still falls.
- mape_zero_division: the user wrote MAPE the textbook way, `mean(|forecast - target| / |target| * mask)`, without
  the reference's `divide_no_nan`. The first batch whose horizon holds the closed day has a 0 in the denominator:
  the loss is inf, its gradient inf, clip_grad_norm_ turns it into NaN (inf * 0) and every weight is NaN after
  that step. MAPE on series with zero sales is a known trap (it is undefined at 0): Element AI's own loss guards the
  division with divide_no_nan, unit8co/darts issue #2517 reports a model trained with MapeLoss predicting NaN,
  and LibCity issue #219 answers "MAPE is inf because the ground truth has 0" (use a masked MAPE). Root cause: numerical_instability (a division with a domain edge; the fix guards it).
  Competing fixes a user tries first: a 10x lower LR and a 10x tighter clip (0.1); neither changes a 1/0.
  The checkpoint is the last periodic one (every 20 iterations) before the loss went NaN.
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
    name="nbeats_forecasting",
    kind="forecasting",
    original="ServiceNow/N-BEATS (Element AI): models/nbeats.py, common/torch/losses.py, experiments trainer",
    runs={
        "healthy": Run(cause="healthy", story="Generic N-BEATS with the reference MAPE on 32 demand series; "
                                              "checkpoint at iteration 100 of 300 while the loss falls."),
        "mape_zero_division": Run(
            cause="numerical_instability",
            story="I wrote MAPE as |f - y| / |y|; one store has a closed day with 0 sales and the loss went to "
                  "inf, then NaN, and stayed NaN.",
            fix="divide_no_nan",
            competing=("lr_x0.1", "clip_0.1"),
        ),
    },
)

N_SERIES, T = 32, 500
LOOKBACK, HORIZON = 21, 7
BATCH = 32
ITERATIONS = 300
LR = 1e-3
CKPT_EVERY = 20
N_BLOCKS, LAYERS, LAYER_SIZE = 4, 4, 128


def make_series(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(T)
    level = rng.uniform(20, 100, (N_SERIES, 1))
    weekly = 1 + rng.uniform(0.1, 0.3, (N_SERIES, 1)) * np.sin(2 * math.pi * t / 7 + rng.uniform(0, 6.3, (N_SERIES, 1)))
    trend = 1 + rng.normal(0, 3e-4, (N_SERIES, 1)) * t
    s = level * weekly * trend * (1 + rng.normal(0, 0.05, (N_SERIES, T)))
    s = np.maximum(s, 1.0)
    s[rng.integers(N_SERIES), rng.integers(LOOKBACK + HORIZON, T - HORIZON)] = 0.0     # a closed day
    return s.astype(np.float32)


class WindowSampler:
    """Random (series, cut point) windows, as the reference's TimeseriesSampler draws them."""

    def __init__(self, series: np.ndarray, seed: int):
        self.series = series
        self.rng = np.random.default_rng(seed + 1)

    def __next__(self):
        si = self.rng.integers(0, len(self.series), BATCH)
        cut = self.rng.integers(LOOKBACK, T - HORIZON + 1, BATCH)
        x = np.stack([self.series[a, c - LOOKBACK:c] for a, c in zip(si, cut)])
        y = np.stack([self.series[a, c:c + HORIZON] for a, c in zip(si, cut)])
        return (torch.from_numpy(x), torch.ones(BATCH, LOOKBACK), torch.from_numpy(y), torch.ones(BATCH, HORIZON))


class GenericBasis(nn.Module):
    def __init__(self, backcast_size, forecast_size):
        super().__init__()
        self.backcast_size, self.forecast_size = backcast_size, forecast_size

    def forward(self, theta):
        return theta[:, :self.backcast_size], theta[:, -self.forecast_size:]


class NBeatsBlock(nn.Module):
    def __init__(self, input_size, theta_size, basis, layers, layer_size):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(input_size, layer_size)] +
                                    [nn.Linear(layer_size, layer_size) for _ in range(layers - 1)])
        self.basis_parameters = nn.Linear(layer_size, theta_size)
        self.basis_function = basis

    def forward(self, x):
        block_input = x
        for layer in self.layers:
            block_input = torch.relu(layer(block_input))
        return self.basis_function(self.basis_parameters(block_input))


class NBeats(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, x, input_mask):
        residuals = x.flip(dims=(1,))
        input_mask = input_mask.flip(dims=(1,))
        forecast = x[:, -1:]
        for block in self.blocks:
            backcast, block_forecast = block(residuals)
            residuals = (residuals - backcast) * input_mask
            forecast = forecast + block_forecast
        return forecast


def divide_no_nan(a, b):
    result = a / b
    result[result != result] = 0.0
    result[result == float("inf")] = 0.0
    return result


def mape_loss_reference(forecast, target, mask):
    weights = divide_no_nan(mask, target)
    return torch.mean(torch.abs((forecast - target) * weights))


def mape_loss_textbook(forecast, target, mask):
    return torch.mean(torch.abs(forecast - target) / torch.abs(target) * mask)


def _textbook(run, variant):
    return run == "mape_zero_division" and variant != "divide_no_nan"


def _make_loss(run, variant):
    fn = mape_loss_textbook if _textbook(run, variant) else mape_loss_reference

    def loss(model, batch):
        x, x_mask, y, y_mask = batch
        return fn(model(x, x_mask), y, y_mask)
    return loss


def _build(seed, variant):
    torch.manual_seed(seed)
    model = NBeats(nn.ModuleList([NBeatsBlock(LOOKBACK, LOOKBACK + HORIZON, GenericBasis(LOOKBACK, HORIZON),
                                              LAYERS, LAYER_SIZE) for _ in range(N_BLOCKS)]))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR * (0.1 if variant == "lr_x0.1" else 1))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=ITERATIONS // 3, gamma=0.5)
    return model, optimizer, scheduler


def _clip(variant):
    return 0.1 if variant == "clip_0.1" else 1.0


def _holdout(series):
    """The last 7 days of every series, forecast from the 21 before (reference MAPE, which skips zeros)."""
    x = torch.from_numpy(series[:, -HORIZON - LOOKBACK:-HORIZON])
    y = torch.from_numpy(series[:, -HORIZON:])
    return x, torch.ones_like(x), y, torch.ones_like(y)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    series = make_series(seed)
    model, optimizer, scheduler = _build(seed, variant)
    loss_fn = _make_loss(run, variant)
    sampler = WindowSampler(series, seed)
    ckpt = out_dir / "nbeats.pt"
    losses, first_nan = [], None
    healthy_ckpt = 100
    for i in range(1, ITERATIONS + 1):
        model.train()
        batch = next(sampler)
        loss = loss_fn(model, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), _clip(variant))
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]) and first_nan is None:
            first_nan = i
        finite = all(torch.isfinite(p).all() for p in model.parameters())
        save = (i == healthy_ckpt) if run == "healthy" else (i % CKPT_EVERY == 0 and finite) or i == 1
        if save and finite:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "step": i}, ckpt)
    model.eval()
    with torch.no_grad():
        hold = float(mape_loss_reference(model(*_holdout(series)[:2]), *_holdout(series)[2:]))
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"holdout_mape": hold, "first_nonfinite_step": first_nan or -1})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if not math.isfinite(m["holdout_mape"]) or m["holdout_mape"] > 0.12:
            return f"healthy run failed: hold-out MAPE {m['holdout_mape']:.3f}"
        return None
    if m["first_nonfinite_step"] > 0:
        before = trained.train_losses[m["first_nonfinite_step"] - 2] if m["first_nonfinite_step"] > 1 else float("nan")
        return (f"loss went non-finite at iteration {m['first_nonfinite_step']} (it was {before:.3f} the step "
                f"before) and the weights are NaN from then on (hold-out MAPE {m['holdout_mape']})")
    return None


def _snapshot(run):
    """The batches the run drew after its checkpoint, in order (seed 0)."""
    series = make_series(0)
    sampler = WindowSampler(series, 0)
    drawn = [next(sampler) for _ in range(ITERATIONS)]
    if run == "healthy":
        start = 100
    else:
        first_zero = next(i for i, b in enumerate(drawn, 1) if (b[2] == 0).any())
        start = max(1, ((first_zero - 1) // CKPT_EVERY) * CKPT_EVERY)
    return drawn[start:start + 48]


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    model, optimizer, scheduler = _build(0, None)
    val = [_holdout(make_series(0))]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=_make_loss(run, None), batches=_snapshot(run),
                        val_batches=val, scheduler=scheduler, grad_clip=1.0, total_steps=ITERATIONS)


def setup_healthy():
    return _setup("healthy")


def setup_mape_zero_division():
    return _setup("mape_zero_division")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), int(sys.argv[1]) if len(sys.argv) > 1 else 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 3) for x in tr.train_losses[::30]], torch.load(tr.checkpoint)["step"])
