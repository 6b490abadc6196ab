"""A word-level LSTM language model trained the way PyTorch's word_language_model example trains it.

Follows pytorch/examples `word_language_model/main.py` + `model.py` (read through the public source):
`RNNModel` (Embedding -> dropout -> LSTM -> dropout -> Linear decoder, encoder/decoder weights uniform in
+-0.1, `forward` returning `log_softmax` and the hidden state), `batchify` into a (n_steps, batch) column
layout, `get_batch(source, i)` cutting `bptt` rows and the targets one row later flattened, `NLLLoss`, the
hidden state carried across batches and detached by `repackage_hidden`, `clip_grad_norm_(args.clip)`, and
**no optimizer object**: every parameter is updated by hand with `p.data.add_(p.grad, alpha=-lr)`. After
each epoch the validation loss decides: saved when it is the best so far, else `lr /= 4.0`. The example
saves the whole model (`torch.save(model, f)`); this owner saves `{"model": state_dict, "epoch", "lr",
"best_val_loss"}` instead, as triage's README asks for a checkpoint that loads without pickled classes.
The corpus is made in code: a sparse first-order Markov chain over 60 word ids (each word has a few likely
successors), 20k train tokens and 3k validation tokens.

Runs
- healthy: the example's defaults in miniature (lr 20, clip 0.25). Checkpoint after epoch 2 of 3, val
  loss still falling.
- lr_too_low: the user moved the example to `--lr 0.001`, the number they use with Adam every day; with a
  plain SGD update and a clip at 0.25 each step moves a parameter by at most 2.5e-4, so after three epochs
  the loss is still at the level of a uniform guess (the example's own default is lr=20, a value users find
  surprising: see pytorch/examples issues on "why is the learning rate 20"). Root cause `lr_too_low`
  (a higher LR is the experiment that removes the plateau). Fix `lr_default`: lr 20. Competing `no_clip`:
  the clip at 0.25 is the other thing that looks like it strangles the update; without it the update is
  still lr x grad, ~1e-3, and the loss does not move.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="word_language_model",
    kind="lm",
    original="pytorch/examples word_language_model/main.py + model.py",
    runs={
        "healthy": Run(cause="healthy", story="LSTM LM at the example's lr 20 / clip 0.25; checkpoint after epoch 2 of 3."),
        "lr_too_low": Run(
            cause="lr_too_low",
            story="Ran the word LM with --lr 0.001 like my Adam runs; three epochs and the loss has not left ln(V).",
            fix="lr_default",
            competing=("no_clip",),
        ),
    },
)

NTOKENS = 60


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.2, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


# ----------------------------------------------------------------------------- data (a toy corpus)


def make_corpus(seed: int):
    g = torch.Generator().manual_seed(4242)          # the language is fixed; the text drawn from it varies
    succ = torch.randint(0, NTOKENS, (NTOKENS, 3), generator=g)
    probs = torch.tensor([0.6, 0.25, 0.15])
    gs = torch.Generator().manual_seed(seed)

    def draw(n):
        out = torch.empty(n, dtype=torch.long)
        w = int(torch.randint(0, NTOKENS, (1,), generator=gs))
        for i in range(n):
            out[i] = w
            if float(torch.rand(1, generator=gs)) < 0.1:
                w = int(torch.randint(0, NTOKENS, (1,), generator=gs))
            else:
                w = int(succ[w, int(torch.multinomial(probs, 1, generator=gs))])
        return out

    return draw(20000), draw(3000)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


def args_for(run: str, variant: str | None) -> dict:
    args = dict(model="LSTM", emsize=32, nhid=64, nlayers=1, lr=20.0, clip=0.25, epochs=3, batch_size=20,
                bptt=20, dropout=0.1, tied=False, ckpt_epoch=2)
    if run == "lr_too_low":
        args.update(lr=0.001, ckpt_epoch=3)
        if variant == "lr_default":
            args["lr"] = 20.0
        elif variant == "no_clip":
            args["clip"] = None
    return args


def build(args):
    return RNNModel(args["model"], NTOKENS, args["emsize"], args["nhid"], args["nlayers"], args["dropout"], args["tied"])


# ----------------------------------------------------------------------------- main.py's loop


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    args = args_for(run, variant)
    torch.manual_seed(seed)
    train_tok, val_tok = make_corpus(seed)
    train_data = batchify(train_tok, args["batch_size"])
    val_data = batchify(val_tok, 10)
    model = build(args)
    criterion = nn.NLLLoss()
    bptt = args["bptt"]

    def evaluate(data_source):
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(10)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, bptt):
                data, targets = get_batch(data_source, i, bptt)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "model.pt"
    lr = args["lr"]
    best_val_loss = None
    train_losses, val_losses = [], []
    for epoch in range(1, args["epochs"] + 1):
        model.train()
        hidden = model.init_hidden(args["batch_size"])
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            data, targets = get_batch(train_data, i, bptt)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            if args["clip"] is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args["clip"])
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            train_losses.append(loss.item())
        val_loss = evaluate(val_data)
        val_losses.append(val_loss)
        if not best_val_loss or val_loss < best_val_loss:
            if epoch <= args["ckpt_epoch"]:
                torch.save({"model": model.state_dict(), "epoch": epoch, "lr": lr, "best_val_loss": val_loss}, ckpt)
            best_val_loss = val_loss
        else:
            lr /= 4.0
    return Trained(checkpoint=ckpt, train_losses=train_losses, val_losses=val_losses,
                   metrics={"steps_per_epoch": len(range(0, train_data.size(0) - 1, bptt))})


def symptom(run: str, trained: Trained) -> str | None:
    tl, vl = trained.train_losses, trained.val_losses
    uniform = math.log(NTOKENS)
    first = sum(tl[:10]) / 10
    last = sum(tl[-10:]) / 10
    if vl[-1] > 0.85 * uniform:
        return (f"train loss {first:.2f} -> {last:.2f} over {len(tl)} steps, val loss {vl[-1]:.2f} "
                f"(a uniform guess scores ln {NTOKENS} = {uniform:.2f})")
    return None


# ----------------------------------------------------------------------------- triage entries


def _setup(run: str):
    import triage

    args = args_for(run, None)
    torch.manual_seed(0)
    train_tok, val_tok = make_corpus(0)
    train_data = batchify(train_tok, args["batch_size"])
    val_data = batchify(val_tok, 10)
    model = build(args)
    criterion = nn.NLLLoss()
    bptt = args["bptt"]
    batches = [get_batch(train_data, i, bptt) for i in range(0, train_data.size(0) - 1, bptt)][:60]
    val_batches = [get_batch(val_data, i, bptt) for i in range(0, val_data.size(0) - 1, bptt)][:12]
    state = {"hidden": None}

    def loss_fn(model, batch):
        data, targets = batch
        output, _ = model(data, model.init_hidden(data.size(1)))
        return criterion(output, targets)

    def train_step(model, lr, batch):
        # main.py's train(): hidden carried over and repackaged, clip, the manual SGD update
        data, targets = batch
        if state["hidden"] is None or state["hidden"][0].size(1) != data.size(1):
            state["hidden"] = model.init_hidden(data.size(1))
        model.zero_grad()
        hidden = repackage_hidden(state["hidden"])
        output, hidden = model(data, hidden)
        state["hidden"] = hidden
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args["clip"])
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        return loss

    return triage.Setup(
        model=model,
        manual_lr=args["lr"],
        loss_fn=loss_fn,
        batches=batches,
        val_batches=val_batches,
        grad_clip=args["clip"],
        train_step=train_step,
        total_steps=args["epochs"] * len(range(0, train_data.size(0) - 1, bptt)),
        steps_per_epoch=len(range(0, train_data.size(0) - 1, bptt)),
    )


def setup_healthy():
    return _setup("healthy")


def setup_lr_too_low():
    return _setup("lr_too_low")
