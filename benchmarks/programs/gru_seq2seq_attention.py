"""GRU encoder + Bahdanau-attention GRU decoder for a toy "translation" task, with teacher forcing.

Follows the PyTorch tutorial "NLP From Scratch: Translation with a Sequence to Sequence Network and Attention"
(pytorch/tutorials, intermediate_source/seq2seq_translation_tutorial.py): `EncoderRNN` (Embedding -> dropout ->
GRU), `BahdanauAttention` (Wa, Ua, Va), `AttnDecoderRNN` that decodes MAX_LENGTH steps from SOS, feeding the
target token at each step when a target is given (teacher forcing), and returns `F.log_softmax` of its outputs;
`train_epoch` zeroes and steps two separate `optim.Adam(lr=0.001)` optimizers (encoder and decoder) around one
`nn.NLLLoss` over `decoder_outputs.view(-1, V)` against the zero-padded target ids (padding included, as in the
tutorial). The French-English pairs are replaced by a synthetic language built in code: the "translation" of a
source sentence is its token sequence through a fixed word mapping (word-by-word), each sentence ending in EOS and
padded with zeros to MAX_LENGTH, like the tutorial's `get_dataloader` arrays.

Runs
- healthy: the tutorial's loop; checkpoint at epoch 4 of 10 while the loss still falls.
- softmax_with_nll: the user "tidied" the decoder to return `F.softmax(decoder_outputs, dim=-1)` (to read
  probabilities for greedy decoding and plotting) and kept the tutorial's `nn.NLLLoss`. NLLLoss expects
  log-probabilities; on probabilities it computes -p(target), so the logged loss goes negative (towards -1) and the
  gradient vanishes on confidently wrong tokens. A well known confusion (NLLLoss "expects log-probabilities ...
  Obtaining log-probabilities in a neural network is easily achieved by adding a LogSoftmax layer", PyTorch and
  mirrored docs; many "NLLLoss is negative" forum threads). Root cause: wrong_loss (the fix is the loss/output
  pairing: log_softmax back, or CrossEntropy on logits). Competing fix a user tries first: a 10x lower LR (the
  loss is still negative, it only gets there slower). The checkpoint is the epoch-3 one, once the loss is
  negative.
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
    name="gru_seq2seq_attention",
    kind="seq2seq",
    original="pytorch/tutorials: intermediate_source/seq2seq_translation_tutorial.py",
    runs={
        "healthy": Run(cause="healthy", story="The tutorial's GRU + attention seq2seq on a synthetic language; "
                                              "checkpoint at epoch 4 of 10 while the loss still falls."),
        "softmax_with_nll": Run(
            cause="wrong_loss",
            story="I made the decoder return softmax probabilities and kept NLLLoss; the training loss went "
                  "negative and the translations are poor.",
            fix="log_softmax",
            competing=("lr_x0.1",),
        ),
    },
)

SOS, EOS = 0, 1
VOCAB = 12
MAX_LENGTH = 8
HIDDEN = 48
N_PAIRS = 1024
BATCH = 32
EPOCHS = 10


def make_pairs(seed: int):
    g = torch.Generator().manual_seed(2000 + seed)
    mapping = torch.randperm(VOCAB - 2, generator=torch.Generator().manual_seed(7)) + 2
    src = torch.zeros(N_PAIRS, MAX_LENGTH, dtype=torch.long)
    tgt = torch.zeros(N_PAIRS, MAX_LENGTH, dtype=torch.long)
    for i in range(N_PAIRS):
        n = int(torch.randint(3, MAX_LENGTH, (1,), generator=g))
        words = torch.randint(2, VOCAB, (n,), generator=g)
        src[i, :n] = words
        src[i, n] = EOS
        tgt[i, :n] = mapping[words - 2]
        tgt[i, n] = EOS
    return src, tgt


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size, dropout_p=0.1):
        super().__init__()
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input):
        embedded = self.dropout(self.embedding(input))
        output, hidden = self.gru(embedded)
        return output, hidden


class BahdanauAttention(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.Wa = nn.Linear(hidden_size, hidden_size)
        self.Ua = nn.Linear(hidden_size, hidden_size)
        self.Va = nn.Linear(hidden_size, 1)

    def forward(self, query, keys):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys)))
        scores = scores.squeeze(2).unsqueeze(1)
        weights = F.softmax(scores, dim=-1)
        context = torch.bmm(weights, keys)
        return context, weights


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, dropout_p=0.1, output_probs=False):
        super().__init__()
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attention = BahdanauAttention(hidden_size)
        self.gru = nn.GRU(2 * hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(hidden_size, output_size)
        self.dropout = nn.Dropout(dropout_p)
        self.output_probs = output_probs

    def forward(self, encoder_outputs, encoder_hidden, target_tensor=None):
        batch_size = encoder_outputs.size(0)
        decoder_input = torch.empty(batch_size, 1, dtype=torch.long).fill_(SOS)
        decoder_hidden = encoder_hidden
        decoder_outputs, attentions = [], []
        for i in range(MAX_LENGTH):
            decoder_output, decoder_hidden, attn_weights = self.forward_step(decoder_input, decoder_hidden,
                                                                             encoder_outputs)
            decoder_outputs.append(decoder_output)
            attentions.append(attn_weights)
            if target_tensor is not None:
                decoder_input = target_tensor[:, i].unsqueeze(1)  # teacher forcing
            else:
                _, topi = decoder_output.topk(1)
                decoder_input = topi.squeeze(-1).detach()
        decoder_outputs = torch.cat(decoder_outputs, dim=1)
        if self.output_probs:
            decoder_outputs = F.softmax(decoder_outputs, dim=-1)
        else:
            decoder_outputs = F.log_softmax(decoder_outputs, dim=-1)
        return decoder_outputs, decoder_hidden, torch.cat(attentions, dim=1)

    def forward_step(self, input, hidden, encoder_outputs):
        embedded = self.dropout(self.embedding(input))
        query = hidden.permute(1, 0, 2)
        context, attn_weights = self.attention(query, encoder_outputs)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return self.out(output), hidden, attn_weights


class Seq2Seq(nn.Module):
    """The two networks in one module, so one state_dict holds both (what triage loads)."""

    def __init__(self, output_probs=False):
        super().__init__()
        self.encoder = EncoderRNN(VOCAB, HIDDEN)
        self.decoder = AttnDecoderRNN(HIDDEN, VOCAB, output_probs=output_probs)

    def forward(self, input_tensor, target_tensor=None):
        encoder_outputs, encoder_hidden = self.encoder(input_tensor)
        decoder_outputs, _, _ = self.decoder(encoder_outputs, encoder_hidden, target_tensor)
        return decoder_outputs


criterion = nn.NLLLoss()


def _loss(model, batch):
    input_tensor, target_tensor = batch
    decoder_outputs = model(input_tensor, target_tensor)
    return criterion(decoder_outputs.view(-1, decoder_outputs.size(-1)), target_tensor.view(-1))


def _train_step(model, optimizers, batch):
    encoder_optimizer, decoder_optimizer = optimizers["encoder"], optimizers["decoder"]
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    loss = _loss(model, batch)
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss


def _build(run, seed, variant):
    torch.manual_seed(seed)
    model = Seq2Seq(output_probs=(run == "softmax_with_nll" and variant != "log_softmax"))
    lr = 0.001 * (0.1 if variant == "lr_x0.1" else 1.0)
    encoder_optimizer = torch.optim.Adam(model.encoder.parameters(), lr=lr)
    decoder_optimizer = torch.optim.Adam(model.decoder.parameters(), lr=lr)
    return model, {"encoder": encoder_optimizer, "decoder": decoder_optimizer}


def _batches(src, tgt, seed, epoch):
    g = torch.Generator().manual_seed(seed * 100 + epoch)
    perm = torch.randperm(len(src), generator=g)
    return [(src[perm[i:i + BATCH]], tgt[perm[i:i + BATCH]]) for i in range(0, len(src), BATCH)]


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    src, tgt = make_pairs(seed)
    n_val = 128
    model, optimizers = _build(run, seed, variant)
    ckpt_epoch = 4 if run == "healthy" else 3
    ckpt = out_dir / "seq2seq.pt"
    losses, val_nll, step = [], [], 0
    for epoch in range(1, EPOCHS + 1):
        model.train()
        for batch in _batches(src[n_val:], tgt[n_val:], seed, epoch):
            losses.append(_train_step(model, optimizers, batch).item())
            step += 1
        model.eval()
        with torch.no_grad():
            out = model(src[:n_val], tgt[:n_val])
            logp = out.clamp_min(1e-12).log() if model.decoder.output_probs else out
            val_nll.append(float(F.nll_loss(logp.view(-1, VOCAB), tgt[:n_val].view(-1))))
        if epoch == ckpt_epoch:
            torch.save({"epoch": epoch, "step": step, "model_state_dict": model.state_dict(),
                        "optimizer_state_dict": {k: o.state_dict() for k, o in optimizers.items()}}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_nll,
                   metrics={"val_nll": val_nll[-1], "steps": step})


def symptom(run: str, trained: Trained) -> str | None:
    n = len(trained.train_losses) // EPOCHS
    tail = sum(trained.train_losses[-n:]) / n
    first = sum(trained.train_losses[:n]) / n
    if run == "healthy":
        if tail > 0.6 * first or tail < 0:
            return f"healthy run failed to train: loss {first:.2f} -> {tail:.2f}"
        return None
    if tail < 0:
        return (f"training NLL is negative: {first:.2f} in epoch 1 -> {tail:.2f} in the last epoch "
                f"(held-out NLL of the outputs {trained.metrics['val_nll']:.2f})")
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    src, tgt = make_pairs(0)
    model, optimizers = _build(run, 0, None)
    batches = (_batches(src[128:], tgt[128:], 0, 4) + _batches(src[128:], tgt[128:], 0, 5))
    val = [(src[i:i + BATCH], tgt[i:i + BATCH]) for i in range(0, 128, BATCH)]
    return triage.Setup(model=model, optimizers=optimizers, loss_fn=_loss, batches=batches, val_batches=val,
                        train_step=_train_step, total_steps=EPOCHS * len(batches) // 2)


def setup_healthy():
    return _setup("healthy")


def setup_softmax_with_nll():
    return _setup("softmax_with_nll")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                n = len(tr.train_losses) // EPOCHS
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 2) for x in tr.train_losses[::n]], [round(x, 2) for x in tr.val_losses])
