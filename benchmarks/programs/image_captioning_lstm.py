"""Image captioning with a CNN encoder and an attention LSTM decoder ("Show, Attend and Tell"), trained with
teacher forcing on captions made in code from each image's content.

Public original followed: sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning (train.py, models.py). What I read of
it (train.py): the word map with <start>/<end>/<pad>; captions padded to a fixed length with `caplens` of shape
(N, 1) counting <start> and <end>; `DecoderWithAttention.forward` sorts the batch by caption length, descending
(`caption_lengths.squeeze(1).sort(dim=0, descending=True)`), reorders the encoder output AND the captions with
`sort_ind`, decodes `decode_lengths = caplens - 1` steps with an `LSTMCell`, shrinking the batch to
`batch_size_t = sum(l > t)` at each step, with a soft attention over the encoder's pixels gated by
`sigmoid(f_beta(h))`, `init_h`/`init_c` from the mean encoder output and dropout before `fc`; the training loss
is cross-entropy on `pack_padded_sequence(scores, decode_lengths)` against `caps_sorted[:, 1:]` packed the same
way (the pads never scored), plus `alpha_c * ((1 - alphas.sum(1)) ** 2).mean()`, the "doubly stochastic
attention" regulariser; gradients are clamped elementwise at +-5 (`clip_gradient`, a value clip, not a norm
clip); the encoder is fine-tuned with a learning rate of its own (`encoder_lr` beside `decoder_lr`, Adam). Here
the two sets of weights are one Adam with two param groups (encoder 1e-3, decoder 3e-3: our encoder is a small
CNN trained from scratch, not a pretrained ResNet, so it needs more than the original's 1e-4), and the
checkpoint holds state dicts (the original pickles whole modules) with its `epoch` and a `step`.

Data: 3x16x16 images, each a dark or light background with one red/green/blue square/cross/bar, small or big,
at a random place, with noise. Its caption is generated from its content:
"<start> a [big] <colour> <shape> on a <dark|light> background <end>" (9 or 10 tokens, padded to 10).

Runs
- healthy: the tutorial's loop as written. The decoder learns the content words (colour, shape, background,
  size) from the image: teacher-forced accuracy on them reaches 0.85-0.9 within the run (symptom if under 0.75). Checkpoint
  mid-run (step 240 of 400), while the validation loss is still falling (0.15-0.2 there, 0.09-0.13 at the end).
- misaligned_sort (cause `label_bug`): the owner wrote their own decoder from the tutorial and sorted the
  captions and lengths by length for pack_padded_sequence, but not the image features (the line
  `encoder_out = encoder_out[sort_ind]` is missing). Each caption is then decoded from another image of the
  batch: the model can learn only what every caption shares ("a ... on a ... background") and the words'
  marginal frequencies, and the content words stay near chance (0.43 against 0.33 / 0.5), while the
  training loss still falls, from the grammar, which hides it. Real users meet exactly this: reordering one
  tensor of a pair for `pack_padded_sequence` and not the other (fartashf/vsepp PR #36: "I was sorting but then
  not getting the sort back ... embeddings in a batch seemed to be mixed up"; tohinz/semantic-object-accuracy
  issue #14: the batch sorted by caption length "but shouldn't you change the bbox order as well then?").
  The captions are the targets the loss reads, and they are unrelated to the inputs they are paired with:
  `label_bug`, whose decisive experiment is "labels unrelated to the inputs". The fix (`reorder_images`) puts
  the missing line back. Competing fixes a user tries first: a lower learning rate (`lr_x0.1`), and freezing
  the encoder in case fine-tuning it wrecks the image features (`freeze_encoder`); both leave the content words
  at chance. Checkpoint at the end of the run (step 400), once the symptom shows (symptom: content accuracy under 0.6).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from _program import Program, Run, Trained

PROGRAM = Program(
    name="image_captioning_lstm",
    kind="image captioning (CNN encoder + attention LSTM decoder)",
    original="sgrvinod/a-PyTorch-Tutorial-to-Image-Captioning: train.py, models.py",
    runs={
        "healthy": Run(cause="healthy", story=(
            "Show-Attend-Tell captioner on shapes: content-word accuracy climbs to ~0.87, val loss still "
            "falling at the mid-run checkpoint.")),
        "misaligned_sort": Run(cause="label_bug", story=(
            "My decoder sorts captions and lengths by length for pack_padded_sequence but I never reordered the "
            "image features with sort_ind: every caption is trained against another image of the batch. The "
            "loss fell a bit, but the captions never name the right colour or shape."),
            fix="reorder_images", competing=("lr_x0.1", "freeze_encoder")),
    },
)

WORDS = ["<pad>", "<start>", "<end>", "<unk>", "a", "big", "red", "green", "blue", "square", "cross", "bar",
         "on", "dark", "light", "background"]
WORD_MAP = {w: i for i, w in enumerate(WORDS)}
COLOURS = ["red", "green", "blue"]
SHAPES = ["square", "cross", "bar"]
CONTENT = {WORD_MAP[w] for w in ["big", "red", "green", "blue", "square", "cross", "bar", "dark", "light"]}
MAX_LEN = 10
BATCH = 32
ENC_LR, DEC_LR = 1e-3, 3e-3
GRAD_CLIP = 5.0           # clip_gradient: each gradient clamped at +-5
ALPHA_C = 1.0
STEPS = 400
HEALTHY_CKPT = 240


# ----------------------------------------------------------------------------------------------- data
def make_split(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    imgs = torch.zeros(n, 3, 16, 16)
    caps = torch.zeros(n, MAX_LEN, dtype=torch.long)
    caplens = torch.zeros(n, 1, dtype=torch.long)
    rgb = {"red": (1.0, 0.1, 0.1), "green": (0.1, 0.9, 0.1), "blue": (0.15, 0.2, 1.0)}
    for i in range(n):
        colour = COLOURS[int(torch.randint(3, (1,), generator=g))]
        shape = SHAPES[int(torch.randint(3, (1,), generator=g))]
        big = bool(torch.rand(1, generator=g) < 0.5)
        light = bool(torch.rand(1, generator=g) < 0.5)
        img = torch.full((3, 16, 16), 0.7 if light else 0.05)
        s = 8 if big else 4
        y0 = int(torch.randint(0, 16 - s + 1, (1,), generator=g))
        x0 = int(torch.randint(0, 16 - s + 1, (1,), generator=g))
        mask = torch.zeros(16, 16, dtype=torch.bool)
        if shape == "square":
            mask[y0:y0 + s, x0:x0 + s] = True
        elif shape == "cross":
            mask[y0 + s // 2 - 1:y0 + s // 2 + 1, x0:x0 + s] = True
            mask[y0:y0 + s, x0 + s // 2 - 1:x0 + s // 2 + 1] = True
        else:  # a bar: wide and flat
            mask[y0 + s // 2 - 1:y0 + s // 2 + 1, x0:x0 + s] = True
            if s == 4:
                mask[y0 + 1:y0 + 3, max(0, x0 - 2):min(16, x0 + s + 2)] = True
        for ch in range(3):
            img[ch][mask] = rgb[colour][ch]
        img = img + 0.08 * torch.randn(3, 16, 16, generator=g)
        words = ["<start>", "a"] + (["big"] if big else []) + [colour, shape, "on", "a",
                                                                "light" if light else "dark", "background", "<end>"]
        ids = [WORD_MAP[w] for w in words]
        caps[i, :len(ids)] = torch.tensor(ids)
        caplens[i, 0] = len(ids)
        imgs[i] = img
    imgs = (imgs - 0.4) / 0.35  # transforms.Normalize, as the original's loader does
    return imgs, caps, caplens


def batches_of(imgs, caps, caplens, order):
    return [(imgs[order[i:i + BATCH]], caps[order[i:i + BATCH]], caplens[order[i:i + BATCH]])
            for i in range(0, len(order) - BATCH + 1, BATCH)]


def data(seed: int):
    train = make_split(1536, 1000 + seed)   # 48 batches an epoch
    val = make_split(256, 2000 + seed)
    return train, val


# ----------------------------------------------------------------------------------------------- model
class Encoder(nn.Module):
    def __init__(self, enc_dim=32):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(24, enc_dim, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))

    def forward(self, images):
        out = self.cnn(images)                   # (N, enc_dim, 4, 4)
        return out.permute(0, 2, 3, 1)           # (N, 4, 4, enc_dim), as the original's encoder returns


class Attention(nn.Module):
    def __init__(self, enc_dim, dec_dim, att_dim):
        super().__init__()
        self.encoder_att = nn.Linear(enc_dim, att_dim)
        self.decoder_att = nn.Linear(dec_dim, att_dim)
        self.full_att = nn.Linear(att_dim, 1)

    def forward(self, encoder_out, decoder_hidden):
        att = self.full_att(torch.relu(self.encoder_att(encoder_out) + self.decoder_att(decoder_hidden).unsqueeze(1)))
        alpha = torch.softmax(att.squeeze(2), dim=1)
        return (encoder_out * alpha.unsqueeze(2)).sum(dim=1), alpha


class DecoderWithAttention(nn.Module):
    def __init__(self, vocab_size, enc_dim=32, dec_dim=64, emb_dim=32, att_dim=32, dropout=0.2,
                 reorder_images=True):
        super().__init__()
        self.enc_dim, self.vocab_size = enc_dim, vocab_size
        self.reorder_images = reorder_images
        self.attention = Attention(enc_dim, dec_dim, att_dim)
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.dropout = nn.Dropout(dropout)
        self.decode_step = nn.LSTMCell(emb_dim + enc_dim, dec_dim)
        self.init_h = nn.Linear(enc_dim, dec_dim)
        self.init_c = nn.Linear(enc_dim, dec_dim)
        self.f_beta = nn.Linear(dec_dim, enc_dim)
        self.fc = nn.Linear(dec_dim, vocab_size)

    def forward(self, encoder_out, encoded_captions, caption_lengths):
        n = encoder_out.size(0)
        encoder_out = encoder_out.reshape(n, -1, self.enc_dim)
        caption_lengths, sort_ind = caption_lengths.squeeze(1).sort(dim=0, descending=True)
        if self.reorder_images:
            encoder_out = encoder_out[sort_ind]
        encoded_captions = encoded_captions[sort_ind]
        embeddings = self.embedding(encoded_captions)
        mean_enc = encoder_out.mean(dim=1)
        h, c = self.init_h(mean_enc), self.init_c(mean_enc)
        decode_lengths = (caption_lengths - 1).tolist()
        steps = max(decode_lengths)
        predictions = encoder_out.new_zeros(n, steps, self.vocab_size)
        alphas = encoder_out.new_zeros(n, steps, encoder_out.size(1))
        for t in range(steps):
            bt = sum(int(l > t) for l in decode_lengths)
            awe, alpha = self.attention(encoder_out[:bt], h[:bt])
            awe = torch.sigmoid(self.f_beta(h[:bt])) * awe
            h, c = self.decode_step(torch.cat([embeddings[:bt, t, :], awe], dim=1), (h[:bt], c[:bt]))
            predictions[:bt, t, :] = self.fc(self.dropout(h))
            alphas[:bt, t, :] = alpha
        return predictions, encoded_captions, decode_lengths, alphas, sort_ind


class Captioner(nn.Module):
    def __init__(self, reorder_images=True):
        super().__init__()
        self.encoder = Encoder()
        self.decoder = DecoderWithAttention(len(WORDS), reorder_images=reorder_images)

    def forward(self, imgs, caps, caplens):
        return self.decoder(self.encoder(imgs), caps, caplens)


def build(run: str, variant: str | None = None):
    reorder = run == "healthy" or variant == "reorder_images"
    model = Captioner(reorder_images=reorder)
    factor = 0.1 if variant == "lr_x0.1" else 1.0
    fine_tune_encoder = variant != "freeze_encoder"
    for p in model.encoder.parameters():
        p.requires_grad = fine_tune_encoder
    groups = [{"params": [p for p in model.decoder.parameters()], "lr": DEC_LR * factor}]
    if fine_tune_encoder:
        groups.append({"params": [p for p in model.encoder.parameters()], "lr": ENC_LR * factor})
    opt = torch.optim.Adam(groups)
    return model, opt


def loss_terms(model, batch):
    imgs, caps, caplens = batch
    scores, caps_sorted, decode_lengths, alphas, _ = model(imgs, caps, caplens)
    targets = caps_sorted[:, 1:]
    scores = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
    targets = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
    xent = F.cross_entropy(scores, targets)
    att = ALPHA_C * ((1.0 - alphas.sum(dim=1)) ** 2).mean()
    return {"xent": xent, "att_reg": att}


def train_step(model, optimizer, batch):
    """One iteration of the tutorial's train(): zero_grad, backward, clamp each gradient at +-5, step."""
    terms = loss_terms(model, batch)
    loss = terms["xent"] + terms["att_reg"]
    optimizer.zero_grad()
    loss.backward()
    for group in optimizer.param_groups:          # utils.clip_gradient
        for p in group["params"]:
            if p.grad is not None:
                p.grad.data.clamp_(-GRAD_CLIP, GRAD_CLIP)
    optimizer.step()
    return loss


