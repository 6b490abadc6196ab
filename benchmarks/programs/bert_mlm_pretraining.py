"""BERT-style masked-language-model pretraining of a tiny BertForMaskedLM built from a config.

Written after huggingface/transformers `examples/pytorch/language-modeling/run_mlm_no_trainer.py`: texts
tokenized and grouped into fixed blocks (`group_texts`), a `DataCollatorForLanguageModeling(mlm_probability=
0.15)` that picks 15% of the non-special positions, replaces 80% of them with [MASK], 10% with a random token,
keeps 10%, and sets `labels` to -100 everywhere else (`torch_mask_tokens`); dict batches `input_ids`,
`attention_mask`, `labels`; `AutoModelForMaskedLM` (here `BertForMaskedLM(BertConfig(...))`, nothing
downloaded); AdamW over two param groups (no weight decay on `bias` and `LayerNorm.weight`); `get_scheduler(
"linear", num_warmup_steps, max_train_steps)` stepped every optimizer step; `loss = outputs.loss`; an eval pass
per epoch reporting the loss and perplexity with the same collator; a checkpoint every `checkpointing_steps`
(here `torch.save` of model, optimizer and scheduler states with the step). I read the collator's masking code
in several public copies (the code search) and the script's loop.

The corpus is synthetic: sentences of 30 words, each sentence on one of 10 topics (6 words per topic, drawn
with skewed frequencies, 10% off-topic words), so a masked word is predictable from the rest of the sentence
but not certain: the masked-token loss has a floor well above 0 (about 2.0 here; the best possible fill-mask
accuracy is about 41%). The program measures, beside the loss it logs, what a user
checks with a fill-mask probe: accuracy of the top prediction at masked positions against the ORIGINAL tokens
of held-out sentences (the honest masked-token accuracy).

Runs
- healthy: the collator as in transformers; 480 steps (64 per epoch); checkpoint at step 96 (epoch 1.5 of
  7.5) while the masked-token loss is still falling towards its non-zero floor (it ends near 2.05).
- labels_after_masking: the owner moved masking into their own collator and built the labels from the
  already-masked ids (`input_ids` masked in place, then `labels = input_ids.clone(); labels[~masked] = -100`).
  The target at a masked position is now the [MASK] (or random, or kept) token that is in the input: the model
  learns to copy its input, the logged MLM loss (train and eval, both through that collator) falls to ~0.08 and
  perplexity to ~1.1, while fill-mask predictions are [MASK] and the honest masked-token accuracy is near 0. Users
  report a too-good MLM loss from labels built the wrong way (huggingface/transformers#20797: loss 0.10-0.20
  until the labels were fixed; #2946 and codertimo/BERT-pytorch#29 on which positions the labels must cover).
  Root cause `wrong_loss` (the objective scores the wrong targets; the fix `labels_before_masking`, cloning the
  labels before the inputs are masked, removes it). Competing fix a user tries first: lr x0.1 (`lr_1e-4`),
  which leaves it. The checkpoint is the step-192 one (epoch 3), long after the loss collapsed below 0.3.
"""

from __future__ import annotations

from pathlib import Path

import torch

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="bert_mlm_pretraining",
    kind="nlp-pretraining",
    original="huggingface/transformers: examples/pytorch/language-modeling/run_mlm_no_trainer.py + "
             "DataCollatorForLanguageModeling.torch_mask_tokens",
    runs={
        "healthy": Run(cause="healthy", story="Tiny BERT MLM pretraining with the standard 80/10/10 collator; "
                       "masked-token loss falling towards a floor near 2 at the step-96 checkpoint."),
        "labels_after_masking": Run(
            cause="wrong_loss",
            story="My own MLM collator: the loss dropped below 0.1 and perplexity to 1.1 within a few epochs, "
                  "but fill-mask predicts [MASK] for every masked word.",
            fix="labels_before_masking", competing=("lr_1e-4",)),
    },
)

PAD, CLS, SEP, MASK = 0, 1, 2, 3
N_SPECIAL, N_WORDS, N_TOPICS = 5, 60, 10
VOCAB = N_SPECIAL + N_WORDS
SEQ, BS, N_TRAIN, N_VAL, STEPS, WARMUP = 32, 32, 2048, 256, 480, 24
CKPT_STEP = {"healthy": 96, "labels_after_masking": 192}


def make_corpus(seed):
    g = torch.Generator().manual_seed(7300 + seed)
    topic_words = torch.randperm(N_WORDS, generator=g).view(N_TOPICS, -1)        # 10 topics x 6 words
    within = torch.tensor([0.45, 0.2, 0.12, 0.1, 0.08, 0.05])

    def sentences(n):
        topic = torch.randint(0, N_TOPICS, (n,), generator=g)
        pick = torch.multinomial(within, n * (SEQ - 2), replacement=True, generator=g).view(n, SEQ - 2)
        words = topic_words[topic][torch.arange(n)[:, None], pick]
        noise = torch.rand(n, SEQ - 2, generator=g) < 0.1                       # off-topic words
        words[noise] = torch.randint(0, N_WORDS, (int(noise.sum()),), generator=g)
        ids = torch.full((n, SEQ), PAD, dtype=torch.long)
        ids[:, 0], ids[:, -1] = CLS, SEP
        ids[:, 1:-1] = words + N_SPECIAL
        return ids

    return sentences(N_TRAIN), sentences(N_VAL)


