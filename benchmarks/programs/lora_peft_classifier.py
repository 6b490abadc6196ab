"""LoRA on a small BERT-style sequence classifier with peft, frozen base by design.

Follows huggingface/peft's sequence-classification LoRA examples (`examples/sequence_classification/LoRA.ipynb`
and the peft docs' "LoRA for sequence classification", read through the public source): a
`LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=16, lora_dropout=0.1, target_modules=["query", "value"])`,
`get_peft_model(model, config)` so that only the LoRA matrices and the classifier head (peft's
`modules_to_save` for SEQ_CLS) train, `print_trainable_parameters`, `torch.optim.AdamW(params=model.parameters(),
lr=lr)`, `get_linear_schedule_with_warmup` over `len(train_dataloader) * num_epochs` with 6% warmup, dict
batches `model(**batch).loss`, and per-epoch evaluation. The base is a tiny `BertConfig` model built in code
(no download): as a stand-in for a pretrained checkpoint its encoder is first fitted to a related task for
a few steps ("the pretrained model", kept in a cache file per seed
as the hub cache keeps a download, so `setup()` only loads it), then frozen and adapted with LoRA, with a new
classifier head, to the downstream data (new sentences, two cue words each). The owner saves `{"model": model.state_dict(), "optimizer", "scheduler", "step"}`
(every parameter, frozen ones included, so the checkpoint loads into a fresh `setup()`).

Runs
- healthy: lr 2e-3 (peft's examples use 1e-3 to 3e-3 for LoRA). Checkpoint after epoch 2 of 4.
- lr_too_low: the user kept lr 2e-5, the full fine-tuning LR of their BERT recipes. With only the rank-8
  adapters (B initialised to zero) and the head training, nothing moves: the loss stays at ln 2. peft
  maintainers say LoRA wants a higher LR than full fine-tuning (huggingface/peft #1948, "With PEFT, it is
  also common to choose a higher learning rate than when fully fine-tuning"). Root cause `lr_too_low`.
  Fix `lora_lr` (2e-3). Competing `bigger_rank` (r 8 -> 32, alpha 64: "more capacity", what users try
  first), which leaves it. Checkpoint: after epoch 3 of 4, flat since the start.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="lora_peft_classifier",
    kind="peft",
    original="huggingface/peft examples/sequence_classification (LoRA on a BERT-style classifier)",
    runs={
        "healthy": Run(cause="healthy", story="LoRA r=8 on q/v of a small BERT, lr 2e-3; checkpoint after epoch 2 of 4; base frozen by design."),
        "lr_too_low": Run(
            cause="lr_too_low",
            story="LoRA fine-tune at lr 2e-5 as in my full fine-tuning runs; three epochs and the loss is still 0.69.",
            fix="lora_lr",
            competing=("bigger_rank",),
        ),
    },
)

VOCAB = 64
CUES_A, CUES_B = (5, 6, 7), (8, 9, 10)


def make_examples(n, seed, task):
    """Sentences of 8-20 ids; one cue from A or B planted; the label is the side (task 1 also plants a
    second, distracting word of the other side now and then and counts the majority)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        L = int(torch.randint(8, 21, (1,), generator=g))
        ids = torch.randint(12, VOCAB, (L,), generator=g)
        side = int(torch.randint(0, 2, (1,), generator=g))
        cues = CUES_A if side == 0 else CUES_B
        j = int(torch.randint(0, 3, (1,), generator=g))
        ids[int(torch.randint(0, L, (1,), generator=g))] = cues[j]
        label = side
        if task == 1:
            k = int(torch.randint(0, L, (1,), generator=g))
            ids[k] = cues[int(torch.randint(0, 3, (1,), generator=g))]
        ids = torch.cat([torch.tensor([2]), ids, torch.tensor([3])])
        out.append({"input_ids": ids, "labels": label})
    return out


def collate(features):
    L = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), L, dtype=torch.long)
    mask = torch.zeros(len(features), L, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = f["input_ids"]
        mask[i, :len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["labels"] for f in features])}


_BASE = {}


