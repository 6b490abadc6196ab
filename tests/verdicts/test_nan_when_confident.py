"""A loss finite on a confident prediction whose gradient there is not (the seventh round's focal loss with
gamma 0.5: `(1 - p) ** 0.5` has an infinite derivative where p rounds to 1, and inf * 0 is NaN). Its replay
from a checkpoint taken before any example was that sure stays finite, and the run was called healthy; the
owner's run went to NaN a few dozen steps later, every time."""

import torch
import torch.nn.functional as F
from torch import nn

import triage
from tests._instrument_runs import session_of
from triage.experiments.confident import unstable_when_confident


def focal(gamma: float, eps: float = 0.0):
    def loss(model, batch):  # kaidic/LDAM-DRW's focal_loss on the per-example cross-entropy
        ce = F.cross_entropy(model(batch[0]), batch[1], reduction="none")
        p = torch.exp(-ce)
        return ((1 - p + eps) ** gamma * ce).mean()
    return loss


def sigmoid_focal(gamma: float):
    def loss(model, batch):  # torchvision.ops.sigmoid_focal_loss's form, on 0/1 targets
        logits, y = model(batch[0]).squeeze(-1), batch[1]
        p = torch.sigmoid(logits)
        ce = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
        p_t = p * y + (1 - p) * (1 - y)
        return (ce * (1 - p_t) ** gamma).mean()
    return loss


def classifier(loss_fn, outputs: int = 3, lr: float = 1e-3):
    def setup():
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, max(outputs, 2), (1024,), generator=g)
        x = torch.randn(max(outputs, 2), 12, generator=g)[y] * 2 + torch.randn(1024, 12, generator=g)
        target = y if outputs > 1 else y.float()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, outputs))
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                            loss_fn=loss_fn, batches=[(x[i:i + 64], target[i:i + 64]) for i in range(0, 1024, 64)])
    return setup


def unstable(setup):
    session = session_of(setup)
    kind = "classification" if session.setup.batches[0][1].dtype == torch.long else "binary"
    return unstable_when_confident(session.setup, session.batches[:2], kind, session.device)


def test_a_focal_loss_with_gamma_under_1_has_a_nan_gradient_once_p_rounds_to_1():
    found = unstable(classifier(focal(0.5)))
    assert found is not None and found.margin == 20.0  # at 10 logits p is still under 1 in fp32
    assert found.op == "PowBackward0" and "test_nan_when_confident.py" in found.source
    assert "** gamma" in found.line


def test_the_standard_losses_and_the_guarded_focal_loss_keep_a_finite_gradient():
    assert unstable(classifier(focal(2.0))) is None  # gamma 2: the derivative 2(1 - p) is 0 at p = 1
    assert unstable(classifier(focal(0.5, eps=1e-6))) is None  # kornia's fix
    assert unstable(classifier(lambda m, b: F.cross_entropy(m(b[0]), b[1]))) is None


def test_a_sigmoid_focal_loss_on_binary_targets_is_read_too():
    assert unstable(classifier(sigmoid_focal(0.5), outputs=1)).margin == 20.0
    assert unstable(classifier(sigmoid_focal(2.0), outputs=1)) is None


def test_a_run_whose_loss_turns_nan_when_confident_is_not_called_healthy(tmp_path):
    setup = classifier(focal(0.5))
    run = setup()
    for step in range(20):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
    checkpoint = triage.save_checkpoint(tmp_path / "ckpt.pt", run.model, run.optimizer, step=20)
    report, _ = triage.run(setup, checkpoint, out=tmp_path / "report")
    assert report.experiment("baseline").outcome["finite"]  # the replay reached no such margin
    assert report.root_cause == "numerical_instability" and report.confidence == "medium"
    assert report.location.op == "PowBackward0"


def test_a_model_that_outputs_probabilities_is_not_read_as_logits():
    """A softmax at the end of forward() and nll_loss on their log, a correct pairing: a "confident" one-hot
    swapped in as probabilities has log(0) in it, a gradient the run's own outputs never get (review,
    helper-27). output_check asks only where the output is logits."""
    from tests._instrument_runs import run as run_experiment
    from triage.experiments.outputs import OUTPUT_CHECK

    def probabilities():
        made = classifier(lambda m, b: F.nll_loss(torch.log(m(b[0])), b[1]))()
        made.model.append(nn.Softmax(-1))
        return made

    outcome = run_experiment(OUTPUT_CHECK, session_of(probabilities))
    assert outcome.looks_like_probabilities and outcome.unstable_margin is None
