"""An LSTM sentiment classifier on variable-length reviews with packed sequences.

Written after bentrevett/pytorch-sentiment-analysis (the "Upgraded sentiment analysis" / LSTM notebook, read
through its public source): an `nn.Embedding` with `padding_idx=pad_index`, a bidirectional multi-layer
`nn.LSTM`, `nn.utils.rnn.pack_padded_sequence(embedded, length, batch_first=True, enforce_sorted=False)`,
the last layer's forward and backward hidden states concatenated and passed through dropout to a linear
layer, `nn.CrossEntropyLoss`, `optim.Adam`, a `collate_fn` that pads `ids` with `pad_index` and returns
dict batches `{"ids", "length", "label"}`, and per epoch a train pass and an evaluate pass, saving
`model.state_dict()` when the validation loss is the best so far. Data made in code: "reviews" of 6 to 24
word ids drawn from neutral, positive and negative words, the label the sign of (positive - negative)
words, padded per batch.

Runs
- healthy: Adam lr 3e-3. Five epochs planned; after three the state_dict of the best epoch so far is
  triaged (val loss 0.69 -> ~0.2, still improving).
- weight_decay_too_high: the user put `weight_decay=0.1` into `optim.Adam` (copied from an AdamW/BERT
  recipe; in `torch.optim.Adam` weight decay is an L2 term added to the gradient, so Adam's normalisation
  lets it dominate: the Adam vs AdamW pitfall of Loshchilov & Hutter, "Decoupled Weight Decay
  Regularization"; no user thread was found for this exact case). The weights are held near zero and the classifier stays
  at the class-prior loss. Root cause `weight_decay_too_high`: removing it is the fix that trains. Fix
  `no_weight_decay`. Competing `higher_lr` (lr 3e-3 -> 3e-2, what a user tries for a run that learns
  nothing): under a coupled L2 term Adam's equilibrium does not depend on the LR, so it still sits there.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="lstm_sentiment_packed",
    kind="nlp",
    original="bentrevett/pytorch-sentiment-analysis (LSTM notebook: packed padded sequences, bidirectional LSTM)",
    runs={
        "healthy": Run(cause="healthy", story="BiLSTM with packed sequences, Adam 3e-3; best-epoch state_dict mid-run."),
        "weight_decay_too_high": Run(
            cause="weight_decay_too_high",
            story="Added weight_decay=0.1 to optim.Adam as in my BERT recipes; loss stays at 0.69 and accuracy at "
                  "the majority class.",
            fix="no_weight_decay",
            competing=("higher_lr",),
        ),
    },
)

PAD, VOCAB = 0, 120
POS = range(1, 21)
NEG = range(21, 41)


class LSTM(nn.Module):
    def __init__(self, vocab_size, embedding_dim, hidden_dim, output_dim, n_layers, bidirectional, dropout_rate, pad_index):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, n_layers, bidirectional=bidirectional,
                            dropout=dropout_rate if n_layers > 1 else 0.0, batch_first=True)
        self.fc = nn.Linear(hidden_dim * 2 if bidirectional else hidden_dim, output_dim)
        self.dropout = nn.Dropout(dropout_rate)

    def forward(self, ids, length):
        embedded = self.dropout(self.embedding(ids))
        packed = nn.utils.rnn.pack_padded_sequence(embedded, length, batch_first=True, enforce_sorted=False)
        packed_output, (hidden, cell) = self.lstm(packed)
        if self.lstm.bidirectional:
            hidden = self.dropout(torch.cat([hidden[-1], hidden[-2]], dim=-1))
        else:
            hidden = self.dropout(hidden[-1])
        return self.fc(hidden)


def make_reviews(n, seed):
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(n):
        L = int(torch.randint(6, 25, (1,), generator=g))
        ids = torch.randint(41, VOCAB, (L,), generator=g)
        k = int(torch.randint(2, 5, (1,), generator=g))
        label = int(torch.randint(0, 2, (1,), generator=g))
        src = POS if label == 1 else NEG
        pos = torch.randperm(L, generator=g)[:k]
        ids[pos] = torch.randint(src.start, src.stop, (k,), generator=g)
        if float(torch.rand(1, generator=g)) < 0.5:  # a word of the other side now and then
            other = NEG if label == 1 else POS
            j = int(torch.randint(0, L, (1,), generator=g))
            if j not in pos.tolist() and k > 1:
                ids[j] = int(torch.randint(other.start, other.stop, (1,), generator=g))
        data.append({"ids": ids, "label": label})
    return data


def collate(batch):
    ids = nn.utils.rnn.pad_sequence([b["ids"] for b in batch], padding_value=PAD, batch_first=True)
    return {"ids": ids, "length": torch.tensor([len(b["ids"]) for b in batch]),
            "label": torch.tensor([b["label"] for b in batch])}


def loaders(seed, bs=24):
    train_data = make_reviews(960, seed)
    valid_data = make_reviews(240, seed + 500)
    g = torch.Generator().manual_seed(seed)
    train_dl = torch.utils.data.DataLoader(train_data, batch_size=bs, shuffle=True, collate_fn=collate, generator=g)
    valid_dl = torch.utils.data.DataLoader(valid_data, batch_size=bs, collate_fn=collate)
    return train_dl, valid_dl


def hparams(run, variant):
    hp = dict(lr=3e-3, weight_decay=0.0, epochs=3, planned_epochs=5, ckpt_epoch=3, embedding_dim=32, hidden_dim=32, n_layers=1,
              dropout=0.2)
    if run == "weight_decay_too_high":
        hp.update(weight_decay=0.1)
        if variant == "no_weight_decay":
            hp["weight_decay"] = 0.0
        elif variant == "higher_lr":
            hp["lr"] = 3e-2
    return hp


def build(hp):
    model = LSTM(VOCAB, hp["embedding_dim"], hp["hidden_dim"], 2, hp["n_layers"], True, hp["dropout"], PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    return model, optimizer


def loss_fn(model, batch, criterion=nn.CrossEntropyLoss()):
    return criterion(model(batch["ids"], batch["length"]), batch["label"])


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    hp = hparams(run, variant)
    torch.manual_seed(seed)
    train_dl, valid_dl = loaders(seed)
    model, optimizer = build(hp)
    criterion = nn.CrossEntropyLoss()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "lstm.pt"
    best_valid_loss = float("inf")
    train_losses, valid_losses, valid_accs = [], [], []
    for epoch in range(1, hp["epochs"] + 1):
        model.train()
        for batch in train_dl:
            prediction = model(batch["ids"], batch["length"])
            loss = criterion(prediction, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_losses.append(loss.item())
        model.eval()
        tot, acc, n = 0.0, 0.0, 0
        with torch.no_grad():
            for batch in valid_dl:
                pred = model(batch["ids"], batch["length"])
                tot += criterion(pred, batch["label"]).item() * len(batch["label"])
                acc += (pred.argmax(-1) == batch["label"]).float().sum().item()
                n += len(batch["label"])
        valid_losses.append(tot / n)
        valid_accs.append(acc / n)
        if valid_losses[-1] < best_valid_loss and epoch <= hp["ckpt_epoch"]:
            best_valid_loss = valid_losses[-1]
            torch.save(model.state_dict(), ckpt)
    return Trained(checkpoint=ckpt, train_losses=train_losses, val_losses=valid_losses,
                   metrics={"valid_acc": valid_accs[-1], "valid_accs": valid_accs})


def symptom(run: str, trained: Trained) -> str | None:
    tl, vl = trained.train_losses, trained.val_losses
    acc = trained.metrics["valid_acc"]
    if vl[-1] > 0.6:
        return (f"train loss {sum(tl[:10]) / 10:.3f} -> {sum(tl[-10:]) / 10:.3f} over {len(tl)} steps, valid loss "
                f"{vl[-1]:.3f} (ln 2 = {math.log(2):.3f}), valid accuracy {acc:.2f}")
    return None


def _setup(run: str):
    import triage

    hp = hparams(run, None)
    torch.manual_seed(0)
    train_dl, valid_dl = loaders(0)
    model, optimizer = build(hp)
    return triage.Setup(
        model=model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        batches=train_dl,            # 40 batches: triage reads the DataLoader once
        val_batches=valid_dl,
        total_steps=hp["planned_epochs"] * len(train_dl),
    )


def setup_healthy():
    return _setup("healthy")


def setup_weight_decay_too_high():
    return _setup("weight_decay_too_high")
