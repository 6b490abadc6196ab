"""Labels shifted twice (issue 33, class 10): a causal LM that shifts its labels inside its forward, as Hugging
Face's *ForCausalLM do, given labels the dataset shifted already (labels = input_ids[1:] + [-100], the habit of
a hand-written next-token loop). Each output learns the token 2 places on: slower and noisier, nothing out of
range, and it was called healthy. The same model given labels = input_ids predicts the next token."""

import torch
from torch import nn

import triage
from tests._instrument_runs import run, session_of, trained_checkpoint
from triage.batches import replace_tensor
from triage.experiments.label_shift import realigned
from triage.experiments.labels import LABEL_CHECK

VOCAB, LENGTH = 16, 32


def stream(n: int, seed: int) -> torch.Tensor:
    """A Markov chain: each token is followed by its own successor 90% of the time, else by any token."""
    successor = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(seed)
    jumps, draws = torch.randint(0, VOCAB, (n,), generator=g), torch.rand(n, generator=g)
    out, token = torch.empty(n, dtype=torch.long), 0
    for i in range(n):
        out[i] = token
        token = int(jumps[i]) if draws[i] < 0.1 else int(successor[token])
    return out


def batches(pre_shift: bool, n: int = 12, size: int = 8, seed: int = 0) -> list[dict]:
    ids = stream(n * size * LENGTH, seed).view(n, size, LENGTH)
    out = []
    for block in ids:
        labels = torch.cat([block[:, 1:], torch.full((size, 1), -100)], 1) if pre_shift else block.clone()
        out.append({"input_ids": block, "labels": labels})
    return out


class TinyCausalLM(nn.Module):
    """Embedding, a GRU and a head; its forward scores the output at t against the label at t + 1."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.rnn, self.head = nn.Embedding(VOCAB, 32), nn.GRU(32, 32, batch_first=True), nn.Linear(32, VOCAB)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.rnn(self.embed(input_ids))[0])
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1),
                                               ignore_index=-100)
        return {"loss": loss, "logits": logits}


def lm_setup(pre_shift: bool):
    torch.manual_seed(0)
    model = TinyCausalLM()
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=lambda m, batch: m(**batch)["loss"], batches=batches(pre_shift))


def checkpoint_after(pre_shift: bool, path, steps: int = 120):
    s = lm_setup(pre_shift)
    for step in range(steps):
        s.optimizer.zero_grad()
        s.loss_fn(s.model, s.batches[step % len(s.batches)]).backward()
        s.optimizer.step()
    return triage.save_checkpoint(path, s.model, s.optimizer, step=steps)


def label_check_at(pre_shift: bool, steps: int):
    factory = lambda: lm_setup(pre_shift)  # noqa: E731
    return run(LABEL_CHECK, session_of(factory, trained_checkpoint(factory, steps)))


def test_label_check_measures_how_far_ahead_the_labels_make_the_model_predict():
    twice = label_check_at(pre_shift=True, steps=60)
    assert twice.label_shift == 1 and twice.model_shifts_labels is True and twice.predicts_ahead == 2
    assert twice.shift_agreements[1] == 1.0 and twice.shift_agreements[0] < 0.5
    once = label_check_at(pre_shift=False, steps=60)
    assert once.label_shift == 0 and once.model_shifts_labels is True and once.predicts_ahead == 1


def test_labels_moved_back_by_one_place_are_the_input_ids_the_model_shifts_itself():
    batch = batches(pre_shift=True, n=1)[0]
    moved = realigned(batch, "['labels']", ahead=2, ignore_index=-100)
    assert torch.equal(moved["labels"][:, 1:], batch["input_ids"][:, 1:]) and (moved["labels"][:, 0] == -100).all()
    assert moved["input_ids"] is batch["input_ids"] and not torch.equal(batch["labels"], moved["labels"])
    pair = (torch.zeros(2), (torch.ones(3), torch.ones(1)))
    swapped = replace_tensor(pair, "[1][0]", torch.full((3,), 5.0))
    assert swapped[1][0].tolist() == [5.0] * 3 and swapped[0] is pair[0] and swapped[1][1] is pair[1][1]


def test_labels_shifted_by_the_data_and_by_the_model_are_a_label_bug(tmp_path):
    checkpoint = checkpoint_after(True, tmp_path / "ckpt.pt")
    report, _ = triage.run(lambda: lm_setup(pre_shift=True), checkpoint, out=tmp_path / "report")
    assert report.root_cause == "label_bug"
    assert "labels_realigned" in report.path
    realigned = report.experiment("labels_realigned").outcome
    baseline = report.experiment("baseline").outcome
    # The labels moved back: the model, trained on the token 2 places on, learns the next one, and the
    # report says how far ahead it was trained to predict.
    assert realigned["loss_end"] < baseline["loss_end"]
    assert "2 places ahead" in report.fix


def test_labels_shifted_once_by_the_model_are_no_label_bug(tmp_path):
    checkpoint = checkpoint_after(False, tmp_path / "ckpt.pt")
    report, _ = triage.run(lambda: lm_setup(pre_shift=False), checkpoint, out=tmp_path / "report")
    assert report.root_cause != "label_bug"
    assert "labels_realigned" not in report.path
