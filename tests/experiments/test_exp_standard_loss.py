"""A fault inside loss_fn: the run trained on its own loss against the standard one, from the same start."""

import math
import weakref

import pytest
import torch
from torch import nn

import triage
from tests._instrument_runs import (classifier_setup, digits, run, session_of, train_and_triage,
                                   trained_checkpoint)
from triage.experiments.outputs import OUTPUT_CHECK
from triage.experiments.standard_loss import STANDARD_LOSS_SWAP, compare_at_checkpoint, standard_rule


def smoothed(model, batch):  # the typo: label_smoothing=0.9 for 0.1 leaves a nearly uniform target
    x, y = batch
    return nn.functional.cross_entropy(model(x), y, label_smoothing=0.9)


def _regression_batches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = x[:, 0] * 2 - x[:, 1] + 0.1 * torch.randn(512, generator=g)  # (B,) targets
    return [(x[i:i + 64], y[i:i + 64]) for i in range(0, 512, 64)]


def broadcast_mse(model, batch):  # the bug: (B, 1) - (B,) is (B, B): every row against every target
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def plain_mse(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x).squeeze(-1), y)


def regressor_setup(loss_fn, lr=0.05):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr), loss_fn=loss_fn,
                        batches=_regression_batches())


def test_the_standard_loss_is_the_runs_own_for_plain_cross_entropy_and_mse():
    out = run(OUTPUT_CHECK, session_of(classifier_setup))
    assert math.isclose(out.loss_vs_standard, 1.0, rel_tol=1e-5) and out.gradient_vs_standard < 1e-5
    out = run(OUTPUT_CHECK, session_of(lambda: regressor_setup(plain_mse)))
    assert out.standard_rule == "mse" and math.isclose(out.loss_vs_standard, 1.0, rel_tol=1e-5)
    assert out.gradient_vs_standard < 1e-5


def test_a_loss_of_the_runs_own_making_differs_from_the_standard_one():
    # Near a uniform output the smoothed loss has the plain one's value, but not its gradient.
    out = run(OUTPUT_CHECK, session_of(lambda: classifier_setup(loss_fn=smoothed)))
    assert out.standard_rule == "cross_entropy" and 0.95 < out.loss_vs_standard < 1.05
    assert out.gradient_vs_standard > 0.5
    out = run(OUTPUT_CHECK, session_of(lambda: regressor_setup(broadcast_mse)))
    assert out.standard_rule == "mse" and out.gradient_vs_standard > 0.5



def test_a_weighted_standard_loss_is_told_from_a_loss_of_its_own_making():
    """pos_weight in a multi-label BCE, class weights in a cross-entropy: the gradient is the standard one's times
    one weight per group (a column's positives, a class's rows), a choice and no wrong loss; label smoothing and a
    sigmoid before a logits loss are not (was: the standard loss, unweighted, trained better on its own scale than
    a healthy pos-weighted run, and the run was called wrong_loss)."""
    import torch.nn.functional as F

    weights = torch.linspace(0.5, 8, 10)
    multi_hot = [(x, F.one_hot(y, 10).float()) for x, y in digits(4)]

    def pos_weighted(model, batch):
        x, y = batch
        return F.binary_cross_entropy_with_logits(model(x), y, pos_weight=weights)

    def sigmoid_twice(model, batch):
        x, y = batch
        return F.binary_cross_entropy_with_logits(torch.sigmoid(model(x)), y)

    def class_weighted(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, weight=weights)
    for loss_fn, batches, weighting in ((pos_weighted, multi_hot, True), (class_weighted, digits(4), True),
                                        (sigmoid_twice, multi_hot, False), (smoothed, digits(4), False)):
        out = run(OUTPUT_CHECK, session_of(lambda: classifier_setup(batches=batches, loss_fn=loss_fn)))
        assert out.gradient_vs_standard > 0.05, loss_fn.__name__
        assert (out.weighting_spread < 0.05) is weighting, (loss_fn.__name__, out.weighting_spread)
    # A loss that sends the output no gradient, or the standard one's negated: no positive weight makes either.
    def detached(model, batch):
        x, y = batch
        return F.cross_entropy(model(x).detach(), y) + 0 * sum(p.sum() for p in model.parameters())

    def negated(model, batch):
        x, y = batch
        return -F.cross_entropy(model(x), y)
    for loss_fn in (detached, negated):
        out = run(OUTPUT_CHECK, session_of(lambda: classifier_setup(batches=digits(4), loss_fn=loss_fn)))
        assert out.weighting_spread == 1.0, (loss_fn.__name__, out.weighting_spread)

