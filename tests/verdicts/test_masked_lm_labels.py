"""A masked LM whose labels were cloned after the inputs were masked (issue 33, the sixth blind round): each
labelled place holds the token the model is handed there, mostly [MASK], so the loss falls fast by copying and
the model never learns to fill a masked place. It was called healthy; the same model with labels cloned first
stays healthy."""

import torch
import torch.nn.functional as F
from torch import nn

import triage

VOCAB, MASK, LENGTH, TOPICS = 40, 1, 16, 4


def sentences(seed: int, n: int) -> torch.Tensor:
    """Each sentence draws its words from one topic's eight, so a masked word is guessable from the rest."""
    g = torch.Generator().manual_seed(seed)
    topic = torch.randint(0, TOPICS, (n, 1), generator=g)
    return 2 + topic * 8 + torch.randint(0, 8, (n, LENGTH), generator=g)


def masked(ids: torch.Tensor, seed: int, labels_after_masking: bool) -> dict:
    """DataCollatorForLanguageModeling's 15%, of which 80% [MASK], 10% random, 10% kept; -100 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    picked = torch.rand(ids.shape, generator=g) < 0.15
    inputs, labels = ids.clone(), ids.clone()
    roll = torch.rand(ids.shape, generator=g)
    inputs[picked & (roll < 0.8)] = MASK
    swap = picked & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = torch.randint(2, VOCAB, (int(swap.sum()),), generator=g)
    if labels_after_masking:
        labels = inputs.clone()  # the bug: the labels cloned from the masked ids
    labels[~picked] = -100
    return {"input_ids": inputs, "labels": labels}


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.place = nn.Embedding(VOCAB, 32), nn.Parameter(torch.zeros(LENGTH, 32))
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.encoder, self.head = nn.TransformerEncoder(layer, 2), nn.Linear(32, VOCAB)

    def forward(self, input_ids):
        return self.head(self.encoder(self.embed(input_ids) + self.place))


def mlm_loss(model, batch):
    scores = model(batch["input_ids"])
    return F.cross_entropy(scores.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100)


def setup_of(labels_after_masking: bool):
    def setup():
        torch.manual_seed(0)
        model = TinyEncoder()
        train, val = sentences(0, 1536), sentences(1, 256)
        return triage.Setup(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loss_fn=mlm_loss,
                            batches=[masked(train[i:i + 32], i, labels_after_masking) for i in range(0, 1536, 32)],
                            val_batches=[masked(val[i:i + 32], 9000 + i, labels_after_masking)
                                         for i in range(0, 256, 32)])
    return setup


def trained(labels_after_masking: bool, tmp_path, steps: int = 150):
    setup = setup_of(labels_after_masking)()
    for step in range(steps):
        setup.optimizer.zero_grad()
        loss = setup.loss_fn(setup.model, setup.batches[step % len(setup.batches)])
        loss.backward()
        setup.optimizer.step()
    return triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, step=steps), float(loss)


def test_labels_cloned_after_masking_train_each_place_to_copy_its_input(tmp_path):
    checkpoint, loss = trained(True, tmp_path)
    assert loss < 0.5  # too good: a word guessed from its topic scores ln 8 = 2.1 at best
    report, _ = triage.run(setup_of(True), checkpoint, out=tmp_path / "report")
    assert (report.root_cause, report.confidence) == ("wrong_loss", "medium")
    assert report.path[-1] == "wrong_loss_labels_copy_input"
    labels = report.experiment("labels").outcome
    assert labels["label_shift"] == 0 and labels["majority_fraction"] > 0.7


def test_labels_cloned_before_masking_are_not_called_a_fault(tmp_path):
    checkpoint, loss = trained(False, tmp_path)
    assert loss > 1.5
    report, _ = triage.run(setup_of(False), checkpoint, out=tmp_path / "report")
    assert report.root_cause == "healthy"
    assert report.experiment("labels").outcome["label_shift"] is None
