"""Tiny Hugging Face runs built in code (no download): token datasets, GPT-2 / T5 / Llama configs, a Trainer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")

VOCAB, SEQ = 64, 16


class TokenDataset(torch.utils.data.Dataset):
    """Sequences that repeat a short random motif: a 1-layer LM learns them within a few dozen steps."""

    def __init__(self, n: int = 128, seed: int = 0, seq2seq: bool = False):
        g = torch.Generator().manual_seed(seed)
        motif = torch.randint(1, VOCAB, (n, 4), generator=g)
        self.x = motif.repeat(1, SEQ // 4)  # (n, SEQ)
        self.seq2seq = seq2seq

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def gpt2(tie: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                                     tie_word_embeddings=tie)
    return transformers.GPT2LMHeadModel(config)


def t5(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                   num_decoder_layers=1, num_heads=2, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config)


def llama(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ,
                                      tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config)


def training_args(out: Path, **overrides) -> "transformers.TrainingArguments":
    settings = dict(output_dir=str(out), per_device_train_batch_size=8, logging_steps=1, report_to=[],
                    use_cpu=True, disable_tqdm=True, learning_rate=1e-3, save_strategy="no", seed=0,
                    dataloader_num_workers=0)
    settings.update(overrides)
    return transformers.TrainingArguments(**settings)


def train_and_save(model, out: Path, steps: int = 2) -> Path:
    """Train `steps` steps with the real Trainer and return the checkpoint-N folder it saved."""
    args = training_args(out, max_steps=steps, save_strategy="steps", save_steps=steps)
    transformers.Trainer(model=model, args=args, train_dataset=TokenDataset()).train()
    return out / f"checkpoint-{steps}"


def trainer_out() -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"triage-hf-tiny-{os.getpid()}"  # one per test worker


def diverging_trainer() -> "transformers.Trainer":
    """GPT-2 whose learning rate is 2.0 (a typo for 2e-3) after 30 warmup steps: past an LR of ~0.3 the loss
    climbs from chance (3.9) to 10-100 and the recorder's spike trigger fires at ~22. (0.5 once spiked too;
    under transformers 5.x the loss only wanders 4-5 there, a rise the noise hides.)"""
    args = training_args(trainer_out(), max_steps=150, learning_rate=2.0, warmup_steps=30,
                         lr_scheduler_type="constant_with_warmup", logging_steps=10)
    return transformers.Trainer(model=gpt2(), args=args, train_dataset=TokenDataset(n=256))


def healthy_trainer() -> "transformers.Trainer":
    """The same GPT-2 at lr 1e-3 with an eval set: what a user's make_trainer() returns."""
    args = training_args(trainer_out(), max_steps=40, learning_rate=1e-3, logging_steps=5)
    return transformers.Trainer(model=gpt2(), args=args, train_dataset=TokenDataset(n=256),
                                eval_dataset=TokenDataset(n=32, seed=1))
