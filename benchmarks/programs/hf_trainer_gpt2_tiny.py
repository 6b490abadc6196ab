"""A tiny GPT-2 language model trained from scratch with the real Hugging Face `Trainer`.

Follows the transformers language-modeling recipe (`examples/pytorch/language-modeling/run_clm.py` and the
course chapter "Training a causal language model from scratch", read through the public source): a
`GPT2Config` model built in code (`GPT2LMHeadModel(config)`, no download; `lm_head` tied to `wte`), a
dataset of fixed-length blocks whose `labels` are the `input_ids` (the model shifts them), the stock
`default_data_collator`, `TrainingArguments(max_steps, learning_rate, warmup_steps, lr_scheduler_type
"cosine", weight_decay, logging_steps, save_steps, seed)` and `trainer.train()`, which writes
`checkpoint-N/` folders (model.safetensors, optimizer.pt, scheduler.pt, rng state, trainer_state.json with
the loss log). No tokenizer: the "text" is a sparse Markov chain over 48 token ids made in code.

Runs
- healthy: lr 3e-3 (a from-scratch LR for a model this small). `checkpoint-100` of a 200-step run is
  triaged while the loss still falls.
- lr_too_low: the user left `learning_rate` at the Trainer's default 5e-5, a fine-tuning LR, for a model
  trained from scratch; AdamW moves each weight by ~5e-5 a step and after 150 steps the loss has barely
  left ln(48) (the same complaint as "loss not decreasing with lr 5e-5 ... try 1e-3 / 1e-2" in
  OpenLMLab/LOMO issue #50 and many forum threads on from-scratch pretraining with Trainer defaults).
  Root cause `lr_too_low`. Fix `lr_from_scratch` (3e-3). Competing `no_grad_clip` (`max_grad_norm=0`:
  the Trainer clips at 1.0 by default, which users suspect of strangling the update), which leaves it.
  `checkpoint-150` of the 200-step run is triaged.
- label_bug: the user's dataset shifts the labels itself (`labels = input_ids[1:] + [-100]`, the habit of a
  hand-written next-token loop) while `GPT2LMHeadModel` shifts them again inside its forward, so the model
  is trained to predict the token after next. The loss stalls at the entropy of a two-step-ahead guess
  (~2.2 where next-token prediction reaches ~1.4). A known trap: huggingface/transformers PR #44642
  ("users who pre-shift their labels ... end up training next-next-token prediction by accident", fixing
  #32944), #562 (an example that shifted lm labels twice), InternLM/InternLM #318. Root cause `label_bug`:
  the labels are not the targets of these inputs; the fix is in the labels. Fix `labels_equal_inputs`
  (`labels = input_ids`). Competing `higher_lr` (3e-3 -> 1e-2), which reaches the same stall sooner.
  `checkpoint-150` of the 200-step run is triaged.
"""

from __future__ import annotations

import json
import math
import sys
from itertools import islice
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers import default_data_collator
from transformers.trainer_callback import PrinterCallback
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="hf_trainer_gpt2_tiny",
    kind="lm",
    original="huggingface/transformers examples/pytorch/language-modeling/run_clm.py (Trainer, GPT2 from scratch)",
    runs={
        "healthy": Run(cause="healthy", story="Tiny GPT-2 from scratch with Trainer at lr 3e-3; checkpoint-100 of 200."),
        "label_bug": Run(
            cause="label_bug",
            story="Built my own dataset with labels = input_ids shifted by one for GPT-2; the loss stalls at "
                  "~2.2 however long I train.",
            fix="labels_equal_inputs",
            competing=("higher_lr",),
        ),
        "lr_too_low": Run(
            cause="lr_too_low",
            story="Trained a tiny GPT-2 from scratch with the Trainer's default learning rate; 150 steps in, the "
                  "loss is still ~3.8 (ln 48 = 3.87).",
            fix="lr_from_scratch",
            competing=("no_grad_clip",),
        ),
    },
)

VOCAB, BLOCK = 48, 32


def make_stream(n, seed):
    g = torch.Generator().manual_seed(2024)
    succ = torch.randint(0, VOCAB, (VOCAB, 2), generator=g)
    gs = torch.Generator().manual_seed(seed)
    r = torch.rand(n, generator=gs)
    jumps = torch.randint(0, VOCAB, (n,), generator=gs)
    out = torch.empty(n, dtype=torch.long)
    w = 0
    for i in range(n):
        out[i] = w
        w = int(jumps[i]) if r[i] < 0.1 else int(succ[w, 0 if r[i] < 0.7 else 1])
    return out


