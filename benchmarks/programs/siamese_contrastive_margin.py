"""Siamese network on image pairs (same / different class) trained with a contrastive margin loss.

Follows pytorch/examples siamese_network/main.py (read through the code search): the `APP_MATCHER` dataset that, for
an even index, pairs a random image with ANOTHER index of the same class (its `while random_index_2 ==
random_index_1` loop) and for an odd index with an image of another class, target 1./0.; a shared twin network run
on both images (`forward_once`); `optim.Adadelta(lr=1.0)` and `StepLR(step_size=1, gamma=0.7)` stepped once an
epoch; a log every 10 batches. MNIST is replaced by scikit-learn's bundled 8x8 digits, the ResNet-18 by a small
conv net, and -- as many users of the example do for a verification task -- the concatenation + sigmoid + BCELoss
head by the Hadsell-Chopra-LeCun contrastive loss on the Euclidean distance between the two embeddings,
`y * d^2 + (1 - y) * max(margin - d, 0)^2`, with the distance written by hand as
`(out1 - out2).pow(2).sum(1).sqrt()`. The digit collection, like many scraped image sets, holds exact duplicate
files (about 4% of images appear twice under different indices); the example's index check does not see them.
The run saves a checkpoint every 10 batches (at its log interval).

Runs
- healthy: the same program with the distance computed as `F.pairwise_distance` (which adds eps inside the
  norm); checkpoint at epoch 3 of 6 while the loss still falls.
- sqrt_distance_nan: the hand-written distance. The first batch holding a positive pair of two duplicate files
  has d = 0 exactly, and sqrt's backward at 0 is 1/(2*sqrt(0)) = inf, times the 0 gradient of d^2 gives NaN in
  every parameter: loss NaN from the next step on. The classic "contrastive loss NaN" with a hand-made euclidean
  distance (sqrt has an infinite derivative at 0: the usual answer is an eps inside the sqrt, or
  F.pairwise_distance, whose docs show its eps). Root cause: numerical_instability (the fix is an eps inside the
  sqrt). Competing fixes a user tries first: a 10x lower LR and gradient clipping at 1.0 (a NaN gradient stays
  NaN through clip_grad_norm_). The checkpoint is the last periodic one before the NaN; the snapshot given to
  triage is the batches the run took after it, in order (the NaN batch among them).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="siamese_contrastive_margin",
    kind="ranking",
    original="pytorch/examples: siamese_network/main.py",
    runs={
        "healthy": Run(cause="healthy", story="Siamese digits with a contrastive margin loss on "
                                              "F.pairwise_distance; checkpoint at epoch 3 of 6 while it improves."),
        "sqrt_distance_nan": Run(
            cause="numerical_instability",
            story="I wrote the euclidean distance as (a-b).pow(2).sum(1).sqrt(); after some batches the loss "
                  "turned NaN and never came back.",
            fix="eps_in_sqrt",
            competing=("lr_x0.1", "clip_1.0"),
        ),
    },
)

BATCH = 64
EPOCHS = 6
LOG_INTERVAL = 10
MARGIN = 2.0
DUP_FRACTION = 0.04


def make_data(seed: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target)
    g = torch.Generator().manual_seed(3000 + seed)
    dup = torch.randperm(len(x), generator=g)[: int(DUP_FRACTION * len(x))]
    x = torch.cat([x, x[dup]])          # the same files stored twice under another index
    y = torch.cat([y, y[dup]])
    return x, y


class APPMatcher:
    """The example's pair sampler over an in-memory image set."""

    def __init__(self, x, y):
        self.data, self.targets = x, y
        self.grouped_examples = {c: torch.where(y == c)[0].tolist() for c in range(10)}

    def __len__(self):
        return len(self.data)

    def sample(self, index, rng: random.Random):
        selected_class = rng.randint(0, 9)
        group = self.grouped_examples[selected_class]
        random_index_1 = rng.randint(0, len(group) - 1)
        index_1 = group[random_index_1]
        if index % 2 == 0:
            random_index_2 = rng.randint(0, len(group) - 1)
            while random_index_2 == random_index_1:
                random_index_2 = rng.randint(0, len(group) - 1)
            index_2 = group[random_index_2]
            target = 1.0
        else:
            other = rng.randint(0, 9)
            while other == selected_class:
                other = rng.randint(0, 9)
            index_2 = self.grouped_examples[other][rng.randint(0, len(self.grouped_examples[other]) - 1)]
            target = 0.0
        return index_1, index_2, target


