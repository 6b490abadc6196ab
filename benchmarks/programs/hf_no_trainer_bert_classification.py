"""A tiny BERT sequence classifier trained the way transformers' run_glue_no_trainer.py trains.

Follows huggingface/transformers `examples/pytorch/text-classification/run_glue_no_trainer.py` (read
through its public source): dict batches `{"input_ids", "attention_mask", "token_type_ids", "labels"}`
from a padding collator, `outputs = model(**batch); loss = outputs.loss`, the two parameter groups
(`no_decay = ["bias", "LayerNorm.weight"]` get weight decay 0), `torch.optim.AdamW`, `get_scheduler("linear",
num_warmup_steps, num_training_steps=args.max_train_steps)` stepped after every optimizer step,
`args.max_train_steps = num_train_epochs * num_update_steps_per_epoch`, and a checkpoint at the end of each
epoch (`checkpointing_steps="epoch"`). The example uses Accelerate; on one CPU process that is the plain loop
here, and the owner saves `{"model", "optimizer", "scheduler", "step", "epoch"}` with torch.save instead
of `accelerator.save_state`. The model is a tiny `BertConfig` built in code (no download) and trained from
scratch (lr 1e-3). Data made in code: "sentences" of 8 to 24 token ids; the label says whether a cue token
from a small set occurs in it (a keyword-sentiment task).

Runs
- healthy: the schedule sized to the whole run (4 epochs). Checkpoint at the end of epoch 3, still improving
  (the tiny model from scratch sits near ln 2 for most of epoch 1, then learns).
- lr_schedule_decayed: the scheduler was built with `num_training_steps=len(train_dataloader)` (one
  epoch's steps: the script was written for a single epoch, then `--num_train_epochs 4` was passed; the
  same family as transformers issue #26827, "the learning rate is 0 after half of args.max_train_steps"
  in run_translation_no_trainer.py when the scheduler length and the steps actually taken disagree, and
  FARM #46 "LR = 0 for the last steps"). After epoch 1 the linear schedule is at 0 and the loss freezes
  where it was. Root cause `lr_schedule_decayed`: sizing the schedule to the run (the LR held up) removes it.
  Fix `full_schedule` (num_training_steps = max_train_steps). Competing `no_warmup` (num_warmup_steps 0,
  the other schedule knob users suspect), which leaves the LR at 0 after epoch 1 all the same.
  Checkpoint: end of epoch 3, loss flat for two epochs.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification, get_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="hf_no_trainer_bert_classification",
    kind="nlp",
    original="huggingface/transformers examples/pytorch/text-classification/run_glue_no_trainer.py",
    runs={
        "healthy": Run(cause="healthy", story="Tiny BERT from scratch, linear schedule over 4 epochs; checkpoint after epoch 3."),
        "lr_schedule_decayed": Run(
            cause="lr_schedule_decayed",
            story="Passed --num_train_epochs 4 to my one-epoch script; the loss stopped moving after the first "
                  "epoch and the logged LR reads 0.",
            fix="full_schedule",
            competing=("no_warmup",),
        ),
    },
)

VOCAB, CUES = 64, (5, 6, 7)


def make_examples(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(8, 25, (1,), generator=g))
        ids = torch.randint(10, VOCAB, (L,), generator=g)
        label = int(torch.randint(0, 2, (1,), generator=g))
        if label:
            ids[int(torch.randint(0, L, (1,), generator=g))] = CUES[int(torch.randint(0, 3, (1,), generator=g))]
        ids = torch.cat([torch.tensor([2]), ids, torch.tensor([3])])  # [CLS] ... [SEP]
        out.append({"input_ids": ids, "labels": label})
    return out


def collate(features):
    # DataCollatorWithPadding, pad id 0
    L = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), L, dtype=torch.long)
    mask = torch.zeros(len(features), L, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = f["input_ids"]
        mask[i, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.tensor([f["labels"] for f in features])}


def args_for(run, variant):
    a = dict(learning_rate=1e-3, weight_decay=0.01, num_train_epochs=4, per_device_train_batch_size=16,
             num_warmup_steps=8, lr_scheduler_type="linear", schedule_epochs=4, ckpt_epoch=3)
    if run == "lr_schedule_decayed":
        a.update(schedule_epochs=1, ckpt_epoch=3)
        if variant == "full_schedule":
            a["schedule_epochs"] = 4
        elif variant == "no_warmup":
            a["num_warmup_steps"] = 0
    return a


def build(a, steps_per_epoch):
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": a["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=a["learning_rate"])
    lr_scheduler = get_scheduler(name=a["lr_scheduler_type"], optimizer=optimizer,
                                 num_warmup_steps=a["num_warmup_steps"],
                                 num_training_steps=a["schedule_epochs"] * steps_per_epoch)
    return model, optimizer, lr_scheduler


def dataloaders(seed, bs):
    train_ds = make_examples(640, seed)
    eval_ds = make_examples(160, seed + 1000)
    g = torch.Generator().manual_seed(seed)
    return (torch.utils.data.DataLoader(train_ds, shuffle=True, collate_fn=collate, batch_size=bs, generator=g),
            torch.utils.data.DataLoader(eval_ds, collate_fn=collate, batch_size=32))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    a = args_for(run, variant)
    torch.manual_seed(seed)
    train_dl, eval_dl = dataloaders(seed, a["per_device_train_batch_size"])
    model, optimizer, lr_scheduler = build(a, len(train_dl))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "epoch_ckpt.pt"
    completed_steps, losses, lrs, evals = 0, [], [], []
    for epoch in range(a["num_train_epochs"]):
        model.train()
        for step, batch in enumerate(train_dl):
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            lrs.append(lr_scheduler.get_last_lr()[0])
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            completed_steps += 1
            losses.append(loss.item())
        model.eval()
        correct = n = 0
        eval_loss = 0.0
        with torch.no_grad():
            for batch in eval_dl:
                out = model(**batch)
                eval_loss += out.loss.item() * len(batch["labels"])
                correct += (out.logits.argmax(-1) == batch["labels"]).sum().item()
                n += len(batch["labels"])
        evals.append((eval_loss / n, correct / n))
        if epoch + 1 <= a["ckpt_epoch"]:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": lr_scheduler.state_dict(), "step": completed_steps, "epoch": epoch + 1}, ckpt)
        if epoch + 1 >= a["ckpt_epoch"]:
            break
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=[e[0] for e in evals],
                   metrics={"lrs": lrs, "steps_per_epoch": len(train_dl), "eval_acc": evals[-1][1]})


def symptom(run: str, trained: Trained) -> str | None:
    tl, spe, lrs = trained.train_losses, trained.metrics["steps_per_epoch"], trained.metrics["lrs"]
    if len(tl) < 2 * spe:
        return None
    later = tl[spe:]
    a = sum(later[:10]) / 10
    b = sum(later[-10:]) / 10
    if b > 0.9 * a and b > 0.3:
        return (f"train loss {a:.3f} -> {b:.3f} from step {spe} to {len(tl)} (eval accuracy "
                f"{trained.metrics['eval_acc']:.2f}), LR {lrs[spe]:.2e} after epoch 1")
    return None


def _setup(run: str):
    import triage

    a = args_for(run, None)
    torch.manual_seed(0)
    train_dl, eval_dl = dataloaders(0, a["per_device_train_batch_size"])
    model, optimizer, lr_scheduler = build(a, len(train_dl))
    return triage.Setup(
        model=model,
        optimizer=optimizer,
        scheduler=lr_scheduler,
        loss_fn=lambda model, batch: model(**batch).loss,
        batches=train_dl,           # 40 batches of 16
        val_batches=eval_dl,
        total_steps=a["num_train_epochs"] * len(train_dl),
    )


def setup_healthy():
    return _setup("healthy")


def setup_lr_schedule_decayed():
    return _setup("lr_schedule_decayed")
