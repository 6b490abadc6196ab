"""Direct Preference Optimisation of a tiny causal LM against a frozen reference copy.

Follows TRL's DPOTrainer (huggingface/trl trl/trainer/dpo_trainer.py, read through the search tool; TRL itself is
not installed): batches are dicts of `prompt_input_ids`/`prompt_attention_mask`, `chosen_input_ids`/
`chosen_attention_mask` and `rejected_input_ids`/`rejected_attention_mask`; `concatenated_forward` stacks chosen
and rejected behind their prompt, masks the prompt and padding out of the completion mask, shifts logits/labels
by one and sums the per-token log-probabilities of each completion; the reference model's log-probs come from a
frozen copy under `torch.no_grad()`; the "sigmoid" loss is `-logsigmoid(beta * ((pi_c - ref_c) - (pi_r -
ref_r)))` with beta = 0.1; the Trainer's AdamW, `max_grad_norm=1.0` and a linear-decay schedule stepped every
optimizer step; checkpoints are Trainer folders (`checkpoint-N/` with `model.safetensors`, `optimizer.pt`,
`scheduler.pt`, `trainer_state.json` holding `global_step` and `log_history`). The policy is a 2-layer GPT-2 built
from a `GPT2Config` in code (no hub download). The preference data is synthetic: prompts of 4 tokens; the chosen
completion is the prompt's tokens sorted (2-4 of them) then EOS, the rejected one random tokens then EOS.

Runs
- healthy: learning_rate 2e-3 for this tiny from-scratch policy. The DPO loss starts at exactly ln 2 = 0.693 (policy
  == reference) and falls; checkpoint-60 of 150 while it still falls.
- default_lr: the user kept DPOConfig's default learning_rate=1e-6 (sized for fine-tuning multi-billion-parameter
  chat models) on this small model. The loss sits at 0.6931 and the reward margins stay ~0: the familiar "DPO loss
  stuck at 0.6931" report (e.g. Yifan-Song793/ETO#14 at learning_rate 5e-07, jingyaogong/minimind#674,
  hiyouga/LlamaFactory#5325). Root cause: lr_too_low (the fix is a larger LR). Competing fixes a user tries first:
  a larger beta (0.5: it scales the loss's logits but not how fast the log-ratios move under Adam) and turning the
  Trainer's gradient clipping off. The checkpoint is checkpoint-100, once the plateau shows.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="dpo_preference",
    kind="preference",
    original="huggingface/trl: trl/trainer/dpo_trainer.py (DPOTrainer, loss_type='sigmoid')",
    runs={
        "healthy": Run(cause="healthy", story="DPO of a tiny GPT-2 at lr 2e-3; the loss starts at ln 2 and "
                                              "falls; checkpoint-60 of 150."),
        "default_lr": Run(
            cause="lr_too_low",
            story="I kept DPOConfig's default learning_rate (1e-6); the DPO loss stays at 0.6931 and the "
                  "reward margins at zero.",
            fix="lr_2e-3",
            competing=("beta_0.5", "no_clip"),
        ),
    },
)

PAD, EOS = 0, 1
VOCAB = 16
PROMPT_LEN = 4
N_EXAMPLES = 640
BATCH = 16
MAX_STEPS = 150
BETA = 0.1


def make_dataset(seed: int):
    g = torch.Generator().manual_seed(5000 + seed)
    rows = []
    for _ in range(N_EXAMPLES):
        prompt = torch.randint(2, VOCAB, (PROMPT_LEN,), generator=g)
        n = int(torch.randint(2, PROMPT_LEN + 1, (1,), generator=g))
        chosen = torch.cat([prompt.sort().values[:n], torch.tensor([EOS])])
        m = int(torch.randint(2, PROMPT_LEN + 1, (1,), generator=g))
        rejected = torch.cat([torch.randint(2, VOCAB, (m,), generator=g), torch.tensor([EOS])])
        rows.append((prompt, chosen, rejected))
    return rows


def _pad(seqs, length):
    ids = torch.full((len(seqs), length), PAD, dtype=torch.long)
    mask = torch.zeros(len(seqs), length, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def collate(rows):
    p_ids, p_mask = _pad([r[0] for r in rows], PROMPT_LEN)
    c_ids, c_mask = _pad([r[1] for r in rows], PROMPT_LEN + 1)
    r_ids, r_mask = _pad([r[2] for r in rows], PROMPT_LEN + 1)
    return {"prompt_input_ids": p_ids, "prompt_attention_mask": p_mask,
            "chosen_input_ids": c_ids, "chosen_attention_mask": c_mask,
            "rejected_input_ids": r_ids, "rejected_attention_mask": r_mask}


def batch_stream(rows, seed, n_steps):
    out, epoch = [], 0
    while len(out) < n_steps:
        epoch += 1
        perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed * 100 + epoch)).tolist()
        out += [collate([rows[j] for j in perm[i:i + BATCH]]) for i in range(0, len(perm), BATCH)]
    return out[:n_steps]


def make_policy(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # DPOConfig.disable_dropout=True
    return GPT2LMHeadModel(config)


def concatenated_forward(model, batch):
    prompt_ids, prompt_mask = batch["prompt_input_ids"], batch["prompt_attention_mask"]
    completion_ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    completion_mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    prompt_ids, prompt_mask = prompt_ids.repeat(2, 1), prompt_mask.repeat(2, 1)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    loss_mask = torch.cat([torch.zeros_like(prompt_mask), completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits, labels, loss_mask = logits[:, :-1], input_ids[:, 1:], loss_mask[:, 1:].bool()
    labels = labels.masked_fill(~loss_mask, 0)
    per_token_logps = torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
    all_logps = (per_token_logps * loss_mask).sum(-1)
    n = batch["chosen_input_ids"].shape[0]
    return all_logps[:n], all_logps[n:]


def make_dpo_loss(ref_model, beta, metrics=None):
    def dpo_loss(model, batch):
        chosen_logps, rejected_logps = concatenated_forward(model, batch)
        with torch.no_grad():
            ref_chosen_logps, ref_rejected_logps = concatenated_forward(ref_model, batch)
        chosen_logratios = chosen_logps - ref_chosen_logps
        rejected_logratios = rejected_logps - ref_rejected_logps
        logits = chosen_logratios - rejected_logratios
        losses = -F.logsigmoid(beta * logits)
        if metrics is not None:
            metrics["rewards/margins"] = (beta * logits).mean().item()
        return losses.mean()
    return dpo_loss


def _build(run, seed, variant):
    model = make_policy(seed)
    ref_model = copy.deepcopy(model).eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    lr = 2e-3 if (run == "healthy" or variant == "lr_2e-3") else 1e-6
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (MAX_STEPS - s) / MAX_STEPS))
    beta = 0.5 if variant == "beta_0.5" else BETA
    return model, ref_model, optimizer, scheduler, beta


def _save(out_dir, step, model, optimizer, scheduler, log_history):
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = out_dir / f"checkpoint-{step}"
    model.save_pretrained(folder)
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": step, "max_steps": MAX_STEPS, "logging_steps": 1, "log_history": log_history}, indent=1))
    return folder


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    model, ref_model, optimizer, scheduler, beta = _build(run, seed, variant)
    stream = batch_stream(make_dataset(seed), seed, MAX_STEPS)
    metrics = {}
    loss_fn = make_dpo_loss(ref_model, beta, metrics)
    max_norm = None if variant == "no_clip" else 1.0
    save_at = 60 if run == "healthy" else 100
    losses, margins, log_history, ckpt = [], [], [], None
    model.train()
    for step, batch in enumerate(stream, start=1):
        loss = loss_fn(model, batch)
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        margins.append(metrics["rewards/margins"])
        log_history.append({"loss": round(loss.item(), 4), "learning_rate": scheduler.get_last_lr()[0],
                            "rewards/margins": metrics["rewards/margins"], "step": step})
        if step == save_at:
            ckpt = _save(out_dir, step, model, optimizer, scheduler, log_history)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"margin_end": sum(margins[-20:]) / 20, "beta": beta})


def symptom(run: str, trained: Trained) -> str | None:
    losses = trained.train_losses
    first, last = sum(losses[:10]) / 10, sum(losses[-20:]) / 20
    if run == "healthy":
        if last > 0.55:
            return f"healthy run failed to train: DPO loss {first:.4f} -> {last:.4f}"
        return None
    if last > 0.6:
        return (f"DPO loss stuck: {first:.4f} over the first 10 steps -> {last:.4f} over the last 20 of "
                f"{len(losses)}; rewards/margins {trained.metrics['margin_end']:.4f}")
    return None


def _setup(run):
    import triage

    torch.set_num_threads(1)
    model, ref_model, optimizer, scheduler, beta = _build(run, 0, None)
    stream = batch_stream(make_dataset(0), 0, MAX_STEPS)
    start = 60 if run == "healthy" else 100
    batches = stream[start:] + stream[:max(0, 48 - (MAX_STEPS - start))]
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=make_dpo_loss(ref_model, beta),
                        batches=batches, scheduler=scheduler, grad_clip=1.0, total_steps=MAX_STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_default_lr():
    return _setup("default_lr")


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    for r in PROGRAM.runs:
        for v in (None, PROGRAM.runs[r].fix, *PROGRAM.runs[r].competing):
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                tr = train(r, Path(d), 0, v)
                print(r, v, f"{time.perf_counter() - t0:.1f}s", tr.metrics, symptom(r, tr),
                      [round(x, 3) for x in tr.train_losses[::15]])