class BlockDataset(torch.utils.data.Dataset):
    """run_clm's group_texts: the stream cut into blocks, labels = input_ids."""

    def __init__(self, stream, pre_shift=False):
        n = len(stream) // BLOCK
        self.blocks = stream[: n * BLOCK].view(n, BLOCK)
        self.pre_shift = pre_shift

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        ids = self.blocks[i]
        labels = torch.cat([ids[1:], torch.tensor([-100])]) if self.pre_shift else ids.clone()
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


class StopAt(TrainerCallback):
    """The run is triaged at this step (the rest of the planned run is not needed to make the checkpoint)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        if state.global_step >= self.step:
            control.should_training_stop = True


def hparams(run, variant):
    hp = dict(learning_rate=3e-3, max_grad_norm=1.0, max_steps=200, ckpt_step=100, save_steps=50, pre_shift=False)
    if run == "label_bug":
        hp.update(pre_shift=True, ckpt_step=150)
        if variant == "labels_equal_inputs":
            hp["pre_shift"] = False
        elif variant == "higher_lr":
            hp["learning_rate"] = 1e-2
    if run == "lr_too_low":
        hp.update(learning_rate=5e-5, ckpt_step=150)
        if variant == "lr_from_scratch":
            hp["learning_rate"] = 3e-3
        elif variant == "no_grad_clip":
            hp["max_grad_norm"] = 0.0
    return hp


def make_trainer(run, variant, out_dir, seed):
    hp = hparams(run, variant)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    train_ds = BlockDataset(make_stream(16 * BLOCK * 60, seed), hp["pre_shift"])
    eval_ds = BlockDataset(make_stream(BLOCK * 64, seed + 1000), hp["pre_shift"])
    args = TrainingArguments(
        output_dir=str(out_dir), max_steps=hp["max_steps"], per_device_train_batch_size=16,
        per_device_eval_batch_size=32, learning_rate=hp["learning_rate"], weight_decay=0.1,
        warmup_steps=10, lr_scheduler_type="cosine", max_grad_norm=hp["max_grad_norm"], logging_steps=10,
        save_strategy="steps", save_steps=hp["save_steps"], eval_strategy="no", seed=seed, data_seed=seed,
        report_to="none", disable_tqdm=True, use_cpu=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      data_collator=default_data_collator, callbacks=[StopAt(hp["ckpt_step"])])
    trainer.remove_callback(PrinterCallback)      # the loss log is in trainer_state.json
    return trainer, hp


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    out_dir = Path(out_dir)
    trainer, hp = make_trainer(run, variant, out_dir, seed)
    trainer.train()
    ckpt = out_dir / f"checkpoint-{hp['ckpt_step']}"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    return Trained(checkpoint=ckpt, train_losses=losses, metrics={"steps": state["global_step"]})


def symptom(run: str, trained: Trained) -> str | None:
    tl = trained.train_losses
    uniform = math.log(VOCAB)
    if run in ("label_bug", "healthy") and tl[-1] > 1.85:
        return (f"logged train loss {tl[0]:.3f} -> {tl[-1]:.3f} over {trained.metrics['steps']} steps, last five "
                f"logs {min(tl[-5:]):.2f}-{max(tl[-5:]):.2f} (next-token prediction on this data reaches ~1.4)")
    if tl[-1] > 0.85 * uniform:
        return (f"logged train loss {tl[0]:.3f} -> {tl[-1]:.3f} over {trained.metrics['steps']} steps "
                f"(ln {VOCAB} = {uniform:.3f}; the same model at lr 3e-3 is below 2.5 by step 100)")
    return None


def _setup(run: str):
    import tempfile

    import triage

    trainer, hp = make_trainer(run, None, Path(tempfile.mkdtemp(prefix="hf_trainer_setup_")), 0)
    trainer.create_optimizer_and_scheduler(num_training_steps=hp["max_steps"])
    batches = list(islice(trainer.get_train_dataloader(), 48))
    return triage.Setup(
        model=trainer.model,
        optimizer=trainer.optimizer,
        scheduler=trainer.lr_scheduler,
        loss_fn=lambda model, batch: model(**batch).loss,
        batches=batches,
        grad_clip=hp["max_grad_norm"],
        total_steps=hp["max_steps"],
    )


def setup_healthy():
    return _setup("healthy")


def setup_label_bug():
    return _setup("label_bug")


def setup_lr_too_low():
    return _setup("lr_too_low")
