"""A RealNVP normalizing flow (affine coupling layers) fitted to sklearn's two moons by maximum likelihood.

Follows the normflows (VincentStimper/normalizing-flows) RealNVP / two-moons example notebooks and nflows' moons
example (read: a DiagGaussian base in 2-D; K affine coupling blocks whose conditioner is an MLP 1 -> hidden ->
hidden -> 2 initialised to zero, so each block starts as the identity, with a Permute 'swap' between blocks; the
scale is exp(s) with no bound; log q(x) = log N(z; 0, I) + sum of log|det| of the inverse pass;
`loss = model.forward_kld(x)` = -mean log q(x) on a fresh batch of `make_moons(2 ** 9, noise=...)` drawn every
iteration; Adam; the model saved with torch.save). Written in plain PyTorch (normflows is not installed). The
moons are scaled by 0.25 with noise 0.05, so their differential entropy is below zero: a well-fitted flow has a
NEGATIVE NLL (about -1.1 nats here), as the normflows / nflows / FrEIA threads on negative flow losses explain
(bayesiains/nflows issue #76 "Is having negative loss okay?", vislearn/FrEIA issue #16 "Negative Errors When
Training": "the loss is supposed to be negative"). The checkpoint is {'iteration', 'model', 'optimizer',
'loss_hist'}: the owner keeps the loss history the notebook plots.

Runs
- healthy: NLL from ~1.9 down through 0 to about -1 nats (noisy, still creeping down): a negative loss by
  nature. Adam lr 5e-4, weight_decay 1e-5 as in the example. Checkpoint: iteration 200 of 400, still improving.
- logdet_sign: the owner's inverse pass returns the log-determinant of the forward direction (the sign of the
  log-det flipped, the bug normflows fixed in PR #28 "Fixed sign of log det of forward_and_log_det method"), so
  the loss is -log N(z) + sum(s): the flow is rewarded for contracting every point onto the origin, the loss
  runs down without bound (-190 nats after 400 iterations and falling) while the density it describes gets
  worse and worse (the honest NLL on fresh moons is > +200 nats). karpathy/pytorch-normalizing-flows issue #7 ("loss varied from
  800000 -> -30000 and it is still decreasing") is the symptom as users report it. Root cause: wrong_loss (the
  objective has no lower bound; putting the log-det's sign back removes the symptom). Competing fix a user tries
  first, reading the runaway loss as instability: a 10x lower learning rate (the loss runs away more slowly;
  the honest NLL, ~3.4 nats, is still far above the healthy run's). Checkpoint: iteration 100, the loss already
  at -5 nats and falling.
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
    name="realnvp_flow",
    kind="generative",
    original="VincentStimper/normalizing-flows (normflows): examples/real_nvp_colab / two-moons RealNVP notebook",
    runs={
        "healthy": Run(cause="healthy", story="RealNVP on scaled two moons; the NLL goes from 1.9 below zero to about "
                                              "-1 nats (negative by nature); checkpoint at iteration 200 of 400."),
        "logdet_sign": Run(
            cause="wrong_loss",
            story="My coupling layer's inverse returns the forward log-det; the NLL went to -190 and keeps falling "
                  "while samples from the flow look nothing like moons.",
            fix="logdet_plus",
            competing=("lr_x0.1",),
        ),
    },
)

ITERS = 400
N_SAMPLES = 2 ** 9
K = 6
HIDDEN = 32
SCALE = 0.25
NOISE = 0.05


def moons(n: int, random_state: int) -> torch.Tensor:
    from sklearn.datasets import make_moons

    x, _ = make_moons(n, noise=NOISE, random_state=random_state)
    return torch.tensor(x * SCALE, dtype=torch.float32)


def moons_stream(seed: int) -> torch.Tensor:
    """The fresh batch of every iteration, drawn at once: (ITERS, N_SAMPLES, 2)."""
    return moons(ITERS * N_SAMPLES, random_state=seed).view(ITERS, N_SAMPLES, 2)


class MLP(nn.Module):
    def __init__(self, sizes, init_zeros=True):
        super().__init__()
        layers = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.LeakyReLU(0.0)]
        self.net = nn.Sequential(*layers[:-1])
        if init_zeros:
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)

    def forward(self, x):
        return self.net(x)


class AffineCoupling(nn.Module):
    """x = (x1, x2); x2 -> x2 * exp(s(x1)) + t(x1). `inverse` maps data to latent and returns its log|det|."""

    def __init__(self, logdet_sign_bug: bool):
        super().__init__()
        self.param_map = MLP([1, HIDDEN, HIDDEN, 2])
        self.bug = logdet_sign_bug

    def forward(self, z):
        z1, z2 = z[:, :1], z[:, 1:]
        st = self.param_map(z1)
        s, t = st[:, :1], st[:, 1:]
        return torch.cat([z1, z2 * torch.exp(s) + t], dim=1), s.sum(dim=1)

    def inverse(self, x):
        x1, x2 = x[:, :1], x[:, 1:]
        st = self.param_map(x1)
        s, t = st[:, :1], st[:, 1:]
        z2 = (x2 - t) * torch.exp(-s)
        log_det = s.sum(dim=1) if self.bug else -s.sum(dim=1)   # the bug: the forward pass's log-det
        return torch.cat([x1, z2], dim=1), log_det


class Swap(nn.Module):
    def forward(self, z):
        return z.flip(1), torch.zeros(len(z))

    def inverse(self, x):
        return x.flip(1), torch.zeros(len(x))


class NormalizingFlow(nn.Module):
    def __init__(self, logdet_sign_bug: bool):
        super().__init__()
        flows = []
        for _ in range(K):
            flows += [AffineCoupling(logdet_sign_bug), Swap()]
        self.flows = nn.ModuleList(flows)

    @staticmethod
    def base_log_prob(z):
        return -0.5 * (z ** 2).sum(dim=1) - math.log(2 * math.pi)

    def log_prob(self, x):
        log_q = torch.zeros(len(x))
        z = x
        for flow in reversed(self.flows):
            z, log_det = flow.inverse(z)
            log_q = log_q + log_det
        return self.base_log_prob(z) + log_q

    def forward_kld(self, x):
        return -torch.mean(self.log_prob(x))


def _bug(run, variant):
    return run == "logdet_sign" and variant != "logdet_plus"


def _build(run, seed, variant):
    torch.manual_seed(seed)
    model = NormalizingFlow(_bug(run, variant))
    lr = 5e-4 * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-5)
    return model, optimizer


def _ckpt_iter(run):
    return 200 if run == "healthy" else 100


def honest_nll(model: NormalizingFlow, x: torch.Tensor) -> float:
    """-mean log q(x) with the log-det's correct sign, whatever the model was trained with."""
    with torch.no_grad():
        z, log_q = x, torch.zeros(len(x))
        for flow in reversed(model.flows):
            if isinstance(flow, AffineCoupling):
                st = flow.param_map(z[:, :1])
                s, t = st[:, :1], st[:, 1:]
                z = torch.cat([z[:, :1], (z[:, 1:] - t) * torch.exp(-s)], dim=1)
                log_q = log_q - s.sum(dim=1)
            else:
                z, _ = flow.inverse(z)
        return float(-(NormalizingFlow.base_log_prob(z) + log_q).mean())


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    model, optimizer = _build(run, seed, variant)
    ckpt = out_dir / "checkpoint.pt"
    loss_hist = []
    stream = moons_stream(seed)
    for it in range(ITERS):
        optimizer.zero_grad()
        x = stream[it]
        loss = model.forward_kld(x)
        if not (torch.isnan(loss) | torch.isinf(loss)):
            loss.backward()
            optimizer.step()
        loss_hist.append(loss.item())
        if it + 1 == _ckpt_iter(run):
            torch.save({"iteration": it + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loss_hist": np.array(loss_hist).tolist()}, ckpt)
    test = moons(2000, random_state=seed * 100000 + 99999)
    return Trained(checkpoint=ckpt, train_losses=loss_hist,
                   metrics={"first": float(np.mean(loss_hist[:20])), "last": float(np.mean(loss_hist[-50:])),
                            "honest_test_nll": honest_nll(model, test)})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if not m["honest_test_nll"] < -0.5:
            return f"healthy flow failed to fit: NLL {m['first']:.2f} -> {m['last']:.2f}, test {m['honest_test_nll']:.2f}"
        return None
    nll = m["honest_test_nll"]
    if nll != nll or nll > 0.0:
        return (f"logged NLL {m['first']:.2f} -> {m['last']:.4g} nats over {ITERS} iterations, but the flow's true NLL "
                f"on fresh moons is {nll:.4g} nats (a working flow: about -1.1)")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    model, optimizer = _build(run, 0, None)
    start = _ckpt_iter(run)
    stream = moons_stream(0)
    batches = [stream[it] for it in range(start, start + 48)]
    val = [moons(N_SAMPLES, random_state=99999 - i) for i in range(4)]
    return triage.Setup(model=model, optimizer=optimizer,
                        loss_fn=lambda model, x: model.forward_kld(x),
                        batches=batches, val_batches=val, total_steps=ITERS)


def setup_healthy():
    return _setup("healthy")


def setup_logdet_sign():
    return _setup("logdet_sign")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            if r == "healthy" and v is not None:
                continue
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      [round(x, 2) for x in tr.train_losses[::100]], symptom(r, tr))
