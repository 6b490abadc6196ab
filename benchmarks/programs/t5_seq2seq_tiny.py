"""A tiny T5 trained on a made-up translation task the way transformers' run_translation_no_trainer.py trains.

Follows huggingface/transformers `examples/pytorch/translation/run_translation_no_trainer.py` (and its twin
`summarization/run_summarization_no_trainer.py`; read through the public source): source/target pairs
tokenised into `input_ids` and `labels`, `DataCollatorForSeq2Seq` padding the inputs with the pad id and the
labels with `label_pad_token_id=-100` (`ignore_pad_token_for_loss`), the model shifting the labels itself
into `decoder_input_ids`, `outputs = model(**batch); loss = outputs.loss`, AdamW with the `no_decay =
["bias", "LayerNorm.weight", "layer_norm.weight"]` groups, `get_scheduler("linear", num_warmup_steps,
max_train_steps)` stepped per optimizer step, and a checkpoint per epoch. The model is a tiny `T5Config`
built in code (no download; T5's shared embedding ties encoder, decoder and lm_head). The "language pair"
is made in code: a sentence of 2 to 5 source words and its translation word by word through a fixed
dictionary, with EOS (id 1); pad id 0.

Runs
- healthy: pairs kept together. Checkpoint after epoch 3 of 5, still improving.
- label_bug: to cut padding the user sorted the source sentences by length before batching
  (`sorted(sources, key=len)`, a hand-rolled "sortish" batching) but left the target list in its original
  order, so each label sequence belongs to another example. The decoder can learn only what all targets
  share (a language model of the target side) and the loss sits at that level; eval token accuracy is at
  chance. Root cause `label_bug` (the labels are not the inputs' labels; the decider is the labels/inputs
  check and a tiny subset memorising). Fix `pairs_aligned` (sort the pairs together). Competing `higher_lr`
  (lr 3e-3 -> 1e-2, the usual T5 advice that "T5 needs a higher LR than the Trainer default"), which
  leaves it. Checkpoint after epoch 3 of 5, the loss flat for two epochs.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from transformers import T5Config, T5ForConditionalGeneration, get_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="t5_seq2seq_tiny",
    kind="seq2seq",
    original="huggingface/transformers examples/pytorch/translation/run_translation_no_trainer.py",
    runs={
        "healthy": Run(cause="healthy", story="Tiny T5 on a word-by-word toy translation; checkpoint after epoch 3 of 5."),
        "label_bug": Run(
            cause="label_bug",
            story="Sorted my source sentences by length to batch them tightly, forgot the targets; the loss "
                  "stopped at ~3.0 and the translations are word salad.",
            fix="pairs_aligned",
            competing=("higher_lr",),
        ),
    },
)

PAD, EOS, FIRST, NWORDS = 0, 1, 2, 24
VOCAB = FIRST + 2 * NWORDS


def make_pairs(n, seed):
    g = torch.Generator().manual_seed(seed)
    dictionary = torch.randperm(NWORDS, generator=torch.Generator().manual_seed(99)) + FIRST + NWORDS
    sources, targets = [], []
    for _ in range(n):
        L = int(torch.randint(2, 6, (1,), generator=g))
        src = torch.randint(FIRST, FIRST + NWORDS, (L,), generator=g)
        tgt = dictionary[src - FIRST]
        sources.append(src.tolist() + [EOS])
        targets.append(tgt.tolist() + [EOS])
    return sources, targets


def collate(features):
    # DataCollatorForSeq2Seq: inputs padded with PAD, labels with -100
    Ls = max(len(f["input_ids"]) for f in features)
    Lt = max(len(f["labels"]) for f in features)
    ids = torch.full((len(features), Ls), PAD)
    mask = torch.zeros(len(features), Ls, dtype=torch.long)
    labels = torch.full((len(features), Lt), -100)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[i, :len(f["input_ids"])] = 1
        labels[i, :len(f["labels"])] = torch.tensor(f["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def args_for(run, variant):
    a = dict(learning_rate=3e-3, weight_decay=0.01, num_train_epochs=5, batch_size=16, num_warmup_steps=10,
             ckpt_epoch=3, sort_targets_too=True)
    if run == "label_bug":
        a["sort_targets_too"] = False
        if variant == "pairs_aligned":
            a["sort_targets_too"] = True
        elif variant == "higher_lr":
            a["learning_rate"] = 1e-2
    return a


def datasets(a, seed):
    sources, targets = make_pairs(640, seed)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    sources_sorted = [sources[i] for i in order]
    targets_used = [targets[i] for i in order] if a["sort_targets_too"] else targets
    train_ds = [{"input_ids": s, "labels": t} for s, t in zip(sources_sorted, targets_used)]
    es, et = make_pairs(160, seed + 1000)
    eval_ds = [{"input_ids": s, "labels": t} for s, t in zip(es, et)]
    g = torch.Generator().manual_seed(seed)
    return (torch.utils.data.DataLoader(train_ds, shuffle=True, collate_fn=collate, batch_size=a["batch_size"], generator=g),
            torch.utils.data.DataLoader(eval_ds, collate_fn=collate, batch_size=32))


def build(a, steps_per_epoch):
    config = T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
    model = T5ForConditionalGeneration(config)
    no_decay = ["bias", "LayerNorm.weight", "layer_norm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": a["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=a["learning_rate"])
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=a["num_warmup_steps"],
                                 num_training_steps=a["num_train_epochs"] * steps_per_epoch)
    return model, optimizer, lr_scheduler


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    a = args_for(run, variant)
    torch.manual_seed(seed)
    train_dl, eval_dl = datasets(a, seed)
    model, optimizer, lr_scheduler = build(a, len(train_dl))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "t5_ckpt.pt"
    losses, evals, step = [], [], 0
    for epoch in range(a["num_train_epochs"]):
        model.train()
        for batch in train_dl:
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
        model.eval()
        tot = correct = n = 0.0
        with torch.no_grad():
            for batch in eval_dl:
                out = model(**batch)
                m = batch["labels"] != -100
                k = m.sum().item()
                tot += out.loss.item() * k
                correct += ((out.logits.argmax(-1) == batch["labels"]) & m).sum().item()
                n += k
        evals.append((tot / n, correct / n))
        if epoch + 1 == a["ckpt_epoch"]:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": lr_scheduler.state_dict(), "step": step, "epoch": epoch + 1}, ckpt)
            break
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=[e[0] for e in evals],
                   metrics={"eval_token_acc": evals[-1][1], "evals": evals})


def symptom(run: str, trained: Trained) -> str | None:
    tl, vl, acc = trained.train_losses, trained.val_losses, trained.metrics["eval_token_acc"]
    if vl[-1] > 2.4:
        return (f"train loss {sum(tl[:10]) / 10:.2f} -> {sum(tl[-10:]) / 10:.2f} over {len(tl)} steps, eval loss "
                f"{vl[-1]:.2f}, eval token accuracy {acc:.2f} (teacher-forced)")
    return None


def _setup(run: str):
    import triage

    a = args_for(run, None)
    torch.manual_seed(0)
    train_dl, eval_dl = datasets(a, 0)
    model, optimizer, lr_scheduler = build(a, len(train_dl))
    return triage.Setup(
        model=model,
        optimizer=optimizer,
        scheduler=lr_scheduler,
        loss_fn=lambda model, batch: model(**batch).loss,
        batches=train_dl,            # 40 batches of 16
        val_batches=eval_dl,
        total_steps=a["num_train_epochs"] * len(train_dl),
    )


def setup_healthy():
    return _setup("healthy")


def setup_label_bug():
    return _setup("label_bug")
