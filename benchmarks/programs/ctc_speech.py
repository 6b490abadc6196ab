"""CTC speech recogniser: log-mel-like features with lengths -> conv subsampling + BiLSTM encoder -> F.ctc_loss.

Follows the shape of ESPnet's ASR recipes (espnet2/asr/ctc.py and espnet2/asr/espnet_model.py: a batch is a dict of
`speech` (B, T, D) + `speech_lengths`, `text` (B, L) padded with ignore_id -1 + `text_lengths`; the encoder
subsamples time (here one stride-2 Conv1d, ESPnet's Conv2dSubsampling is x4) and returns its output lengths; the CTC
module takes `log_softmax(...).transpose(0, 1)`, flattens the targets as `ys_pad[ys_pad != -1]` and calls
`F.ctc_loss(..., reduction="sum")` divided by the batch size, with `zero_infinity` left at torch's default (False);
Adam and `clip_grad_norm_(grad_clip=5)` as in the recipes' trainer) and torchaudio's CTC tutorials. torchaudio
and real speech are unavailable, so utterances are synthesised: each of 10 "phones" has its own spectral template
over 20 mel-like bins, held for 3-6 frames with noise, 3-7 phones an utterance, features padded to the batch's
longest utterance. Batches are shuffled every epoch; a checkpoint is saved every 5 steps.

Runs
- healthy: a clean corpus; checkpoint at step 60 of 120 while the CTC loss still falls.
- impossible_alignment: the corpus holds one mis-segmented utterance: the full sentence's transcript (14 phones)
  attached to a clip cut to 10 frames (5 encoder frames after subsampling). CTC cannot align 14 labels to 5
  frames: its loss is +inf, and (zero_infinity=False) the gradient is NaN, so the weights are NaN after the step
  that sees it and the loss is NaN from then on. A very common ASR/OCR failure (pytorch/pytorch#14401 "ctc loss
  get nan after some epochs"; ypwhs/captcha_break#29: "loss nan because target_length too long, input_length too
  short"; wenet-e2e/wenet#2299 sets zero_infinity=True "to save a lot of time in data cleaning"). Root cause:
  bad_batch (one batch, through one example, produces the non-finite loss; the fix is removing that example /
  skipping what it poisons). Competing fixes a user tries first: a 10x lower LR and a tighter clip (1.0): neither
  touches an infinite loss. The checkpoint is the last one saved before the NaN; the snapshot is the batches the
  run took after it, in order (the bad one among them).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="ctc_speech",
    kind="speech",
    original="espnet/espnet: espnet2/asr/ctc.py + espnet2/asr/espnet_model.py (CTC branch); torchaudio CTC tutorials",
    runs={
        "healthy": Run(cause="healthy", story="Conv + BiLSTM CTC model on synthetic utterances; checkpoint at "
                                              "step 60 of 120 while the loss still falls."),
        "impossible_alignment": Run(
            cause="bad_batch",
            story="Training went to NaN in the first epoch and stayed there; one utterance in the corpus has a "
                  "transcript far longer than its audio.",
            fix="drop_bad_utterance",
            competing=("lr_x0.1", "clip_1.0"),
        ),
    },
)

N_PHONES = 10          # token ids 1..10, 0 is the CTC blank
N_MELS = 20
N_UTT = 320
BATCH = 16
MAX_STEPS = 120
SAVE_EVERY = 5
GRAD_CLIP = 5.0


def make_corpus(seed: int, with_bad: bool):
    g = torch.Generator().manual_seed(4000 + seed)
    templates = torch.randn(N_PHONES + 1, N_MELS, generator=torch.Generator().manual_seed(11)) * 1.5
    utts = []
    for _ in range(N_UTT):
        n = int(torch.randint(3, 8, (1,), generator=g))
        text = torch.randint(1, N_PHONES + 1, (n,), generator=g)
        frames = []
        for p in text.tolist():
            d = int(torch.randint(3, 7, (1,), generator=g))
            frames.append(templates[p].expand(d, N_MELS) + 0.8 * torch.randn(d, N_MELS, generator=g))
        frames.append(templates[0].expand(2, N_MELS) + 0.8 * torch.randn(2, N_MELS, generator=g))  # silence
        utts.append((torch.cat(frames), text))
    if with_bad:
        # a mis-segmented utterance: a 14-phone transcript on a 10-frame clip
        text = torch.randint(1, N_PHONES + 1, (14,), generator=g)
        feats = templates[text[:5]].repeat_interleave(2, 0) + 0.8 * torch.randn(10, N_MELS, generator=g)
        pos = int(torch.randint(0, N_UTT, (1,), generator=g))
        utts.insert(pos, (feats, text))
    return utts


def collate(utts, idx):
    feats = [utts[i][0] for i in idx]
    texts = [utts[i][1] for i in idx]
    T = max(len(f) for f in feats)
    L = max(len(t) for t in texts)
    speech = torch.zeros(len(idx), T, N_MELS)
    text = torch.full((len(idx), L), -1, dtype=torch.long)
    for j, (f, t) in enumerate(zip(feats, texts)):
        speech[j, : len(f)] = f
        text[j, : len(t)] = t
    return {"speech": speech, "speech_lengths": torch.tensor([len(f) for f in feats]),
            "text": text, "text_lengths": torch.tensor([len(t) for t in texts]),
            "utt_index": torch.tensor(idx)}


def batch_stream(utts, seed, n_steps):
    out, epoch = [], 0
    while len(out) < n_steps:
        epoch += 1
        perm = torch.randperm(len(utts), generator=torch.Generator().manual_seed(seed * 100 + epoch)).tolist()
        out += [collate(utts, perm[i:i + BATCH]) for i in range(0, len(perm) - BATCH + 1, BATCH)]
    return out[:n_steps]


class Encoder(nn.Module):
    def __init__(self, idim=N_MELS, hidden=64):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(idim, hidden, 3, stride=2, padding=1), nn.ReLU())
        self.blstm = nn.LSTM(hidden, hidden // 2, batch_first=True, bidirectional=True)

    def forward(self, xs, ilens):
        h = self.conv(xs.transpose(1, 2)).transpose(1, 2)
        olens = (ilens - 1) // 2 + 1
        packed = nn.utils.rnn.pack_padded_sequence(h, olens.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.blstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        return out, olens


class CTCModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.ctc_lo = nn.Linear(64, N_PHONES + 1)

    def forward(self, speech, speech_lengths):
        hs, hlens = self.encoder(speech, speech_lengths)
        return self.ctc_lo(hs), hlens


def ctc_loss(model, batch):
    logits, hlens = model(batch["speech"], batch["speech_lengths"])
    log_probs = logits.log_softmax(2).transpose(0, 1)
    ys_pad, ys_lens = batch["text"], batch["text_lengths"]
    ys_true = ys_pad[ys_pad != -1]
    loss = F.ctc_loss(log_probs, ys_true, hlens, ys_lens, blank=0, reduction="sum")
    return loss / logits.size(0)


def _build(seed, variant):
    torch.manual_seed(seed)
    model = CTCModel()
    lr = 2e-3 * (0.1 if variant == "lr_x0.1" else 1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return model, optimizer


def _corpus(run, seed, variant):
    return make_corpus(seed, with_bad=(run == "impossible_alignment" and variant != "drop_bad_utterance"))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    model, optimizer = _build(seed, variant)
    stream = batch_stream(_corpus(run, seed, variant), seed, MAX_STEPS)
    clip = 1.0 if variant == "clip_1.0" else GRAD_CLIP
    ckpt = out_dir / "checkpoint.pth"
    losses, nan_step = [], None
    for step, batch in enumerate(stream):
        if step % SAVE_EVERY == 0 and nan_step is None and (run != "healthy" or step <= 60):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "iteration": step}, ckpt)
        model.train()
        optimizer.zero_grad()
        loss = ctc_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        losses.append(loss.item())
        if nan_step is None and not torch.isfinite(loss):
            nan_step = step
        if nan_step is not None and step - nan_step >= 10:
            break
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"nonfinite_step": -1 if nan_step is None else nan_step, "steps": len(losses)})


def symptom(run: str, trained: Trained) -> str | None:
    losses = trained.train_losses
    k = int(trained.metrics["nonfinite_step"])
    if k >= 0:
        after = losses[k + 1] if k + 1 < len(losses) else float("nan")
        return f"CTC loss {losses[k]} at step {k}, {after} at step {k + 1} and after (step 0: {losses[0]:.1f})"
    if run == "healthy":
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        if last > 0.4 * first:
            return f"healthy run failed to train: CTC loss {first:.1f} -> {last:.1f}"
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    model, optimizer = _build(0, None)
    utts = _corpus(run, 0, None)
    stream = batch_stream(utts, 0, MAX_STEPS)
    if run == "healthy":
        start = 60
    else:
        bad = next(i for i, b in enumerate(stream) if bool((b["text_lengths"] > (b["speech_lengths"] - 1) // 2 + 1).any()))
        start = bad // SAVE_EVERY * SAVE_EVERY
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=ctc_loss, batches=stream[start:start + 48],
                        grad_clip=GRAD_CLIP, total_steps=MAX_STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_impossible_alignment():
    return _setup("impossible_alignment")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                ck = torch.load(tr.checkpoint)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, "ckpt", ck["iteration"], symptom(r, tr),
                      [round(x, 2) for x in tr.train_losses[::10]])
