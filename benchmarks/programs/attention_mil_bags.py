"""Attention-based deep multiple-instance learning (Ilse et al. 2018) on bags of precomputed tile features.

Written after AMLab-Amsterdam/AttentionDeepMIL (`model.py`: `GatedAttention` -- a per-instance feature
extractor, gated attention `w^T (tanh(V h) * sigmoid(U h))`, softmax over the bag's instances, an attention-
weighted mean `M = A H`, a sigmoid classifier; `calculate_objective` with `Y_prob` clamped to [1e-5, 1-1e-5]
and the Bernoulli negative log-likelihood; `main.py`: one bag per step, `DataLoader(batch_size=1,
shuffle=True)`, Adam lr 5e-4, betas (0.9, 0.999), weight_decay 1e-4) and the way whole-slide pipelines such as
CLAM feed it (features of each slide's tiles extracted once and stored per slide, e.g. FLamby's
fed_camelyon16 `Baseline` which adapts that model to 2048-d tile embeddings). I read the model files of both
(through the code search), not their data pipelines.

Data: 160 training slides and 64 validation slides, each a bag of 8-40 tile features of dimension 32. Most
tiles come from a "normal" cluster; a positive slide has 1-5 tiles from a "tumour" direction. One label per
bag (positive if any tile is tumour); the instances are never labelled. A checkpoint `{"epoch", "step",
"model_state_dict", "optimizer_state_dict"}` is written every 40 bags (steps).

Runs
- healthy: 5 epochs over clean features; checkpoint at step 240 (epoch 2) while the validation loss is still
  falling. The per-step loss is noisy by nature (one bag per step, binary label).
- nan_tile_features: one slide's feature file holds NaN rows: its feature extraction hit a corrupt JPEG tile
  (mahmoodlab/CLAM#225 "Many Nan values in the extracted feature", which also mentions "Corrupt JPEG data"
  errors from OpenSlide). The NaN enters the attention softmax and the loss of that one bag is NaN; Adam writes
  NaN into every weight and every later loss is NaN. Root cause `nonfinite_data` (NaN in the inputs: the id
  the root-causes page gives it; the program's author, who was given README alone, wrote `bad_batch`, and its
  first read was scored against that, 2026-11-29): the fix (`drop_nonfinite_slides`,
  skipping slides whose features are not finite when the dataset is built) removes it. Competing fixes a user
  tries first: lr x0.1 (`lr_5e-5`) and gradient clipping at 1.0 (`clip_grad_1`), both leave it. The
  checkpoint is the last periodic one before the NaN (step 40; the bad slide is the 71st of the first epoch).
  The setups' data snapshot is the bags the run meets after its checkpoint, in the loader's order (here the
  bad slide is the 31st of 120).
"""

from __future__ import annotations

from pathlib import Path

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
    name="attention_mil_bags",
    kind="multiple-instance",
    original="AMLab-Amsterdam/AttentionDeepMIL: model.py (GatedAttention) + main.py; FLamby fed_camelyon16 model.py",
    runs={
        "healthy": Run(cause="healthy", story="Gated-attention MIL over slide tile features, one bag per step, "
                       "Adam 5e-4; noisy per-step loss, validation loss falling at the step-240 checkpoint."),
        "nan_tile_features": Run(
            cause="nonfinite_data",
            story="Training went to NaN in the middle of the first epoch and stayed NaN; lowering the LR and "
                  "clipping gradients changed nothing.",
            fix="drop_nonfinite_slides", competing=("lr_5e-5", "clip_grad_1")),
    },
)

DIM, N_TRAIN, N_VAL, EPOCHS, CKPT_EVERY, BAD_POS = 32, 160, 64, 5, 40, 70


def make_slides(n, g, mu_normal, tumour_dir):
    bags = []
    for i in range(n):
        k = int(torch.randint(8, 41, (1,), generator=g))
        h = mu_normal + torch.randn(k, DIM, generator=g)
        label = i % 2
        if label:
            n_t = int(torch.randint(1, 6, (1,), generator=g))
            idx = torch.randperm(k, generator=g)[:n_t]
            h[idx] += 3.5 * tumour_dir
        bags.append((h, torch.tensor([float(label)])))
    perm = torch.randperm(n, generator=g)
    return [bags[int(j)] for j in perm]


def epoch_order(epoch, seed):
    return torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()


def make_data(seed, run, variant):
    g = torch.Generator().manual_seed(5200 + seed)
    mu = 0.5 * torch.randn(DIM, generator=g)
    d = torch.randn(DIM, generator=g)
    d = d / d.norm()
    train_bags = make_slides(N_TRAIN, g, mu, d)
    val_bags = make_slides(N_VAL, g, mu, d)
    if run == "nan_tile_features":
        bad = epoch_order(0, seed)[BAD_POS]             # the slide whose extraction hit a corrupt tile
        h, y = train_bags[bad]
        h = h.clone()
        rows = torch.arange(0, len(h), 3)
        h[rows] = float("nan")
        train_bags[bad] = (h, y)
    if variant == "drop_nonfinite_slides":
        train_bags = [(h, y) if torch.isfinite(h).all() else None for h, y in train_bags]
    return train_bags, val_bags


