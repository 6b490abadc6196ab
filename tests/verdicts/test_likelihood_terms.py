"""A marked point process's likelihood (the eleventh round's RMTPP): the log-intensity of each event's type,
scored with nll_loss, less the integral of the intensities over the wait before it. Short waits make the
density of the times above 1 and the loss per event negative by nature; the nll_loss term alone, handed
log-intensities that no softmax normalises, would fall without bound, and the integral is what bounds it. Read
as nll_loss on unnormalised scores (a classifier's loss below zero), the healthy run was called wrong_loss."""

import torch
import torch.nn.functional as F
from torch import nn

import triage
from triage.experiments.loss_inputs import other_terms_gradient

TYPES, FEATURES, BATCH, EVENTS = 3, 8, 16, 8


def sequences(seed: int, batches: int) -> list[dict[str, torch.Tensor]]:
    """Sequences of EVENTS events, as a point process's batches hold them: each event's history features, its
    type (set by them) and the wait before it (an exponential whose rate, 10-40 a unit of time, they set too)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(FEATURES, TYPES, generator=torch.Generator().manual_seed(7))
    out = []
    for _ in range(batches):
        x = torch.randn(BATCH, EVENTS, FEATURES, generator=g)
        rates = 10 * torch.softmax(x @ w, -1) * (1 + 3 * torch.sigmoid(x[..., :1]))
        types = torch.multinomial((rates / rates.sum(-1, keepdim=True)).reshape(-1, TYPES), 1, generator=g)
        waits = -torch.log(torch.rand(BATCH, EVENTS, generator=g)) / rates.sum(-1)
        out.append({"history": x, "type_seqs": types.reshape(BATCH, EVENTS), "time_delta_seqs": waits})
    return out


def point_process_nll(model, batch):
    log_intensity = model(batch["history"])  # (B, L, types)
    event_term = F.nll_loss(log_intensity.permute(0, 2, 1), batch["type_seqs"])  # - log lambda_type, unnormalised
    integral = (log_intensity.exp().sum(-1) * batch["time_delta_seqs"]).mean()
    return event_term + integral


def setup() -> triage.Setup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, TYPES))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=point_process_nll, batches=sequences(0, 40), val_batches=sequences(1, 8))


def test_a_likelihood_whose_class_term_is_one_of_its_terms_is_not_a_wrong_loss(tmp_path):
    run = setup()
    for step in range(300):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, sequences(2 + step, 1)[0]).backward()
        run.optimizer.step()
    assert run.loss_fn(run.model, sequences(1, 1)[0]).item() < 0  # negative by nature
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=300)
    report = triage.run(setup, checkpoint, out=tmp_path / "report")[0]
    assert report.experiment("labels").outcome["other_terms_gradient"] > 0.1
    assert report.root_cause == "healthy", report.path


def test_the_class_terms_gradient_is_told_from_the_rest():
    run = setup()
    for step in range(100):  # until the loss per event is below zero, where the rule reads the figure
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    batch = run.batches[0]
    device = torch.device("cpu")
    assert run.loss_fn(run.model, batch).item() < 0 and other_terms_gradient(run, batch, device) > 0.1

    def raw_logits(m, b):  # nll_loss handed raw scores: below zero, and the class term alone
        return F.nll_loss(m(b["history"]).permute(0, 2, 1), b["type_seqs"])

    def with_setup(loss_fn):
        return triage.Setup(model=run.model, optimizer=run.optimizer, batches=run.batches, loss_fn=loss_fn)

    assert raw_logits(run.model, batch).item() < 0
    assert other_terms_gradient(with_setup(raw_logits), batch, device) == 0.0
    penalised = with_setup(lambda m, b: raw_logits(m, b) + 1e-4 * sum((q ** 2).sum() for q in m.parameters()))
    assert 0 < other_terms_gradient(penalised, batch, device) < 0.1  # a weight penalty is no likelihood's term
    log_probs = with_setup(lambda m, b: F.nll_loss(F.log_softmax(m(b["history"]), -1).permute(0, 2, 1),
                                                   b["type_seqs"]))
    assert other_terms_gradient(log_probs, batch, device) is None  # never below zero: not read
    unread = with_setup(lambda m, b: ((m(b["history"]) - 1) ** 2).mean() - 10)
    assert other_terms_gradient(unread, batch, device) is None  # below zero, but no class loss called
