"""Token classification (NER) with a tiny BERT built from a config: per-token labels, -100 on padding/sub-tokens.

Follows transformers' examples/pytorch/token-classification/run_ner_no_trainer.py: `tokenize_and_align_labels`
(the label on a word's first sub-token, -100 on its other sub-tokens and on special/padding positions),
`DataCollatorForTokenClassification`-style dict batches (`input_ids`, `attention_mask`, `labels` padded with -100),
`AutoModelForTokenClassification` (here `BertForTokenClassification(BertConfig(...))`, no hub download), AdamW over
two param groups (no weight decay on `bias` and `LayerNorm.weight`), `get_scheduler("linear")` stepped every
optimizer step, the loss `outputs.loss`, an evaluation pass every epoch. The corpus is synthetic: sentences of
filler words with person and location names; a name is split into two word pieces; "mr"/"dr" often precede a
person and "in"/"at" a location (the context a model can generalise from); names in held-out text are new names.

Runs
- healthy: validation is a held-out set of new sentences; checkpoint at epoch 3 of 6 while it still improves.
- val_from_augmented_pool: the user enlarged the small corpus by duplicating every sentence (an "augmentation"
  that only re-cased/re-spaced the raw text, identical after tokenisation) and then drew the validation split
  with `train_test_split` from the enlarged pool, so nearly every validation sentence has its twin in training.
  Validation loss tracks the training loss down to a small value while the model fails on new sentences: the
  honest held-out loss is many times higher. Duplicates across splits are a known problem of NER corpora (CoNLL
  style data repeats sentences) and of "augment, then split" pipelines. Root cause: train_val_overlap (the fix is
  a split made before duplicating, i.e. a validation set of unseen sentences). Competing fix a user tries first:
  weight decay 0.1 on the decayed group (regularising does not make an overlapping validation set honest). The
  checkpoint is the epoch-4 one, once validation loss is far below the honest loss.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="token_classification_ner",
    kind="nlp",
    original="huggingface/transformers: examples/pytorch/token-classification/run_ner_no_trainer.py",
    runs={
        "healthy": Run(cause="healthy", story="Tiny BERT NER with an honest held-out validation set; checkpoint "
                                              "at epoch 3 of 6."),
        "val_from_augmented_pool": Run(
            cause="train_val_overlap",
            story="I duplicated my sentences as augmentation and split train/validation afterwards; validation "
                  "loss is tiny but the tagger fails on new text.",
            fix="split_before_augment",
            competing=("weight_decay_0.1",),
        ),
    },
)

LABELS = ["O", "B-PER", "B-LOC"]
PAD, CLS, SEP, SUFFIX = 0, 1, 2, 3
FILLER = list(range(10, 50))
CUE_PER, CUE_LOC = [4, 5], [6, 7]
NAME_BASE = 50
N_NAMES = 150
BATCH = 16
EPOCHS = 6


def _sentence(g, names_per, names_loc):
    words, tags = [], []
    n = int(torch.randint(5, 9, (1,), generator=g))
    for _ in range(n):
        r = float(torch.rand(1, generator=g))
        if r < 0.2:
            if float(torch.rand(1, generator=g)) < 0.6:
                words.append(CUE_PER[int(torch.randint(0, 2, (1,), generator=g))]); tags.append(0)
            words.append(names_per[int(torch.randint(0, len(names_per), (1,), generator=g))]); tags.append(1)
        elif r < 0.4:
            if float(torch.rand(1, generator=g)) < 0.6:
                words.append(CUE_LOC[int(torch.randint(0, 2, (1,), generator=g))]); tags.append(0)
            words.append(names_loc[int(torch.randint(0, len(names_loc), (1,), generator=g))]); tags.append(2)
        else:
            words.append(FILLER[int(torch.randint(0, len(FILLER), (1,), generator=g))]); tags.append(0)
    return words, tags


def tokenize_and_align_labels(words, tags):
    ids, labels = [CLS], [-100]
    for w, t in zip(words, tags):
        if w >= NAME_BASE:           # a name is two word pieces: the label on the first, -100 on the second
            ids += [w, SUFFIX]; labels += [t, -100]
        else:
            ids.append(w); labels.append(t)
    return ids + [SEP], labels + [-100]


def make_splits(run, seed, variant):
    g = torch.Generator().manual_seed(8000 + seed)
    names = (torch.randperm(N_NAMES, generator=g) + NAME_BASE).tolist()
    seen_per, seen_loc, new_per, new_loc = names[:40], names[40:80], names[80:115], names[115:]
    pool = [tokenize_and_align_labels(*_sentence(g, seen_per, seen_loc)) for _ in range(240)]
    honest = [tokenize_and_align_labels(*_sentence(g, new_per, new_loc)) for _ in range(96)]
    if run == "val_from_augmented_pool" and variant != "split_before_augment":
        enlarged = pool + [p for p in pool]              # the "augmented" copies, identical once tokenised
        perm = torch.randperm(len(enlarged), generator=g).tolist()
        val = [enlarged[i] for i in perm[:96]]
        train = [enlarged[i] for i in perm[96:96 + 240]]
    else:
        train, val = pool, honest
    return train, val, honest


def collate(rows):
    L = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), L), PAD, dtype=torch.long)
    labels = torch.full((len(rows), L), -100, dtype=torch.long)
    for i, (x, y) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        labels[i, : len(y)] = torch.tensor(y)
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "labels": labels}


def epoch_batches(rows, seed, epoch):
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed * 100 + epoch)).tolist()
    return [collate([rows[j] for j in perm[i:i + BATCH]]) for i in range(0, len(rows), BATCH)]


def make_model(seed):
    from transformers import BertConfig, BertForTokenClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=NAME_BASE + N_NAMES, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=len(LABELS),
                        id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)})
    return BertForTokenClassification(config)


def ner_loss(model, batch):
    return model(**batch).loss


def _build(run, seed, variant, total_steps):
    from transformers import get_scheduler

    model = make_model(seed)
    weight_decay = 0.1 if variant == "weight_decay_0.1" else 0.0
    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=3e-3)
    lr_scheduler = get_scheduler(name="linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=total_steps)
    return model, optimizer, lr_scheduler


def _eval(model, rows):
    model.eval()
    with torch.no_grad():
        ls = [float(ner_loss(model, b)) for b in epoch_batches(rows, 0, 0)]
    model.train()
    return sum(ls) / len(ls)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    train_rows, val_rows, honest_rows = make_splits(run, seed, variant)
    steps_per_epoch = (len(train_rows) + BATCH - 1) // BATCH
    model, optimizer, lr_scheduler = _build(run, seed, variant, EPOCHS * steps_per_epoch)
    ckpt_epoch = 3 if run == "healthy" else 4
    ckpt = out_dir / "ner_checkpoint.pt"
    losses, val_losses, honest_losses, step = [], [], [], 0
    model.train()
    for epoch in range(EPOCHS):
        for batch in epoch_batches(train_rows, seed, epoch + 1):
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            step += 1
            losses.append(loss.item())
        val_losses.append(_eval(model, val_rows))
        honest_losses.append(_eval(model, honest_rows))
        if epoch + 1 == ckpt_epoch:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": lr_scheduler.state_dict(), "step": step, "epoch": epoch + 1}, ckpt)
    n = steps_per_epoch
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"val_loss": val_losses[-1], "honest_loss": honest_losses[-1],
                            "train_last_epoch": sum(losses[-n:]) / n, "train_first_epoch": sum(losses[:n]) / n})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["val_loss"] < 0.5 * m["honest_loss"]:
        return (f"val loss {m['val_loss']:.3f} while honest held-out loss (new sentences) is "
                f"{m['honest_loss']:.3f}; train loss {m['train_last_epoch']:.3f}")
    if run == "healthy" and m["train_last_epoch"] > 0.5 * m["train_first_epoch"]:
        return f"healthy run failed to train: {m['train_first_epoch']:.3f} -> {m['train_last_epoch']:.3f}"
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    train_rows, val_rows, _ = make_splits(run, 0, None)
    steps_per_epoch = (len(train_rows) + BATCH - 1) // BATCH
    model, optimizer, lr_scheduler = _build(run, 0, None, EPOCHS * steps_per_epoch)
    start = 3 if run == "healthy" else 4
    batches = []
    for e in range(start + 1, EPOCHS + 4):
        batches += epoch_batches(train_rows, 0, e)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=ner_loss, batches=batches[:48],
                        val_batches=epoch_batches(val_rows, 0, 0), scheduler=lr_scheduler,
                        total_steps=EPOCHS * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_val_from_augmented_pool():
    return _setup("val_from_augmented_pool")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      symptom(r, tr))
