"""Keyword spotting with an M5-style 1-D conv net on raw waveforms (synthetic "keywords").

Follows torchaudio's speech-commands tutorial (pytorch/tutorials, intermediate_source/speech_command_classification
_with_torchaudio_tutorial.py, "Speech Command Classification with torchaudio"): the M5 network (a first Conv1d with
an 80-sample kernel and stride 16 over the waveform, BatchNorm1d + ReLU + MaxPool1d blocks, global average pooling, a
Linear layer and log_softmax), `F.nll_loss`, `optim.Adam(lr=0.01, weight_decay=0.0001)` and
`optim.lr_scheduler.StepLR(step_size=20, gamma=0.1)`, which the tutorial steps once per EPOCH after its train/test
functions. torchaudio and the SpeechCommands download are not available, so the "keywords" are synthesised in code:
each of 8 words is a short sequence of tone bursts with word-specific pitches, placed at a random offset, with random
gain, pitch jitter and background noise, at 8 kHz (the tutorial resamples to 8 kHz too). Waveforms are (B, 1, T).

Runs
- healthy: the tutorial's loop; the checkpoint is taken mid-run (epoch 4 of 8) while loss is still falling.
- scheduler_per_batch: the user moved `scheduler.step()` into the batch loop (next to `optimizer.step()`, as done for
  OneCycle/warmup schedules) but kept the tutorial's StepLR(step_size=20, gamma=0.1), which is written in EPOCHS.
  With 16 batches an epoch the LR is 1e-3 after 20 batches, 1e-4 after 40 ... and ~1e-6 by epoch 5: the loss
  freezes on a plateau far above the healthy run's. This is the most common StepLR pitfall (e.g. the "Calling
  scheduler.step() inside the batch loop when using epoch-based schedulers (e.g., StepLR)" entry in
  runebook.dev's LRScheduler.step pitfalls page: "The learning rate plummets to a very small value too quickly,
  and your model stops learning"). Root cause: lr_schedule_decayed (the fix is the schedule: step it once an
  epoch). Competing fixes a user tries first: a 10x larger base LR (the schedule still crushes it within ~60
  batches) and simply training twice as long (the LR is already ~0).
  The checkpoint is the epoch-5 one, once the plateau shows.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="keyword_spotting_cnn",
    kind="audio",
    original="pytorch/tutorials: intermediate_source/speech_command_classification_with_torchaudio_tutorial.py (M5)",
    runs={
        "healthy": Run(cause="healthy", story="M5 on synthetic keywords, StepLR stepped once an epoch as in the "
                                              "tutorial; checkpoint at epoch 4 of 8 while the loss still falls."),
        "scheduler_per_batch": Run(
            cause="lr_schedule_decayed",
            story="I moved scheduler.step() into the batch loop but kept StepLR(step_size=20, gamma=0.1); the "
                  "loss stopped moving after two epochs at a high value.",
            fix="step_per_epoch",
            competing=("lr_x10", "train_longer"),
        ),
    },
)

SR = 8000
T = 2000            # 0.25 s at 8 kHz
N_CLASSES = 8
N_TRAIN = 512
N_VAL = 128
BATCH = 32
EPOCHS = 8


def _keywords(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n synthetic utterances: each word is three tone bursts whose pitches are word-specific."""
    base = torch.tensor([[300., 600., 450.], [300., 450., 600.], [600., 300., 450.], [600., 450., 300.],
                         [450., 300., 600.], [450., 600., 300.], [350., 700., 350.], [700., 350., 700.]])
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    t = torch.arange(T, dtype=torch.float32) / SR
    waves = torch.zeros(n, 1, T)
    seg = 500
    for i in range(n):
        offset = int(torch.randint(0, T - 3 * seg, (1,), generator=g))
        jitter = 1.0 + 0.08 * (torch.rand(1, generator=g).item() - 0.5)
        gain = 0.3 + 0.7 * torch.rand(1, generator=g).item()
        w = torch.zeros(T)
        for k in range(3):
            f = base[labels[i], k] * jitter
            a, b = offset + k * seg, offset + (k + 1) * seg
            phase = 2 * math.pi * torch.rand(1, generator=g).item()
            env = torch.hann_window(seg, periodic=False)
            w[a:b] = env * torch.sin(2 * math.pi * f * t[: seg] + phase)
        waves[i, 0] = gain * w + 0.35 * torch.randn(T, generator=g)
    return waves, labels


def make_data(seed: int):
    g = torch.Generator().manual_seed(1000 + seed)
    xtr, ytr = _keywords(N_TRAIN, g)
    xva, yva = _keywords(N_VAL, g)
    return (xtr, ytr), (xva, yva)


