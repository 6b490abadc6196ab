"""A fully-connected VAE on sklearn's 8x8 digits, trained on the summed BCE + KL objective (negative ELBO).

Follows pytorch/examples vae/main.py (read: its VAE class fc1 -> fc21/fc22 -> reparameterize -> fc3 -> fc4 with a
sigmoid output; `loss_function` = `F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')` plus
`KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())`; `optim.Adam(lr=1e-3)`; the train loop that logs
`loss.item() / len(data)` and prints the epoch's average loss per example; a test() pass per epoch). MNIST is not
available, so the data are sklearn's digits (64 pixels) scaled to [0, 1] by /16; the layer widths are scaled down
(64 -> 128 -> 8 latent). The example saves no checkpoint; the owner here saves one dict per epoch
{'epoch', 'step', 'model_state_dict', 'optimizer_state_dict'}, the usual PyTorch tutorial layout.

Runs
- healthy: the example as written. Its loss never nears 0: the targets are grey levels, so the summed BCE has a
  floor at the pixels' own entropy (~25 nats per digit here) and the KL term is positive; the per-example loss
  falls from ~45 to ~30 and keeps creeping down. Checkpoint: epoch 6 of 12, still improving.
- kl_sign: the owner typed the KL term from the paper's appendix B, which gives -D_KL =
  0.5 * sum(1 + log sigma^2 - mu^2 - sigma^2), and added it to the BCE without its minus (the exact confusion of
  pytorch/examples issue #824 "Implementation of KL divergence in VAE example" and #298 "Reversed Sign?", and
  AntixK/PyTorch-VAE issue #68 on a misplaced KLD sign). Minimising BCE - D_KL rewards a posterior as far from
  the prior as possible: mu and log sigma^2 grow without bound and the "loss" runs off to large negative values
  (about -1e4 per digit after a few epochs) while reconstructions get worse. Root cause: wrong_loss (the loss
  itself is wrong: it has no lower bound; restoring the minus removes the symptom). Competing fix a user tries
  first: a 10x lower learning rate (the logged loss falls more slowly, but the honest
  BCE + KL on held-out digits still ends far above a working VAE's, ~42 against ~27 per digit, as the posterior
  drifts away from the prior).
  Checkpoint: the epoch-3 one, once the loss is already negative and falling.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="vae_elbo",
    kind="generative",
    original="pytorch/examples: vae/main.py",
    runs={
        "healthy": Run(cause="healthy", story="VAE on digits as in the example; loss per digit ~45 -> ~30 (its floor "
                                              "is far above 0); checkpoint at epoch 6 of 12 while still improving."),
        "kl_sign": Run(
            cause="wrong_loss",
            story="I wrote the KL term as 0.5*sum(1 + logvar - mu^2 - exp(logvar)) and added it to the BCE; the loss "
                  "went negative after two epochs and keeps falling to -1e4 per digit, samples are garbage.",
            fix="kl_minus",
            competing=("lr_x0.1",),
        ),
    },
)

BATCH = 128
EPOCHS = 12
LATENT = 8


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc21 = nn.Linear(128, LATENT)
        self.fc22 = nn.Linear(128, LATENT)
        self.fc3 = nn.Linear(LATENT, 128)
        self.fc4 = nn.Linear(128, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def make_loss_function(kl_sign_bug: bool):
    def loss_function(recon_x, x, mu, logvar):
        BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
        if kl_sign_bug:
            KLD = 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())  # -D_KL, added as if it were D_KL
        else:
            KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return BCE + KLD
    return loss_function


def make_data(seed: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    tr, te = perm[:1440], perm[1440:]
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[te], y[te])


def _bug(run: str, variant: str | None) -> bool:
    return run == "kl_sign" and variant != "kl_minus"


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    model = VAE()
    lr = 1e-3 * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return model, optimizer, make_loss_function(_bug(run, variant))


def _loader(ds, seed, epoch, shuffle=True):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    return DataLoader(ds, batch_size=BATCH, shuffle=shuffle, generator=g)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    train_ds, test_ds = make_data(seed)
    model, optimizer, loss_function = _build(run, seed, variant)
    ckpt_epoch = 6 if run == "healthy" else 3
    ckpt = out_dir / "checkpoint.pt"
    losses, epoch_losses, test_losses = [], [], []
    step = 0
    for epoch in range(1, EPOCHS + 1):
        model.train()
        train_loss = 0.0
        for data, _ in _loader(train_ds, seed, epoch):
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            step += 1
            losses.append(loss.item() / len(data))
        epoch_losses.append(train_loss / len(train_ds))
        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for data, _ in _loader(test_ds, seed, epoch, shuffle=False):
                recon, mu, logvar = model(data)
                test_loss += loss_function(recon, data, mu, logvar).item()
        test_losses.append(test_loss / len(test_ds))
        if epoch == ckpt_epoch:
            torch.save({"epoch": epoch, "step": step, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict()}, ckpt)
    # the honest objective (BCE + D_KL) on the test set, whatever the run minimised
    honest = make_loss_function(False)
    with torch.no_grad():
        x = test_ds.tensors[0]
        recon, mu, logvar = model(x)
        honest_test = honest(recon, x, mu, logvar).item() / len(x)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=test_losses,
                   metrics={"first_epoch": epoch_losses[0], "last_epoch": epoch_losses[-1],
                            "honest_test": honest_test, "steps": step})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if not (m["last_epoch"] < 0.8 * m["first_epoch"]) or m["honest_test"] > 40:
            return f"healthy VAE failed to train: loss per digit {m['first_epoch']:.1f} -> {m['last_epoch']:.1f}"
        return None
    if m["honest_test"] != m["honest_test"] or m["honest_test"] > 35 or m["last_epoch"] < 0:
        return (f"logged loss per digit {m['first_epoch']:.1f} -> {m['last_epoch']:.3g} over {m['steps']} steps, but "
                f"the honest BCE + KL on the test set is {m['honest_test']:.3g} per digit (a working VAE: ~27)")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    train_ds, test_ds = make_data(0)
    model, optimizer, loss_function = _build(run, 0, None)

    def loss_fn(model, batch):
        data, _ = batch
        recon, mu, logvar = model(data)
        return loss_function(recon, data, mu, logvar)

    ckpt_epoch = 6 if run == "healthy" else 3
    batches = []
    for epoch in range(ckpt_epoch + 1, ckpt_epoch + 5):
        batches += list(_loader(train_ds, 0, epoch))
    val = list(_loader(test_ds, 0, 0, shuffle=False))
    steps_per_epoch = -(-len(train_ds) // BATCH)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches, val_batches=val,
                        total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_kl_sign():
    return _setup("kl_sign")


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
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 2) for k, x in tr.metrics.items()},
                      symptom(r, tr))
