"""DeepSurv-style Cox proportional-hazards network on censored survival times.

Written after pycox (havakv/pycox: `models/cox.py` CoxPH, `models/loss.py` `cox_ph_loss` / `cox_ph_loss_sorted`
/ `CoxPHLoss`, the `tt.practical.MLPVanilla` net with BatchNorm and dropout, the METABRIC notebook's recipe:
Adam, batch 256, the target as the pair `(durations, events)`) and DeepSurv (jaredleekatzman/DeepSurv; the
PyTorch port czifan/DeepSurv.pytorch saves `{"model", "optimizer", "epoch"}`). The loss is the negative Cox
partial log-likelihood of each batch: risk sets taken inside the batch by sorting on duration (descending) and
a cumulative log-sum-exp, averaged over the batch's events. A batch is pycox's nested tuple
`(x, (durations, events))`. Its floor is not 0 (it depends on the risk set sizes of the batch), and the run is
judged by Harrell's concordance index on a validation split.

Data: a METABRIC-like table made in code, 9 covariates, log-hazard a non-linear function of them, exponential
event times, independent censoring (about 12 % censored, as in cohorts followed until most events occur).

Runs
- healthy: `CoxPHLoss` (sorts each batch by duration), Adam 1e-3, 20 epochs; checkpoint after epoch 8.
- sorted_loss_on_shuffled_batches: the owner switched to pycox's faster `cox_ph_loss_sorted`, whose docstring
  says it "requires the input to be sorted by descending duration time" (pycox pairs it with
  `DatasetDurationSorted`), while keeping a shuffled DataLoader. The cumulative sum then takes random subsets
  of the batch as risk sets: the loss no longer is the partial likelihood, and the network learns mostly who
  has an event rather than who fails first. Validation C-index stays far below the healthy run's. Root cause
  `wrong_loss` (the fix, `CoxPHLoss` that sorts, removes it). Competing fix a user tries first: a 10x lower
  LR (`lr_lower`), which leaves it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="cox_survival",
    kind="survival",
    original="pycox (havakv): pycox/models/loss.py cox_ph_loss(_sorted), models/cox.py CoxPH; DeepSurv",
    runs={
        "healthy": Run(cause="healthy", story="MLPVanilla + CoxPHLoss, Adam 1e-3; checkpoint at epoch 8 of 20 "
                       "while validation C-index is still rising."),
        "sorted_loss_on_shuffled_batches": Run(
            cause="wrong_loss",
            story="Swapped in cox_ph_loss_sorted for speed but kept a shuffled DataLoader; the loss goes "
                  "down yet validation C-index stays far below what CoxPHLoss gets.",
            fix="sorting_loss", competing=("lr_lower",)),
    },
)

N_COV, N_TRAIN, N_VALID, BS, EPOCHS = 9, 2048, 1024, 128, 20


def make_data(seed):
    rng = np.random.default_rng(5000 + seed)
    n = N_TRAIN + N_VALID
    x = rng.normal(size=(n, N_COV)).astype(np.float32)
    x[:, 5:] = (x[:, 5:] > 0.3).astype(np.float32)   # binary covariates (hormone treatment, ER status...)
    log_h = (1.2 * np.tanh(x[:, 0]) - 0.8 * x[:, 1] + 0.6 * x[:, 2] * x[:, 3] + 0.7 * x[:, 5]
             - 0.5 * x[:, 6] + 0.4 * x[:, 4] ** 2)
    t = rng.exponential(1.0 / (0.1 * np.exp(log_h)))
    c = rng.exponential(80.0, size=n)
    durations = np.minimum(t, c).astype(np.float32)
    events = (t <= c).astype(np.float32)
    mk = lambda s: (torch.tensor(x[s]), (torch.tensor(durations[s]), torch.tensor(events[s])))
    return mk(slice(0, N_TRAIN)), mk(slice(N_TRAIN, n))


class MLPVanilla(nn.Module):
    def __init__(self, in_features, num_nodes=(32, 32), out_features=1, dropout=0.1):
        super().__init__()
        layers, d = [], in_features
        for h in num_nodes:
            layers += [nn.Linear(d, h), nn.ReLU(), nn.BatchNorm1d(h), nn.Dropout(dropout)]
            d = h
        layers.append(nn.Linear(d, out_features, bias=False))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def cox_ph_loss_sorted(log_h, events, eps=1e-7):
    """Requires the batch sorted by descending duration: the cumulative sum is then the risk set."""
    events = events.view(-1)
    log_h = log_h.view(-1)
    gamma = log_h.max()
    log_cumsum_h = log_h.sub(gamma).exp().cumsum(0).add(eps).log().add(gamma)
    return -log_h.sub(log_cumsum_h).mul(events).sum().div(events.sum().clamp_min(1.0))


def cox_ph_loss(log_h, durations, events, eps=1e-7):
    idx = durations.sort(descending=True)[1]
    return cox_ph_loss_sorted(log_h.view(-1)[idx], events.view(-1)[idx], eps)


def make_loss_fn(sorted_variant: bool):
    def loss_fn(model, batch):
        x, (durations, events) = batch
        log_h = model(x)
        if sorted_variant:
            return cox_ph_loss_sorted(log_h, events)
        return cox_ph_loss(log_h, durations, events)
    return loss_fn


def concordance_index(risk, durations, events):
    risk, durations, events = risk.view(-1), durations.view(-1), events.view(-1)
    comparable = (durations[:, None] < durations[None, :]) & (events[:, None] > 0)
    concordant = (risk[:, None] > risk[None, :]).float() + 0.5 * (risk[:, None] == risk[None, :]).float()
    return float((concordant * comparable).sum() / comparable.sum())


def loader(ds, bs, shuffle, seed):
    x, (d, e) = ds
    n = len(x)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(n)
    return [(x[i], (d[i], e[i])) for i in (order[j:j + bs] for j in range(0, n, bs))]


def build(seed, run, variant):
    train_ds, valid_ds = make_data(seed)
    model = MLPVanilla(N_COV)
    lr = 1e-4 if variant == "lr_lower" else 1e-3
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sorted_variant = run == "sorted_loss_on_shuffled_batches" and variant != "sorting_loss"
    return model, opt, make_loss_fn(sorted_variant), train_ds, valid_ds


@torch.no_grad()
def evaluate(model, loss_fn, valid_ds):
    model.eval()
    x, (d, e) = valid_ds
    risk = model(x)
    vl = float(cox_ph_loss(risk, d, e))
    model.train()
    return vl, concordance_index(risk, d, e)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    model, opt, loss_fn, train_ds, valid_ds = build(seed, run, variant)
    ckpt = Path(out_dir) / "deepsurv.pth"
    ckpt_epoch = 8 if run == "healthy" else EPOCHS
    losses, vls, cis = [], [], []
    for epoch in range(1, EPOCHS + 1):
        for batch in loader(train_ds, BS, True, seed * 1000 + epoch):
            loss = loss_fn(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        vl, ci = evaluate(model, loss_fn, valid_ds)
        vls.append(vl)
        cis.append(ci)
        if epoch == ckpt_epoch:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch}, ckpt)
    x, (d, e) = valid_ds
    true_log_h = (1.2 * torch.tanh(x[:, 0]) - 0.8 * x[:, 1] + 0.6 * x[:, 2] * x[:, 3] + 0.7 * x[:, 5]
                  - 0.5 * x[:, 6] + 0.4 * x[:, 4] ** 2)
    oracle = concordance_index(true_log_h, d, e)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vls,
                   metrics={"c_index": cis[-1], "c_index_at_ckpt": cis[ckpt_epoch - 1], "oracle_c_index": oracle})


def symptom(run: str, trained: Trained) -> str | None:
    ci, oracle = trained.metrics["c_index"], trained.metrics["oracle_c_index"]
    if ci < oracle - 0.06:
        tl = trained.train_losses
        return (f"validation C-index {ci:.3f} after {len(trained.val_losses)} epochs where the true hazard "
                f"ranks at {oracle:.3f}; train loss {np.mean(tl[:16]):.3f} -> {np.mean(tl[-16:]):.3f}")
    return None


def _setup(run):
    import triage

    model, opt, loss_fn, train_ds, valid_ds = build(0, run, None)
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn,
                        batches=[b for e in (77, 78, 79) for b in loader(train_ds, BS, True, e)],  # 3 epochs: 48 batches
                        val_batches=loader(valid_ds, 256, False, 0),
                        total_steps=EPOCHS * (N_TRAIN // BS), steps_per_epoch=N_TRAIN // BS)


def setup_healthy():
    return _setup("healthy")


def setup_sorted_loss_on_shuffled_batches():
    return _setup("sorted_loss_on_shuffled_batches")