def base_model(seed):
    """The 'pretrained' base: a tiny BERT briefly trained on task 0, its state cached per seed."""
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    cache = Path(tempfile.gettempdir()) / f"lora_peft_classifier_base_{seed}.pt"   # the "hub cache"
    if seed not in _BASE and cache.exists():
        _BASE[seed] = torch.load(cache, weights_only=True)
    if seed not in _BASE:
        torch.manual_seed(10_000 + seed)
        m = BertForSequenceClassification(config)
        opt = torch.optim.AdamW(m.parameters(), lr=2e-3)
        data = make_examples(640, 50_000 + seed, task=0)
        g = torch.Generator().manual_seed(seed)
        dl = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, collate_fn=collate, generator=g)
        m.train()
        for _ in range(2):
            for batch in dl:
                m(**batch).loss.backward()
                opt.step()
                opt.zero_grad()
        _BASE[seed] = {k: v.clone() for k, v in m.state_dict().items() if not k.startswith("classifier")}
        torch.save(_BASE[seed], cache)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config)      # a new classifier head, as from_pretrained gives
    model.load_state_dict(_BASE[seed], strict=False)
    return model


def args_for(run, variant):
    a = dict(lr=2e-3, r=8, lora_alpha=16, num_epochs=4, batch_size=16, ckpt_epoch=2)
    if run == "lr_too_low":
        a.update(lr=2e-5, ckpt_epoch=3)
        if variant == "lora_lr":
            a["lr"] = 2e-3
        elif variant == "bigger_rank":
            a.update(r=32, lora_alpha=64)
    return a


def build(a, seed, steps_per_epoch):
    model = base_model(seed)
    peft_config = LoraConfig(task_type="SEQ_CLS", inference_mode=False, r=a["r"], lora_alpha=a["lora_alpha"],
                             lora_dropout=0.1, target_modules=["query", "value"])
    model = get_peft_model(model, peft_config)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=a["lr"])
    total = steps_per_epoch * a["num_epochs"]
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=int(0.06 * total),
                                                   num_training_steps=total)
    return model, optimizer, lr_scheduler


def dataloaders(seed, bs):
    train_ds = make_examples(640, seed, task=1)
    eval_ds = make_examples(160, seed + 1000, task=1)
    g = torch.Generator().manual_seed(seed)
    return (torch.utils.data.DataLoader(train_ds, shuffle=True, collate_fn=collate, batch_size=bs, generator=g),
            torch.utils.data.DataLoader(eval_ds, collate_fn=collate, batch_size=32))


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    a = args_for(run, variant)
    train_dl, eval_dl = dataloaders(seed, a["batch_size"])
    model, optimizer, lr_scheduler = build(a, seed, len(train_dl))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt = out_dir / "lora_ckpt.pt"
    losses, evals, step = [], [], 0
    for epoch in range(a["num_epochs"]):
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
        tot = correct = n = 0
        with torch.no_grad():
            for batch in eval_dl:
                out = model(**batch)
                tot += out.loss.item() * len(batch["labels"])
                correct += (out.logits.argmax(-1) == batch["labels"]).sum().item()
                n += len(batch["labels"])
        evals.append((tot / n, correct / n))
        if epoch + 1 == a["ckpt_epoch"]:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": lr_scheduler.state_dict(), "step": step, "epoch": epoch + 1}, ckpt)
            break
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=[e[0] for e in evals],
                   metrics={"eval_acc": evals[-1][1]})


def symptom(run: str, trained: Trained) -> str | None:
    tl, vl = trained.train_losses, trained.val_losses
    if vl[-1] > 0.6:
        return (f"train loss {sum(tl[:10]) / 10:.3f} -> {sum(tl[-10:]) / 10:.3f} over {len(tl)} steps, eval loss "
                f"{vl[-1]:.3f} (ln 2 = 0.693), eval accuracy {trained.metrics['eval_acc']:.2f}")
    return None


def _setup(run: str):
    import triage

    a = args_for(run, None)
    train_dl, eval_dl = dataloaders(0, a["batch_size"])
    model, optimizer, lr_scheduler = build(a, 0, len(train_dl))
    return triage.Setup(
        model=model,
        optimizer=optimizer,
        scheduler=lr_scheduler,
        loss_fn=lambda model, batch: model(**batch).loss,
        batches=train_dl,
        val_batches=eval_dl,
        total_steps=a["num_epochs"] * len(train_dl),
    )


def setup_healthy():
    return _setup("healthy")


def setup_lr_too_low():
    return _setup("lr_too_low")