def epoch_batches(ds: APPMatcher, seed: int, epoch: int):
    rng = random.Random(seed * 1000 + epoch)
    order = list(range(len(ds)))
    rng.shuffle(order)
    batches = []
    for s in range(0, len(order), BATCH):
        trip = [ds.sample(i, rng) for i in order[s:s + BATCH]]
        i1 = torch.tensor([t[0] for t in trip])
        i2 = torch.tensor([t[1] for t in trip])
        batches.append((ds.data[i1], ds.data[i2], torch.tensor([t[2] for t in trip])))
    return batches


class SiameseNetwork(nn.Module):
    def __init__(self, eps_distance=True):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward_once(self, x):
        return self.features(x)

    def forward(self, input1, input2):
        return self.forward_once(input1), self.forward_once(input2)


def make_loss(hand_written_sqrt: bool):
    def contrastive_loss(model, batch):
        images_1, images_2, targets = batch
        out1, out2 = model(images_1, images_2)
        if hand_written_sqrt:
            distance = (out1 - out2).pow(2).sum(1).sqrt()
        else:
            distance = F.pairwise_distance(out1, out2)
        loss = targets * distance.pow(2) + (1 - targets) * torch.clamp(MARGIN - distance, min=0).pow(2)
        return loss.mean()
    return contrastive_loss


def _faulty(run, variant):
    return run == "sqrt_distance_nan" and variant != "eps_in_sqrt"


def _build(seed, variant):
    torch.manual_seed(seed)
    model = SiameseNetwork()
    lr = 1.0 * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    return model, optimizer, scheduler


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    x, y = make_data(seed)
    ds = APPMatcher(x, y)
    model, optimizer, scheduler = _build(seed, variant)
    loss_fn = make_loss(_faulty(run, variant))
    ckpt = out_dir / "siamese.pt"
    losses, step, nan_step = [], 0, None
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for batch_idx, batch in enumerate(epoch_batches(ds, seed, epoch)):
            if step % LOG_INTERVAL == 0 and nan_step is None:
                if run != "healthy" or epoch <= 3:
                    torch.save({"epoch": epoch, "step": step, "model_state_dict": model.state_dict(),
                                "optimizer_state_dict": optimizer.state_dict(),
                                "scheduler": scheduler.state_dict()}, ckpt)
            optimizer.zero_grad()
            loss = loss_fn(model, batch)
            loss.backward()
            if variant == "clip_1.0":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            losses.append(loss.item())
            if nan_step is None and not torch.isfinite(loss):
                nan_step = step - 1
            if nan_step is not None and step - nan_step > 20:
                break
        scheduler.step()
        if nan_step is not None and step - nan_step > 20:
            break
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"nan_step": -1 if nan_step is None else nan_step, "steps": step})


def symptom(run: str, trained: Trained) -> str | None:
    losses = trained.train_losses
    if trained.metrics["nan_step"] >= 0:
        return f"loss went to NaN at step {int(trained.metrics['nan_step'])} (loss before: {losses[0]:.2f} at step 0)"
    if run == "healthy":
        first, last = sum(losses[:10]) / 10, sum(losses[-20:]) / 20
        if last > 0.5 * first:
            return f"healthy run failed to train: loss {first:.2f} -> {last:.2f}"
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    x, y = make_data(0)
    ds = APPMatcher(x, y)
    model, optimizer, scheduler = _build(0, None)
    stream = []
    for epoch in range(1, EPOCHS + 1):
        stream += epoch_batches(ds, 0, epoch)
    if run == "healthy":
        start = 3 * len(epoch_batches(ds, 0, 1))   # the epoch-3 checkpoint sits at the end of epoch 3's last log
        start = (start - 1) // LOG_INTERVAL * LOG_INTERVAL
    else:
        # the NaN step depends on the data alone (the first positive pair of two identical files)
        first_bad = next(i for i, (a, b, t) in enumerate(stream)
                         if bool(((a - b).flatten(1).abs().sum(1) == 0)[t == 1].any()))
        start = first_bad // LOG_INTERVAL * LOG_INTERVAL
    steps_per_epoch = len(epoch_batches(ds, 0, 1))
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=make_loss(_faulty(run, None)),
                        batches=stream[start:start + 48], scheduler=scheduler, scheduler_interval="epoch",
                        steps_per_epoch=steps_per_epoch, total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_sqrt_distance_nan():
    return _setup("sqrt_distance_nan")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                ck = torch.load(tr.checkpoint)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, "ckpt step", ck["step"], symptom(r, tr),
                      [round(x, 2) for x in tr.train_losses[::20]])
