"""CORAL ordinal regression (K-1 rank-consistent binary tasks) on a binned tabular target, after coral-pytorch.

What it does
------------
An MLP with a CORAL output layer predicts one of K=5 ordered grades of a tabular record. The data is made in
code (seeded): 8 numeric features and a noisy nonlinear continuous response, which the owner turns into five
equal-frequency ordinal classes by the response's rank (grade = rank * K // n, labels 0..K-1 as coral-pytorch
requires). The CORAL layer is one shared weight vector (a Linear to 1 output, no bias) plus K-1 biases, so
the K-1 logits differ only by their bias (rank consistency). The loss is coral-pytorch's `coral_loss` on the
extended binary "levels" (label k -> k ones then K-1-k zeros, built per batch as `levels_from_labelbatch`
does), summed over the K-1 tasks and averaged over the batch; the prediction is the number of tasks whose
probability exceeds 0.5 (`proba_to_label`), scored by the mean absolute error. Its loss has a floor well
above 0: neighbouring grades overlap because the response is noisy, so a healthy run's validation loss
levels off near 0.7 (from 2.3 for the class prior) while the MAE falls from about 1.2 to about 0.3.

Public original
---------------
Raschka-Research-Group/coral-pytorch: `coral_pytorch/layers.py` (CoralLayer: `coral_weights =
Linear(size_in, 1, bias=False)`, `coral_bias = Parameter(zeros(num_classes-1))`), `losses.py` (`coral_loss`:
-sum(logsigmoid(logits)*levels + (logsigmoid(logits) - logits)*(1-levels), dim=1), mean), `dataset.py`
(`levels_from_labelbatch`, `proba_to_label`), and its MLP tutorial on the cement_strength table (labels
shifted to start at 0, StandardScaler, Adam, a loop that builds the levels inside each batch and prints
the train/test MAE each epoch). Read with the `search` tool (code and docs corpora). The checkpoint is the
usual tutorial dict {"epoch", "model_state_dict", "optimizer_state_dict"} saved after an epoch.

Triage setup: batches are (features, class_labels) as the DataLoader gives them; `loss_fn` builds the
levels from the integer labels as the loop does; `val_batches` is the held-out split the tutorial scores;
`steps_per_epoch` turns the checkpoint's epoch into a step.

Runs
----
healthy: the run as the tutorial writes it (Adam 5e-3, batch 64), 30 epochs. Validation loss levels off near
    0.7 (its floor is the noise between neighbouring grades, not 0) while the MAE creeps down to about 0.3.
    Checkpoint after epoch 8 (validation loss about 0.95 and still falling).

grades_from_argsort (cause `label_bug`): to make equal-frequency grades the owner wrote
    `rank = np.argsort(y)` and `grade = rank * K // n`. But `argsort` returns the indices that sort `y`,
    not each row's rank (that is `argsort(argsort(y))`, or scipy's `rankdata`) -- a classic numpy slip
    (Stack Overflow question 9710087 "Return order of numpy array": "Using argsort, I can only tell how the
    values should be reordered"; the "Double argsort trick" post, berkayantmen.com/rank.html, and the
    "Ranking using numpy.argsort" note: "One might think these indices are exactly the ranks we are after,
    but this is not the case"). Each row's grade is then the bin of some other row's index: the
    labels are a fixed permutation of the right ones, unrelated to the features, so the model can only learn
    the class prior (and memorise the training rows a little). Symptom: held-out MAE stays at the
    constant-prediction level (about 1.2) and the validation loss does not fall below that of predicting
    the prior, while the training loss drifts down a little. The deciding fix is the labels (rank
    correctly): `label_bug`. Competing: a 10x lower learning rate and a wider MLP (what a user tries for a
    model that "does not learn"); neither helps. Checkpoint after epoch 8, the symptom plain by then.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import triage

if __package__ in (None, ""):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

NUM_CLASSES = 5
N_ROWS = 4000
N_FEATURES = 8
BATCH = 64
LR = 5e-3
EPOCHS = 30
CKPT_EPOCH = 8

PROGRAM = Program(
    name="ordinal_regression",
    kind="ordinal",
    original="Raschka-Research-Group/coral-pytorch (CoralLayer, coral_loss, levels_from_labelbatch, MLP tutorial)",
    runs={
        "healthy": Run(
            cause="healthy",
            story="CORAL MLP on five equal-frequency grades of a noisy response. The validation loss levels "
                  "off near 0.7 (not 0: neighbouring grades overlap) while the MAE keeps falling slowly. "
                  "Checkpoint at epoch 8.",
        ),
        "grades_from_argsort": Run(
            cause="label_bug",
            story="My CORAL model does not learn: test MAE stays about 1.2, what predicting the middle grade "
                  "gives, and the validation loss sits at the level of the class prior. I built the grades "
                  "with rank = np.argsort(y); grade = rank * K // n. A lower LR and a wider MLP changed "
                  "nothing.",
            fix="rank_with_double_argsort",
            competing=("lower_lr", "wider_mlp"),
        ),
    },
)


# ----------------------------------------------------------------------------------------------- data
def make_table(seed: int):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_ROWS, N_FEATURES))
    X[:, :3] = X[:, :3] * np.array([80.0, 15.0, 3.0]) + np.array([280.0, 60.0, 7.0])   # raw units
    z = (X - X.mean(0)) / X.std(0)
    y = (1.2 * z[:, 0] + 0.8 * np.sin(2 * z[:, 1]) + 0.6 * z[:, 2] * z[:, 3] - 0.5 * z[:, 4] ** 2
         + 0.4 * z[:, 5] + 0.35 * rng.normal(size=N_ROWS))
    return X.astype(np.float32), y


def grades(y: np.ndarray, run: str, variant: str | None) -> np.ndarray:
    if run == "grades_from_argsort" and variant != "rank_with_double_argsort":
        rank = np.argsort(y)                               # the fault: sort order, not each row's rank
    else:
        rank = np.argsort(np.argsort(y))
    return (rank * NUM_CLASSES // len(y)).astype(np.int64)


def datasets(run: str, variant: str | None, seed: int):
    X, y = make_table(seed)
    labels = grades(y, run, variant)
    rng = np.random.default_rng(100 + seed)
    perm = rng.permutation(N_ROWS)
    n_tr = int(0.8 * N_ROWS)
    tr, te = perm[:n_tr], perm[n_tr:]
    mu, sd = X[tr].mean(0), X[tr].std(0)                   # StandardScaler fitted on the training split
    Xs = (X - mu) / sd
    return (torch.tensor(Xs[tr]), torch.tensor(labels[tr])), (torch.tensor(Xs[te]), torch.tensor(labels[te]))


def loader(x, y, batch, shuffle, g=None):
    idx = torch.randperm(len(x), generator=g) if shuffle else torch.arange(len(x))
    return [(x[idx[i:i + batch]], y[idx[i:i + batch]]) for i in range(0, len(x), batch)]


# ---------------------------------------------------------------------------------------------- model
class CoralLayer(nn.Module):
    def __init__(self, size_in: int, num_classes: int):
        super().__init__()
        self.coral_weights = nn.Linear(size_in, 1, bias=False)
        self.coral_bias = nn.Parameter(torch.zeros(num_classes - 1))

    def forward(self, x):
        return self.coral_weights(x) + self.coral_bias


class CoralMLP(nn.Module):
    def __init__(self, input_size: int, num_classes: int, hidden1: int = 64, hidden2: int = 32):
        super().__init__()
        self.network = nn.Sequential(nn.Linear(input_size, hidden1), nn.ReLU(),
                                     nn.Linear(hidden1, hidden2), nn.ReLU())
        self.fc = CoralLayer(hidden2, num_classes)

    def forward(self, x):
        logits = self.fc(self.network(x))
        return logits, torch.sigmoid(logits)


def levels_from_labelbatch(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    rows = [torch.tensor([1.0] * int(k) + [0.0] * (num_classes - 1 - int(k))) for k in labels]
    return torch.stack(rows)


def coral_loss(logits: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    term = F.logsigmoid(logits) * levels + (F.logsigmoid(logits) - logits) * (1 - levels)
    return (-term.sum(dim=1)).mean()


def proba_to_label(probas: torch.Tensor) -> torch.Tensor:
    return (probas > 0.5).sum(dim=1)


def loss_fn(model: CoralMLP, batch):
    features, class_labels = batch
    levels = levels_from_labelbatch(class_labels, NUM_CLASSES)
    logits, _ = model(features)
    return coral_loss(logits, levels)


def build(variant: str | None):
    wide = variant == "wider_mlp"
    model = CoralMLP(N_FEATURES, NUM_CLASSES, *((256, 128) if wide else (64, 32)))
    lr = LR * (0.1 if variant == "lower_lr" else 1.0)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


@torch.no_grad()
def evaluate(model: CoralMLP, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    logits, probas = model(x)
    loss = coral_loss(logits, levels_from_labelbatch(y, NUM_CLASSES)).item()
    mae = (proba_to_label(probas) - y).abs().float().mean().item()
    model.train()
    return loss, mae


def prior_loss(y_tr: torch.Tensor, y_te: torch.Tensor) -> float:
    """Validation loss of the best constant prediction (each task at its training frequency)."""
    lv_tr = levels_from_labelbatch(y_tr, NUM_CLASSES)
    p = lv_tr.mean(0).clamp(1e-6, 1 - 1e-6)
    logits = torch.log(p / (1 - p)).expand(len(y_te), -1)
    return coral_loss(logits, levels_from_labelbatch(y_te, NUM_CLASSES)).item()


# ---------------------------------------------------------------------------------------------- train
def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    (x_tr, y_tr), (x_te, y_te) = datasets(run, variant, seed)
    model, optimizer = build(variant)
    g = torch.Generator().manual_seed(seed)
    losses, val_losses, val_maes = [], [], []
    ckpt = out_dir / "coral_mlp.pt"
    for epoch in range(EPOCHS):
        model.train()
        for features, class_labels in loader(x_tr, y_tr, BATCH, True, g):
            levels = levels_from_labelbatch(class_labels, NUM_CLASSES)
            logits, probas = model(features)
            loss = coral_loss(logits, levels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        vl, vm = evaluate(model, x_te, y_te)
        val_losses.append(vl)
        val_maes.append(vm)
        if epoch + 1 == CKPT_EPOCH:
            torch.save({"epoch": epoch + 1, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict()}, ckpt)
    _, train_mae = evaluate(model, x_tr, y_tr)
    const_mae = (y_te - y_tr.median()).abs().float().mean().item()
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_mae": val_maes[-1], "val_mae_ckpt": val_maes[CKPT_EPOCH - 1],
                            "val_loss": val_losses[-1], "val_loss_min": min(val_losses),
                            "prior_val_loss": prior_loss(y_tr, y_te), "const_mae": const_mae,
                            "train_mae": train_mae, "train_loss_first": float(np.mean(losses[:20])),
                            "train_loss_last": float(np.mean(losses[-20:]))})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if not all(math.isfinite(v) for v in m.values()):
        return f"training went non-finite: {m}"
    if m["val_mae"] > 0.8:
        return (f"held-out MAE {m['val_mae']:.3f} after {EPOCHS} epochs (predicting the median grade: "
                f"{m['const_mae']:.3f}; a healthy run reaches about 0.3); best validation loss "
                f"{m['val_loss_min']:.3f} vs {m['prior_val_loss']:.3f} for the class prior; train loss "
                f"{m['train_loss_first']:.3f} -> {m['train_loss_last']:.3f}")
    return None


# ---------------------------------------------------------------------------------------------- setup
def _setup(run: str) -> triage.Setup:
    torch.manual_seed(0)
    (x_tr, y_tr), (x_te, y_te) = datasets(run, None, 0)
    model, optimizer = build(None)
    g = torch.Generator().manual_seed(12345)
    batches = loader(x_tr, y_tr, BATCH, True, g)           # one shuffled epoch: 50 batches
    val = loader(x_te, y_te, 200, False)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batches=batches, val_batches=val,
                        steps_per_epoch=len(batches), total_steps=EPOCHS * len(batches))


def setup_healthy() -> triage.Setup:
    return _setup("healthy")


def setup_grades_from_argsort() -> triage.Setup:
    return _setup("grades_from_argsort")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        t = time.perf_counter()
        tr = train(r, Path("/tmp/coral_out") / r)
        print(r, round(time.perf_counter() - t, 2), "s", {k: round(v, 3) for k, v in tr.metrics.items()},
              symptom(r, tr))