class M5(nn.Module):
    def __init__(self, n_input=1, n_output=N_CLASSES, stride=16, n_channel=16):
        super().__init__()
        self.conv1 = nn.Conv1d(n_input, n_channel, kernel_size=80, stride=stride)
        self.bn1 = nn.BatchNorm1d(n_channel)
        self.pool1 = nn.MaxPool1d(4)
        self.conv2 = nn.Conv1d(n_channel, n_channel, kernel_size=3)
        self.bn2 = nn.BatchNorm1d(n_channel)
        self.pool2 = nn.MaxPool1d(4)
        self.conv3 = nn.Conv1d(n_channel, 2 * n_channel, kernel_size=3)
        self.bn3 = nn.BatchNorm1d(2 * n_channel)
        self.fc1 = nn.Linear(2 * n_channel, n_output)

    def forward(self, x):
        x = self.pool1(F.relu(self.bn1(self.conv1(x))))
        x = self.pool2(F.relu(self.bn2(self.conv2(x))))
        x = F.relu(self.bn3(self.conv3(x)))
        x = F.avg_pool1d(x, x.shape[-1]).permute(0, 2, 1)
        x = self.fc1(x)
        return F.log_softmax(x, dim=2)


def _loss(model, batch):
    data, target = batch
    output = model(data)
    return F.nll_loss(output.squeeze(), target)


def _build(run: str, seed: int, variant: str | None):
    torch.manual_seed(seed)
    model = M5()
    lr = 0.01 * (10 if variant == "lr_x10" else 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=0.0001)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.1)
    return model, optimizer, scheduler


def _batches(x, y, seed, epoch):
    g = torch.Generator().manual_seed(seed * 100 + epoch)
    perm = torch.randperm(len(x), generator=g)
    return [(x[perm[i:i + BATCH]], y[perm[i:i + BATCH]]) for i in range(0, len(x), BATCH)]


def _per_batch(run, variant):
    return run == "scheduler_per_batch" and variant != "step_per_epoch"


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    (xtr, ytr), (xva, yva) = make_data(seed)
    model, optimizer, scheduler = _build(run, seed, variant)
    per_batch = _per_batch(run, variant)
    epochs = EPOCHS * (2 if variant == "train_longer" else 1)
    ckpt_epoch = 4 if run == "healthy" else 5
    losses, val_losses, lrs = [], [], []
    step = 0
    ckpt = out_dir / "checkpoint.pt"
    for epoch in range(1, epochs + 1):
        model.train()
        for data, target in _batches(xtr, ytr, seed, epoch):
            output = model(data)
            loss = F.nll_loss(output.squeeze(), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            lrs.append(optimizer.param_groups[0]["lr"])
            if per_batch:
                scheduler.step()
        # test()
        model.eval()
        with torch.no_grad():
            val_losses.append(float(F.nll_loss(model(xva).squeeze(), yva)))
        if not per_batch:
            scheduler.step()
        if epoch == ckpt_epoch:
            torch.save({"epoch": epoch, "step": step, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "loss": losses[-1]}, ckpt)
    with torch.no_grad():
        acc = float((model(xva).squeeze().argmax(-1) == yva).float().mean())
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_acc": acc, "final_lr": lrs[-1], "steps": step})


def symptom(run: str, trained: Trained) -> str | None:
    tail = sum(trained.train_losses[-16:]) / 16
    if run == "healthy":
        if tail > 0.3 or trained.metrics["val_acc"] < 0.75:
            return f"healthy run failed to train: last-epoch loss {tail:.2f}, val acc {trained.metrics['val_acc']:.2f}"
        return None
    if tail > 0.3:
        return (f"train loss flat at {tail:.2f} over the last epoch (val acc {trained.metrics['val_acc']:.2f}) "
                f"after {trained.metrics['steps']} steps; LR now {trained.metrics['final_lr']:.1e}")
    return None


def _setup(run: str):
    import triage

    torch.set_num_threads(1)
    (xtr, ytr), (xva, yva) = make_data(0)
    model, optimizer, scheduler = _build(run, 0, None)
    per_batch = _per_batch(run, None)
    batches = _batches(xtr, ytr, 0, 5) + _batches(xtr, ytr, 0, 6) + _batches(xtr, ytr, 0, 7)
    val = [(xva[i:i + BATCH], yva[i:i + BATCH]) for i in range(0, N_VAL, BATCH)]
    steps_per_epoch = N_TRAIN // BATCH
    return triage.Setup(
        model=model, optimizer=optimizer, loss_fn=_loss, batches=batches, val_batches=val,
        scheduler=scheduler,
        scheduler_interval="step" if per_batch else "epoch",
        steps_per_epoch=None if per_batch else steps_per_epoch,
        total_steps=EPOCHS * steps_per_epoch,
    )


def setup_healthy():
    return _setup("healthy")


def setup_scheduler_per_batch():
    return _setup("scheduler_per_batch")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 2) for x in tr.train_losses[::16]])