class GatedAttention(nn.Module):
    def __init__(self, dim=DIM, m=64, l=32):
        super().__init__()
        self.feature_extractor = nn.Sequential(nn.Linear(dim, m), nn.ReLU())
        self.attention_V = nn.Sequential(nn.Linear(m, l), nn.Tanh())
        self.attention_U = nn.Sequential(nn.Linear(m, l), nn.Sigmoid())
        self.attention_weights = nn.Linear(l, 1)
        self.classifier = nn.Sequential(nn.Linear(m, 1), nn.Sigmoid())

    def forward(self, x):                       # x: (1, K, dim), one bag
        h = self.feature_extractor(x.squeeze(0))                    # K x M
        a = self.attention_weights(self.attention_V(h) * self.attention_U(h))   # K x 1
        a = F.softmax(a.transpose(1, 0), dim=1)                     # 1 x K
        m = a @ h                                                   # 1 x M
        y_prob = self.classifier(m)
        return y_prob, (y_prob >= 0.5).float(), a

    def calculate_objective(self, x, y):
        y_prob, _, a = self(x)
        y_prob = torch.clamp(y_prob, min=1e-5, max=1.0 - 1e-5)
        return -(y * torch.log(y_prob) + (1.0 - y) * torch.log(1.0 - y_prob)).mean(), a


def loss_fn(model, batch):
    x, y = batch
    loss, _ = model.calculate_objective(x, y)
    return loss


def config(variant):
    lr = 5e-5 if variant == "lr_5e-5" else 5e-4
    clip = 1.0 if variant == "clip_grad_1" else None
    return lr, clip


def build(variant, seed=0):
    torch.manual_seed(seed)
    model = GatedAttention()
    lr, clip = config(variant)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=1e-4)
    return model, opt, clip


def loader(bags, order):
    """DataLoader(batch_size=1) over the slides: each batch is ((1, K, dim) features, (1,) label)."""
    return [(bags[i][0].unsqueeze(0), bags[i][1]) for i in order if bags[i] is not None]


@torch.no_grad()
def evaluate(model, val_bags):
    model.eval()
    losses, errors = [], []
    for x, y in loader(val_bags, range(len(val_bags))):
        loss, _ = model.calculate_objective(x, y)
        losses.append(float(loss))
        errors.append(float((model(x)[1] != y).float()))
    model.train()
    return sum(losses) / len(losses), sum(errors) / len(errors)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_bags, val_bags = make_data(seed, run, variant)
    model, opt, clip = build(variant, seed)
    ckpt = Path(out_dir) / "mil_checkpoint.pt"
    last_ckpt_step = 240 if run == "healthy" else 10 ** 9
    losses, vals, errs = [], [], []
    step, nan_step = 0, -1
    for epoch in range(EPOCHS):
        for x, y in loader(train_bags, epoch_order(epoch, seed)):
            opt.zero_grad()
            loss = loss_fn(model, (x, y))
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            losses.append(loss.item())
            step += 1
            if nan_step < 0 and not torch.isfinite(loss):
                nan_step = step
            finite = all(torch.isfinite(p).all() for p in model.parameters())
            if step % CKPT_EVERY == 0 and finite and step <= last_ckpt_step:
                torch.save({"epoch": epoch, "step": step, "model_state_dict": model.state_dict(),
                            "optimizer_state_dict": opt.state_dict()}, ckpt)
        vl, ve = evaluate(model, val_bags)
        vals.append(vl)
        errs.append(ve)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"nan_step": nan_step, "val_loss": vals[-1], "val_error": errs[-1],
                            "val_loss_epoch1": vals[0]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    tl = trained.train_losses
    if m["nan_step"] >= 0:
        n_nan = sum(1 for v in tl if v != v)
        return (f"training loss NaN from step {m['nan_step']} on ({n_nan} of {len(tl)} steps NaN); "
                f"validation loss {m['val_loss']:.3f}")
    if not m["val_error"] <= 0.2:
        return (f"validation error {m['val_error']:.2f} and loss {m['val_loss']:.3f} after "
                f"{len(trained.val_losses)} epochs")
    return None


def _setup(run):
    import triage

    train_bags, val_bags = make_data(0, run, None)
    model, opt, _ = build(None, 0)
    # the bags the run meets next after its checkpoint (healthy: step 240 = epoch 1, bag 80; the faulty run's
    # last finite checkpoint: step 40 = epoch 0, bag 40), in the DataLoader's order
    epoch, pos = (1, 80) if run == "healthy" else (0, 40)
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn,
                        batches=loader(train_bags, epoch_order(epoch, 0)[pos:]),
                        val_batches=loader(val_bags, range(len(val_bags))),
                        total_steps=EPOCHS * N_TRAIN)


def setup_healthy():
    return _setup("healthy")


def setup_nan_tile_features():
    return _setup("nan_tile_features")
