"""Pairwise (Bradley-Terry) reward model: a tiny transformer with a scalar head on chosen / rejected pairs.

Follows TRL's RewardTrainer (huggingface/trl trl/trainer/reward_trainer.py): a sequence-classification model with
`num_labels=1` (here `GPT2ForSequenceClassification` from a `GPT2Config` built in code, which reads the score at
the last non-padding token via `pad_token_id`), dict batches `input_ids_chosen`/`attention_mask_chosen`/
`input_ids_rejected`/`attention_mask_rejected`, `compute_loss` = `-logsigmoid(rewards_chosen -
rewards_rejected).mean()`, AdamW with a linear-decay schedule stepped each optimizer step, an evaluation every epoch
(`eval_loss`, preference accuracy) and Trainer checkpoint folders (`checkpoint-N/`: model.safetensors,
optimizer.pt, scheduler.pt, trainer_state.json with `log_history`). The preference data is synthetic: responses
of 8 tokens, the annotators prefer the one with more "helpful" tokens and fewer "harmful" ones, with 15% of the
labels flipped (annotator disagreement, as in real preference sets).

Runs
- healthy: 512 training pairs, 3 epochs (the usual advice for reward models: few epochs over much data);
  checkpoint after epoch 1 while eval_loss still falls.
- small_set_many_epochs: the user trains on a small hand-labelled set (64 pairs) for 30 epochs. The reward model
  memorises it, flipped labels included: train loss -> ~0 while eval_loss climbs far above its minimum (reached in
  the first epochs). Reward models are known to overfit after about one epoch (InstructGPT trains its RM for a
  single epoch for that reason; ethanyanjiali/minChatGPT#3: "Tested on a small train set (20) and it does
  overfit"; LAION-AI/Open-Assistant#232: "I noticed there was a lot of overfitting"). Root cause: overfitting (the
  fix is more data / fewer passes over it). Competing fixes a user tries first: TRL's
  `center_rewards_coefficient=0.01` (keeps rewards centred, does not stop memorisation) and the Trainer's usual
  `weight_decay=0.01` (far too weak to stop 64 pairs being memorised). The checkpoint is the one at epoch 20, once eval_loss has been rising
  for many epochs; the Trainer folder's trainer_state.json holds the loss and eval_loss history.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="reward_model_pairwise",
    kind="preference",
    original="huggingface/trl: trl/trainer/reward_trainer.py (RewardTrainer)",
    runs={
        "healthy": Run(cause="healthy", story="Reward model on 512 preference pairs for 3 epochs; checkpoint "
                                              "after epoch 1 while eval_loss still falls."),
        "small_set_many_epochs": Run(
            cause="overfitting",
            story="I trained the reward model on my 64 labelled pairs for 30 epochs; train loss went to ~0 but "
                  "eval_loss rose steadily after the first epochs.",
            fix="more_data",
            competing=("center_rewards", "weight_decay_0.01"),
        ),
    },
)

PAD = 0
VOCAB = 20
SEQ = 8
HELPFUL = torch.tensor([2, 3, 4, 5])
HARMFUL = torch.tensor([6, 7, 8, 9])
N_VAL = 128
BATCH = 16
FLIP = 0.15


def _score(x):
    return torch.isin(x, HELPFUL).sum(-1) - torch.isin(x, HARMFUL).sum(-1)


def make_pairs(n, g):
    a = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    b = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    # variable lengths: right padding as a tokenizer pads
    la = torch.randint(5, SEQ + 1, (n,), generator=g)
    lb = torch.randint(5, SEQ + 1, (n,), generator=g)
    ar = torch.arange(SEQ)
    a = a.masked_fill(ar >= la[:, None], PAD)
    b = b.masked_fill(ar >= lb[:, None], PAD)
    prefer_a = _score(a) + 0.1 * torch.randn(n, generator=g) > _score(b)
    flip = torch.rand(n, generator=g) < FLIP
    prefer_a = prefer_a ^ flip
    chosen = torch.where(prefer_a[:, None], a, b)
    rejected = torch.where(prefer_a[:, None], b, a)
    return chosen, rejected


def make_data(run, seed, variant):
    g = torch.Generator().manual_seed(6000 + seed)
    val = make_pairs(N_VAL, g)
    n = 512 if (run == "healthy" or variant == "more_data") else 64
    return make_pairs(n, g), val


def to_batches(pairs, perm=None):
    chosen, rejected = pairs
    idx = perm if perm is not None else torch.arange(len(chosen))
    out = []
    for i in range(0, len(idx), BATCH):
        j = idx[i:i + BATCH]
        out.append({"input_ids_chosen": chosen[j], "attention_mask_chosen": (chosen[j] != PAD).long(),
                    "input_ids_rejected": rejected[j], "attention_mask_rejected": (rejected[j] != PAD).long()})
    return out


def make_model(seed):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, bos_token_id=None, eos_token_id=None, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, num_labels=1,
                        pad_token_id=PAD, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2ForSequenceClassification(config)


def make_loss(center_rewards_coefficient=None):
    def compute_loss(model, inputs):
        rewards_chosen = model(input_ids=inputs["input_ids_chosen"],
                               attention_mask=inputs["attention_mask_chosen"]).logits
        rewards_rejected = model(input_ids=inputs["input_ids_rejected"],
                                 attention_mask=inputs["attention_mask_rejected"]).logits
        loss = -F.logsigmoid(rewards_chosen - rewards_rejected).mean()
        if center_rewards_coefficient is not None:
            loss = loss + center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)
        return loss
    return compute_loss


def _plan(run, variant):
    if run == "healthy":
        return 3, 1           # epochs, checkpoint epoch
    return 30, 20


def _build(run, seed, variant, steps_total):
    model = make_model(seed)
    lr = 1e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01 if variant == "weight_decay_0.01" else 0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps_total))
    return model, optimizer, scheduler


def _evaluate(model, batches):
    with torch.no_grad():
        loss_fn = make_loss()
        losses, correct, n = [], 0, 0
        for b in batches:
            losses.append(float(loss_fn(model, b)))
            rc = model(input_ids=b["input_ids_chosen"], attention_mask=b["attention_mask_chosen"]).logits
            rr = model(input_ids=b["input_ids_rejected"], attention_mask=b["attention_mask_rejected"]).logits
            correct += int((rc > rr).sum())
            n += len(rc)
    return sum(losses) / len(losses), correct / n


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    train_pairs, val_pairs = make_data(run, seed, variant)
    epochs, ckpt_epoch = _plan(run, variant)
    if variant == "more_data":
        epochs, ckpt_epoch = 3, 1      # about as many steps as the faulty run, over 8x the data
    steps_per_epoch = (len(train_pairs[0]) + BATCH - 1) // BATCH
    model, optimizer, scheduler = _build(run, seed, variant, epochs * steps_per_epoch)
    loss_fn = make_loss(0.01 if variant == "center_rewards" else None)
    val_batches = to_batches(val_pairs)
    log_history, losses, val_losses, step, ckpt = [], [], [], 0, None
    for epoch in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(len(train_pairs[0]), generator=torch.Generator().manual_seed(seed * 100 + epoch))
        for batch in to_batches(train_pairs, perm):
            loss = loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            losses.append(loss.item())
            log_history.append({"loss": round(loss.item(), 4), "learning_rate": scheduler.get_last_lr()[0],
                                "epoch": epoch, "step": step})
        model.eval()
        eval_loss, eval_acc = _evaluate(model, val_batches)
        val_losses.append(eval_loss)
        log_history.append({"eval_loss": eval_loss, "eval_accuracy": eval_acc, "epoch": epoch, "step": step})
        if epoch == ckpt_epoch:
            ckpt = out_dir / f"checkpoint-{step}"
            model.save_pretrained(ckpt)
            torch.save(optimizer.state_dict(), ckpt / "optimizer.pt")
            torch.save(scheduler.state_dict(), ckpt / "scheduler.pt")
            (ckpt / "trainer_state.json").write_text(json.dumps(
                {"global_step": step, "epoch": epoch, "max_steps": epochs * steps_per_epoch,
                 "log_history": log_history}, indent=1))
    n = steps_per_epoch
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=val_losses,
                   metrics={"train_last_epoch": sum(losses[-n:]) / n, "eval_min": min(val_losses),
                            "eval_min_epoch": val_losses.index(min(val_losses)) + 1, "eval_end": val_losses[-1],
                            "eval_acc": eval_acc},
                   history=ckpt / "trainer_state.json")


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["eval_end"] > 1.15 * m["eval_min"] and m["train_last_epoch"] < 0.7 * m["eval_end"]:
        return (f"eval_loss {m['eval_min']:.3f} at epoch {int(m['eval_min_epoch'])} -> {m['eval_end']:.3f} at the "
                f"end while train loss is {m['train_last_epoch']:.3f} (eval accuracy {m['eval_acc']:.2f})")
    if run == "healthy" and m["eval_end"] > 0.66:
        return f"healthy run failed to train: eval_loss {m['eval_end']:.3f}"
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    train_pairs, val_pairs = make_data(run, 0, None)
    epochs, ckpt_epoch = _plan(run, None)
    steps_per_epoch = (len(train_pairs[0]) + BATCH - 1) // BATCH
    model, optimizer, scheduler = _build(run, 0, None, epochs * steps_per_epoch)
    batches = []
    epoch = ckpt_epoch
    while len(batches) < 48:
        epoch += 1
        perm = torch.randperm(len(train_pairs[0]), generator=torch.Generator().manual_seed(epoch))
        batches += to_batches(train_pairs, perm)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=make_loss(), batches=batches,
                        val_batches=to_batches(val_pairs), scheduler=scheduler, grad_clip=1.0,
                        total_steps=epochs * steps_per_epoch)


def setup_healthy():
    return _setup("healthy")


def setup_small_set_many_epochs():
    return _setup("small_set_many_epochs")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", {k: round(x, 3) for k, x in tr.metrics.items()},
                      symptom(r, tr), [round(x, 2) for x in tr.val_losses])