@torch.no_grad()
def evaluate(model, val):
    imgs, caps, caplens = val
    model.eval()
    scores, caps_sorted, decode_lengths, _, _ = model(imgs, caps, caplens)
    model.train()
    targets = caps_sorted[:, 1:]
    s = pack_padded_sequence(scores, decode_lengths, batch_first=True).data
    t = pack_padded_sequence(targets, decode_lengths, batch_first=True).data
    loss = F.cross_entropy(s, t).item()
    content = torch.tensor([int(x) in CONTENT for x in t])
    acc = (s.argmax(1)[content] == t[content]).float().mean().item()
    return loss, acc


def epoch_order(epoch: int, seed: int, n: int):
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    (ti, tc, tl), val = data(seed)
    model, opt = build(run, variant)
    ckpt_step = HEALTHY_CKPT if run == "healthy" else STEPS
    losses, val_losses, accs = [], [], []
    step, epoch = 0, 0
    ckpt = Path(out_dir) / "checkpoint_captioner.pth.tar"
    saved = None
    while step < STEPS:
        for batch in batches_of(ti, tc, tl, epoch_order(epoch, seed, len(ti))):
            losses.append(train_step(model, opt, batch).item())
            step += 1
            if step % 30 == 0 or step == ckpt_step:
                vl, acc = evaluate(model, val)
                val_losses.append(vl)
                accs.append(acc)
            if step == ckpt_step:
                vl, acc = evaluate(model, val)
                torch.save({"epoch": epoch, "step": step, "model_state_dict": model.state_dict(),
                            "optimizer_state_dict": opt.state_dict(), "val_content_acc": acc}, ckpt)
                saved = {"val_loss_at_ckpt": vl, "acc_at_ckpt": acc}
            if step >= STEPS:
                break
        epoch += 1
    vl, acc = evaluate(model, val)
    metrics = {"final_content_acc": acc, "final_val_loss": vl, "first_train_loss": sum(losses[:10]) / 10,
               "last_train_loss": sum(losses[-20:]) / 20, **saved}
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses, metrics=metrics)


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if run == "healthy":
        if m["final_content_acc"] < 0.75 or m["last_train_loss"] > 0.6 * m["first_train_loss"]:
            return (f"content-word accuracy only {m['final_content_acc']:.2f}, train loss "
                    f"{m['first_train_loss']:.2f} -> {m['last_train_loss']:.2f}")
        return None
    if m["final_content_acc"] < 0.6:
        return (f"train loss {m['first_train_loss']:.2f} -> {m['last_train_loss']:.2f} but the captions' content "
                f"words (colour, shape, size, background) are right {m['final_content_acc']:.2f} of the time on "
                f"validation (chance 0.33-0.5), val loss {m['final_val_loss']:.2f}")
    return None