def test_trained_on_the_standard_loss_the_smoothed_run_learns_and_both_curves_share_its_unit():
    factory = lambda: classifier_setup(loss_fn=smoothed)  # noqa: E731
    session = session_of(factory, checkpoint=trained_checkpoint(factory, steps=60))
    out = run(STANDARD_LOSS_SWAP, session, steps=60)
    assert out.rule == "cross_entropy" and len(out.losses) == len(out.run_losses) == 60
    # the run as it was barely moves cross-entropy; trained on it, the same start goes well below it
    assert out.fix_works and out.improvement < 0.5 and out.sane_kind == "constant"
    assert out.loss_end < 0.5 * out.nothing_level
    assert out.run_losses[0] == pytest.approx(out.losses[0], rel=1e-5)  # the same start, the same first batch


def test_the_swap_does_not_verify_on_a_run_that_is_stuck_for_another_reason():
    # A legitimate smoothing of 0.1 at a learning rate far too low: the standard loss does not help.
    factory = lambda: classifier_setup(lr=1e-5, loss_fn=lambda m, b: nn.functional.cross_entropy(  # noqa: E731
        m(b[0]), b[1], label_smoothing=0.1))
    out = run(STANDARD_LOSS_SWAP, session_of(factory), steps=40)
    assert out.fix_works is False and not out.better


def test_the_swap_refuses_a_model_whose_output_pairs_with_no_target():
    factory = lambda: classifier_setup(batches=[(x,) for x, _ in digits(2)],  # noqa: E731
                                       loss_fn=lambda m, b: m(b[0]).pow(2).mean())
    with pytest.raises(ValueError, match="no standard loss"):
        run(STANDARD_LOSS_SWAP, session_of(factory))


@pytest.mark.parametrize("loss_fn, factory", [
    (smoothed, lambda loss: classifier_setup(loss_fn=loss)),
    (broadcast_mse, regressor_setup),
], ids=["label_smoothing_0.9", "broadcast_mse"])
def test_triage_names_the_wrong_loss_and_proves_the_standard_one(tmp_path, loss_fn, factory):
    report = train_and_triage(tmp_path, lambda: factory(loss_fn), steps=80)
    assert report.root_cause == "wrong_loss", report.path
    assert report.proof == "standard_loss"
    assert ("cross_entropy" if loss_fn is smoothed else "mse") in report.fix
    # the proof is drawn in the standard loss's unit, the run as it was beside it
    html = (tmp_path / "report" / "report.html").read_text()
    assert "both runs scored by the standard loss" in html and "the run as it was (its own loss)" in html


def test_a_converged_run_with_the_usual_label_smoothing_is_not_a_wrong_loss(tmp_path):
    # label_smoothing=0.1 floors the loss near a fifth of ln K: flat there, the run is done, even though
    # plain cross-entropy would go on sharpening its scores on the snapshot.
    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), batches=digits(8),
                            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1], label_smoothing=0.1))

    report = train_and_triage(tmp_path, make, steps=400)
    assert report.root_cause == "healthy", report.path


def test_a_double_softmax_inside_the_loss_is_named_even_once_the_model_is_right(tmp_path):
    # cross_entropy(softmax(scores)) floors at ln(e + 9) - 1 ~ 1.46 however right the model is: its own
    # loss is stuck at 0.6 of chance while the standard loss on the same outputs says it has learned.
    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3), batches=digits(8),
                            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]).softmax(-1), b[1]))

    report = train_and_triage(tmp_path, make, steps=400)
    assert report.root_cause == "wrong_loss", report.path
    outputs = next(e.outcome for e in report.experiments if e.node == "outputs")
    assert outputs["standard_level_ratio"] < 0.1 and outputs["loss_vs_standard"] > 5


class RemembersItsLastOutput(nn.Module):
    """An MLP that notes, at each forward, whether its previous forward's output is still alive: alive, that
    forward's graph (its activations, a training step's worth) is held beside the new one."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.last = None
        self.previous_alive: list[bool] = []

    def forward(self, x):
        self.previous_alive.append(self.last is not None and self.last() is not None)
        out = self.net(x)
        self.last = weakref.ref(out)
        return out


def test_comparing_the_losses_holds_one_forward_at_a_time():
    model = RemembersItsLastOutput()
    session = session_of(lambda: classifier_setup(model=model))
    rule = standard_rule(session)
    model.previous_alive.clear()
    compared = compare_at_checkpoint(session, rule)
    assert len(model.previous_alive) == 4 and compared.gradient_gap < 1e-5
    assert not any(model.previous_alive)
