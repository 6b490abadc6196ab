"""Contrastive Predictive Coding (van den Oord et al. 2018) on raw 1-D "audio": a strided conv encoder to frames
z_t, a GRU context c_t, one linear predictor W_k per future step, and the InfoNCE loss with the other utterances
of the batch as negatives.

Written after jefflai108/Contrastive-Predictive-Coding-PyTorch. I read `src/model/model.py` (`CDCK2`: a 5-layer
strided Conv1d+BatchNorm+ReLU encoder with a 160x downsampling, `z.transpose(1, 2)`, a random `t_samples` drawn
once per batch, a GRU over `z[:, :t_samples+1]`, `c_t = output[:, t_samples]`, `pred[i] = Wk[i](c_t)`,
`total = mm(encode_samples[i], pred[i].T)` (B x B), `nce += sum(diag(lsoftmax(total)))`,
`nce /= -1 * batch * timestep`, accuracy = argmax over dim 0 equal to arange(batch); kaiming fan_out init),
`src/training_v1.py` (`train`: zero_grad, `init_hidden`, `acc, loss, hidden = model(data, hidden)`, backward,
`optimizer.step()`, `optimizer.update_learning_rate()` every step) and `main.py` (`ScheduledOptim` wrapping
`Adam(betas=(0.9, 0.98), eps=1e-9, weight_decay=1e-4, amsgrad=True)` with the Transformer schedule
`lr = d_model^-0.5 * min(step^-0.5, step * n_warmup_steps^-1.5)`, d_model 128, `--n-warmup-steps 50` by default;
a snapshot `{"epoch", "validation_acc", "state_dict", "validation_loss", "optimizer"}` whenever validation
accuracy improves). Here the schedule is the same formula written as a `LambdaLR` on a base lr of 1.0 (so it is
stepped and saved like any scheduler; the original's `ScheduledOptim.state_dict()` returns None), the encoder has 3
conv layers (40x downsampling, 64 channels), the GRU 32 units, 4 prediction steps, batch 32. The "audio" is made
in code: each utterance has its own pitch and timbre and is a chain of 60-sample "phones" whose frequency moves
around that pitch, plus noise; 1280 samples -> 32 frames.

The InfoNCE loss is read against log(32) = 3.47 (chance among the 32 utterances of the batch); being a
cross-entropy over negatives drawn from the batch, it has a floor above 0 that depends on the batch. With the
original's kaiming fan_out init the first logits are large and the loss STARTS above chance (~4.7), in the
healthy run too: it is the init the original uses, and the healthy run leaves it behind within an epoch.
Accuracy here is the fraction of (prediction step, utterance) pairs whose own future frame scores highest (the
original counts only the last prediction step, over the other axis).

Runs
- healthy: n_warmup_steps 50 as in the original (peak lr 0.0125 at step 50, then step^-0.5); 5 epochs of 64
  steps; the best-validation snapshot after epoch 3 is the checkpoint (validation accuracy still rising).
- warmup_far_too_long: the owner ran the recipe with `--n-warmup-steps 10000`, a figure from a transformer
  recipe (this repository's default is 50; Transformer/ASR recipes use 4000-25000 with the same Noam formula).
  hirofumi0810/neural_sp#137 is the same mistake with this formula: `warmup_n_steps=25000` on a small run gives
  "a learning rate curve which went straight up until the end of the training" and poor results;
  s920128/NAR-BERT-ASR#3 shows why the optimizer's own lr cannot rescue it (the Noam scheduler sets the lr
  outright). With d_model 128 the Transformer formula then gives lr = 8.8e-7 x step, so the
  run spends its whole 320 steps at lr 1e-6 .. 3e-4 (1.7e-4 at the step-192 checkpoint, against 6e-3 for the
  healthy schedule there): the NCE loss stays at ~4.5, above log(32), and the accuracy at chance (0.04) for the
  whole run, while the healthy run is at ~1.7 and 0.4.
  Root cause `lr_too_low`: the updates are tiny; n_warmup_steps 50 (`warmup_50`, the run's LR x ~100 at the
  checkpoint's step) trains. Competing fix a user tries first: turning off the weight decay (`no_weight_decay`),
  suspecting it holds the weights back; it leaves the plateau. The checkpoint is the last best-validation
  snapshot (saved at the end of epoch 3, as the original saves on improved validation accuracy).
"""

from __future__ import annotations