# ----------------------------------------------------------------------------------------------- triage entries
def _setup(run: str):
    import triage

    torch.manual_seed(0)
    (ti, tc, tl), (vi, vc, vl) = data(0)
    model, opt = build(run)
    ckpt_step = HEALTHY_CKPT if run == "healthy" else STEPS
    per_epoch = len(ti) // BATCH
    epoch = ckpt_step // per_epoch
    # the batches the run takes after its checkpoint: the rest of this epoch, then the next one
    after = batches_of(ti, tc, tl, epoch_order(epoch, 0, len(ti)))[ckpt_step % per_epoch:]
    after += batches_of(ti, tc, tl, epoch_order(epoch + 1, 0, len(ti)))
    val_batches = [(vi[i:i + BATCH], vc[i:i + BATCH], vl[i:i + BATCH]) for i in range(0, len(vi), BATCH)]
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_terms, auxiliary_terms=("att_reg",),
                        batches=after[:48], val_batches=val_batches, train_step=train_step,
                        total_steps=STEPS, steps_per_epoch=per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_misaligned_sort():
    return _setup("misaligned_sort")


if __name__ == "__main__":
    import sys
    torch.set_num_threads(1)
    import time
    for run in sys.argv[1:] or ["healthy", "misaligned_sort"]:
        t = time.perf_counter()
        tr = train(run, Path("/tmp"), 0)
        print(run, round(time.perf_counter() - t, 1), "s", tr.metrics, symptom(run, tr))