def mask_tokens(input_ids, g, labels_after_masking=False):
    """The collator: 15% of the non-special positions; 80% [MASK], 10% random, 10% kept; -100 elsewhere."""
    inputs = input_ids.clone()
    if not labels_after_masking:
        labels = inputs.clone()
    special = inputs < N_SPECIAL
    prob = torch.full(inputs.shape, 0.15).masked_fill(special, 0.0)
    masked = torch.bernoulli(prob, generator=g).bool()
    replaced = torch.bernoulli(torch.full(inputs.shape, 0.8), generator=g).bool() & masked
    inputs[replaced] = MASK
    rand = torch.bernoulli(torch.full(inputs.shape, 0.5), generator=g).bool() & masked & ~replaced
    inputs[rand] = torch.randint(N_SPECIAL, VOCAB, inputs.shape, generator=g)[rand]
    if labels_after_masking:                 # the owner's collator: labels built from the masked ids
        labels = inputs.clone()
    labels[~masked] = -100
    return {"input_ids": inputs, "attention_mask": torch.ones_like(inputs), "labels": labels}


def collate_epoch(ids, epoch, seed, buggy):
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(ids), generator=g)
    return [mask_tokens(ids[order[i:i + BS]], g, buggy) for i in range(0, len(ids), BS)]


def build(run, variant, seed=0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=SEQ, type_vocab_size=1,
                        pad_token_id=PAD, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(config)
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
         "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
         "weight_decay": 0.0},
    ]
    lr = 1e-4 if variant == "lr_1e-4" else 1e-3
    optimizer = torch.optim.AdamW(groups, lr=lr)
    from transformers import get_scheduler

    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=WARMUP,
                                 num_training_steps=STEPS)
    buggy = run == "labels_after_masking" and variant != "labels_before_masking"
    return model, optimizer, lr_scheduler, buggy


def mlm_loss(model, batch):
    return model(**batch).loss


@torch.no_grad()
def honest_probe(model, val_ids):
    """Fill-mask on held-out sentences: every 7th word replaced by [MASK], scored against the original word."""
    model.eval()
    inputs = val_ids.clone()
    pos = torch.zeros_like(inputs, dtype=torch.bool)
    pos[:, 1:-1:7] = True
    inputs[pos] = MASK
    logits = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
    target = val_ids[pos]
    acc = float((logits[pos].argmax(-1) == target).float().mean())
    loss = float(torch.nn.functional.cross_entropy(logits[pos], target))
    model.train()
    return acc, loss


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_ids, val_ids = make_corpus(seed)
    model, optimizer, lr_scheduler, buggy = build(run, variant, seed)
    eval_batches = collate_epoch(val_ids, 999, seed, buggy)
    ckpt_step = CKPT_STEP[run]
    ckpt = Path(out_dir) / f"step_{ckpt_step}.pt"
    losses, evals = [], []
    step, epoch = 0, 0
    model.train()
    while step < STEPS:
        for batch in collate_epoch(train_ids, epoch, seed, buggy):
            loss = mlm_loss(model, batch)
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            step += 1
            if step == ckpt_step:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "lr_scheduler": lr_scheduler.state_dict(), "completed_steps": step,
                            "epoch": epoch}, ckpt)
            if step >= STEPS:
                break
        model.eval()
        with torch.no_grad():
            evals.append(sum(float(mlm_loss(model, b)) for b in eval_batches) / len(eval_batches))
        model.train()
        epoch += 1
    acc, honest = honest_probe(model, val_ids)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=evals,
                   metrics={"masked_acc": acc, "honest_masked_loss": honest, "eval_loss": evals[-1],
                            "train_loss_last": sum(losses[-20:]) / 20})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["masked_acc"] < 0.2:
        return (f"MLM loss {m['train_loss_last']:.3f} (eval {m['eval_loss']:.3f}) after {len(trained.train_losses)} "
                f"steps while fill-mask on held-out sentences is right {100 * m['masked_acc']:.1f}% of the time "
                f"(masked-token loss against the original words {m['honest_masked_loss']:.2f})")
    return None


def _setup(run):
    import triage

    train_ids, val_ids = make_corpus(0)
    model, optimizer, lr_scheduler, buggy = build(run, None, 0)
    # the batches the run meets after its checkpoint, through the run's own collator
    first_epoch = CKPT_STEP[run] // (N_TRAIN // BS)
    batches = collate_epoch(train_ids, first_epoch, 0, buggy) + collate_epoch(train_ids, first_epoch + 1, 0, buggy)
    if run == "healthy":
        batches = batches[(N_TRAIN // BS) // 2:]
    return triage.Setup(model=model, optimizer=optimizer, scheduler=lr_scheduler, loss_fn=mlm_loss,
                        batches=batches[:48], val_batches=collate_epoch(val_ids, 999, 0, buggy),
                        total_steps=STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_labels_after_masking():
    return _setup("labels_after_masking")