import math
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
    name="cpc_infonce_audio",
    kind="contrastive predictive coding",
    original="jefflai108/Contrastive-Predictive-Coding-PyTorch: src/model/model.py (CDCK2), src/training_v1.py, "
             "main.py (ScheduledOptim)",
    runs={
        "healthy": Run(cause="healthy", story="CPC on 1-D synthetic utterances, InfoNCE over the batch (chance "
                       "is log 32 = 3.47; it starts above it, at ~4.7), Transformer-style warmup of 50 steps; validation accuracy of picking the "
                       "true future frame still rising at the epoch-3 snapshot."),
        "warmup_far_too_long": Run(
            cause="lr_too_low",
            story="I set --n-warmup-steps 10000 like a transformer recipe. The NCE loss hardly moves (4.6 -> 4.5, "
                  "above log 32) and the prediction accuracy stays at chance after 5 epochs. Turning off weight decay did "
                  "not help.",
            fix="warmup_50", competing=("no_weight_decay",)),
    },
)

SR_LEN, PHONE, BS, N_TRAIN, N_VAL, EPOCHS = 1280, 60, 32, 2048, 256, 5
DOWN, CH, HID, TIMESTEP, D_MODEL = 40, 64, 32, 4, 128
FRAMES = SR_LEN // DOWN
STEPS_PER_EPOCH = N_TRAIN // BS


# ----------------------------------------------------------------------------------------------- data
def make_utterances(n, g):
    t = torch.arange(SR_LEN).float()
    pitch = 0.02 + 0.1 * torch.rand(n, 1, generator=g)                  # cycles per sample
    timbre = torch.rand(n, 3, generator=g)                               # harmonic amplitudes
    n_ph = SR_LEN // PHONE + 1
    steps = 0.5 + 1.0 * torch.rand(n, n_ph, generator=g)                 # each phone's pitch ratio
    ratio = steps.repeat_interleave(PHONE, dim=1)[:, :SR_LEN]
    phase = 2 * math.pi * torch.cumsum(pitch * ratio, dim=1)
    x = sum(timbre[:, h:h + 1] * torch.sin((h + 1) * phase) for h in range(3))
    env = 0.6 + 0.4 * torch.rand(n, n_ph, generator=g).repeat_interleave(PHONE, dim=1)[:, :SR_LEN]
    x = x * env + 0.1 * torch.randn(n, SR_LEN, generator=g)
    return x / x.std(dim=1, keepdim=True)


def make_data(seed):
    g = torch.Generator().manual_seed(7400 + seed)
    x = make_utterances(N_TRAIN + N_VAL, g)
    return x[:N_TRAIN], x[N_TRAIN:]


def batches_for_epoch(x, epoch, seed):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [x[order[i:i + BS]] for i in range(0, len(x) - BS + 1, BS)]


