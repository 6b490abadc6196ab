"""A decoder's sigmoid handed to binary_cross_entropy_with_logits (the ninth round's Gumbel-softmax VAE): the
loss squashes probabilities again and can never score a pixel as likely wrong, so the run stalls. Its loss
(a sum over pixels, an autoencoder's input for its target) has no level a stall is read against, and no
candidate undid a squashing inside the loss: it was called healthy (low). The squashing is read before a
stall is called no symptom, as it is before healthy."""

import torch
import torch.nn.functional as F
from torch import nn

import triage


def binary_images(seed: int, n: int):
    """64-pixel binary "images": thresholded mixtures of a few smooth patterns."""
    patterns = torch.randn(5, 64, generator=torch.Generator().manual_seed(3)).cumsum(1)
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(n, 5, generator=g) @ patterns) > 0).float()


class AutoEncoder(nn.Module):
    """Returns its reconstruction and its code, as a VAE returns its posterior beside its decoding: the
    candidate that undoes the model's own squashing cannot reach a tuple's member."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
        self.decoder = nn.Sequential(nn.ReLU(), nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 64), nn.Sigmoid())

    def forward(self, x):
        code = self.encoder(x)
        return self.decoder(code), code


def factory(with_logits: bool):
    def loss_fn(model, batch):
        (x,) = batch
        recon, _ = model(x)  # a sigmoid's output
        if with_logits:  # the fault
            return F.binary_cross_entropy_with_logits(recon, x, reduction="sum") / len(x)
        return F.binary_cross_entropy(recon, x, reduction="sum") / len(x)

    def setup():
        torch.manual_seed(0)
        model = AutoEncoder()
        x = binary_images(0, 4096)
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=loss_fn,
                            batches=[(x[i:i + 100],) for i in range(0, 4000, 100)])
    return setup


def test_a_sigmoid_handed_to_bce_with_logits_in_a_stalled_autoencoder_is_wrong_loss(tmp_path):
    setup = factory(with_logits=True)
    run = setup()
    for step in range(400):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=400)
    report, _ = triage.run(setup, checkpoint, out=tmp_path / "report")
    assert (report.root_cause, report.confidence) == ("wrong_loss", "medium")
    assert report.path[-1] == "wrong_loss_squashed_twice_stalled"