# ----------------------------------------------------------------------------------------------- model
class CDCK2(nn.Module):
    def __init__(self, timestep=TIMESTEP, batch_size=BS, seq_len=SR_LEN):
        super().__init__()
        self.batch_size, self.seq_len, self.timestep = batch_size, seq_len, timestep
        self.encoder = nn.Sequential(                                    # downsampling factor = 40
            nn.Conv1d(1, CH, kernel_size=10, stride=5, padding=3, bias=False), nn.BatchNorm1d(CH), nn.ReLU(True),
            nn.Conv1d(CH, CH, kernel_size=8, stride=4, padding=2, bias=False), nn.BatchNorm1d(CH), nn.ReLU(True),
            nn.Conv1d(CH, CH, kernel_size=4, stride=2, padding=1, bias=False), nn.BatchNorm1d(CH), nn.ReLU(True))
        self.gru = nn.GRU(CH, HID, num_layers=1, bidirectional=False, batch_first=True)
        self.Wk = nn.ModuleList([nn.Linear(HID, CH) for _ in range(timestep)])
        self.lsoftmax = nn.LogSoftmax(dim=1)

        def _weights_init(m):
            if isinstance(m, (nn.Linear, nn.Conv1d)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm1d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

        for name, p in self.gru.named_parameters():
            if "weight" in name:
                nn.init.kaiming_normal_(p, mode="fan_out", nonlinearity="relu")
        self.apply(_weights_init)

    def init_hidden(self, batch_size):
        return torch.zeros(1, batch_size, HID)

    def forward(self, x, hidden, t_samples=None):
        batch = x.size(0)
        if t_samples is None:
            t_samples = int(torch.randint(FRAMES - self.timestep, size=(1,)))
        z = self.encoder(x).transpose(1, 2)                               # N x L x C
        encode_samples = torch.stack([z[:, t_samples + i, :] for i in range(1, self.timestep + 1)])
        output, hidden = self.gru(z[:, :t_samples + 1, :], hidden)
        c_t = output[:, t_samples, :]
        pred = torch.stack([self.Wk[i](c_t) for i in range(self.timestep)])
        nce, correct = 0.0, 0
        for i in range(self.timestep):
            total = torch.mm(encode_samples[i], pred[i].t())             # B x B
            correct += int(torch.sum(torch.eq(torch.argmax(total, dim=1), torch.arange(batch))))
            nce = nce + torch.sum(torch.diag(self.lsoftmax(total)))
        nce = nce / (-1.0 * batch * self.timestep)
        return correct / (batch * self.timestep), nce, hidden


def loss_fn(model, batch):
    _, nce, _ = model(batch.unsqueeze(1), model.init_hidden(len(batch)))
    return nce


# ----------------------------------------------------------------------------------------------- config
def transformer_lr(n_warmup_steps):
    def f(epoch):                      # LambdaLR passes the number of steps taken so far
        s = epoch + 1
        return D_MODEL ** -0.5 * min(s ** -0.5, s * n_warmup_steps ** -1.5)
    return f


def config(run, variant):
    warmup = 50 if (run == "healthy" or variant == "warmup_50") else 10000
    wd = 0.0 if variant == "no_weight_decay" else 1e-4
    return warmup, wd


def build(run, variant=None, seed=0):
    torch.manual_seed(seed)
    model = CDCK2()
    warmup, wd = config(run, variant)
    opt = torch.optim.Adam(filter(lambda p: p.requires_grad, model.parameters()), lr=1.0, betas=(0.9, 0.98),
                           eps=1e-9, weight_decay=wd, amsgrad=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, transformer_lr(warmup))
    return model, opt, sched


@torch.no_grad()
def validation(model, x, seed):
    model.eval()
    g = torch.Generator().manual_seed(99 + seed)
    accs, losses = [], []
    for i in range(0, len(x), BS):
        b = x[i:i + BS].unsqueeze(1)
        t = int(torch.randint(FRAMES - TIMESTEP, (1,), generator=g))
        acc, nce, _ = model(b, model.init_hidden(len(b)), t_samples=t)
        accs.append(acc)
        losses.append(float(nce))
    model.train()
    return sum(accs) / len(accs), sum(losses) / len(losses)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_x, val_x = make_data(seed)
    model, opt, sched = build(run, variant, seed)
    ckpt = Path(out_dir) / "cdc-model_best.pth"
    losses, val_losses, val_accs = [], [], []
    best_acc, saved_epoch = -1.0, None
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for data in batches_for_epoch(train_x, epoch, seed):
            data = data.unsqueeze(1)
            opt.zero_grad()
            hidden = model.init_hidden(len(data))
            acc, loss, hidden = model(data, hidden)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
        val_acc, val_loss = validation(model, val_x, seed)
        val_accs.append(val_acc)
        val_losses.append(val_loss)
        if val_acc > best_acc and epoch <= 3:            # the owner triages the snapshot written by epoch 3
            best_acc = val_acc
            saved_epoch = epoch
            torch.save({"epoch": epoch + 1, "validation_acc": val_acc, "state_dict": model.state_dict(),
                        "validation_loss": val_loss, "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict()}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_acc": val_accs[-1], "val_loss": val_losses[-1], "saved_epoch": saved_epoch,
                            "chance_loss": math.log(BS), "lr_final": opt.param_groups[0]["lr"]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["val_loss"] > 0.75 * m["chance_loss"]:
        return (f"validation NCE loss {m['val_loss']:.3f} after {len(trained.train_losses)} steps against "
                f"log(batch) = {m['chance_loss']:.3f} at chance; future-frame accuracy {m['val_acc']:.3f} "
                f"(chance {1 / BS:.3f}); train loss {trained.train_losses[0]:.3f} -> {trained.train_losses[-1]:.3f}")
    return None


def _setup(run):
    import triage

    train_x, val_x = make_data(0)
    model, opt, sched = build(run, None, 0)
    return triage.Setup(model=model, optimizer=opt, scheduler=sched, loss_fn=loss_fn,
                        batches=batches_for_epoch(train_x, 1, 0),
                        val_batches=[val_x[i:i + BS] for i in range(0, len(val_x), BS)],
                        total_steps=EPOCHS * STEPS_PER_EPOCH)


def setup_healthy():
    return _setup("healthy")


def setup_warmup_far_too_long():
    return _setup("warmup_far_too_long")
