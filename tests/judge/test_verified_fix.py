"""One definition of "the fix works": clearly better than the run as it was, and at a sane level."""

import math

import pytest
import torch
from torch import nn

import triage
from tests.tiny import blobs, context, judged_by_walk, mlp_setup
from triage.experiments.levels import loss_levels
from triage.experiments.replay import REPLAY, ReplayParams
from triage.experiments.verify import judged, paired_with
from triage.experiments.levels import LossLevels
from types import SimpleNamespace

CLASSIFIER = LossLevels(kind="classification", num_classes=3, chance=math.log(3), constant=1.0)


class _Run:
    def __init__(self, finite, loss_end, val_final=None):
        self.finite, self.loss_end, self.val_final = finite, loss_end, val_final


def verification(*, finite, loss_start, loss_end, reference, against, levels, val_end=None) -> dict:
    """As a counterfactual's outcome ends up: the pairing it measured (paired_with), the judge's reading of it."""
    paired = paired_with(reference=reference, against=against, levels=levels, val_end=val_end)
    unpaired = dict(levels=None, reference_end=None, reference_val=None, fix_val=None, val_neighbour_examples=None)
    own = SimpleNamespace(finite=finite, loss_start=loss_start, loss_end=loss_end, **{**unpaired, **paired})
    return {**paired, **judged(own)}


def verify(end, reference, finite=True, start=2.0, levels=CLASSIFIER, val=None):
    return verification(finite=finite, loss_start=start, loss_end=end, reference=reference, against="base",
                        levels=levels, val_end=val)


def test_a_fix_that_stays_finite_at_an_absurd_level_does_not_work():
    # the run blew up (NaN); the counterfactual stays finite but at 10^7 x the learned-nothing level
    out = verify(1e7, _Run(False, None))
    assert out["better"] and not out["sane"] and not out["fix_works"]


def test_a_fix_clearly_better_and_below_the_learned_nothing_level_works():
    out = verify(0.3, _Run(True, 1.0))
    assert out["fix_works"] and out["improvement"] == pytest.approx(0.3)
    assert out["sane_kind"] == "constant" and out["sane_level"] == pytest.approx(0.9)


def test_ending_at_the_learned_nothing_level_is_not_sane():
    # 0.95 is below the constant prediction's 1.0, but not clearly: a run that learned nothing sits there
    assert not verify(0.95, _Run(False, None))["fix_works"]


def test_a_fix_that_memorises_the_snapshot_is_none_where_validation_says_so():
    # A recommender at lr x10 (the real-programs benchmark's ncf_neumf, healthy): its training loss 0.10
    # against the run's 0.42 over 120 steps of a looped snapshot, its validation loss 0.57 against 0.42.
    out = verify(0.10, _Run(True, 0.42, val_final=0.42), val=0.57)
    assert out["better"] and out["sane"] and out["generalises"] is False and not out["fix_works"]
    assert out["fix_val"] == 0.57 and out["reference_val"] == 0.42


def test_a_fix_lower_on_validation_too_works_and_one_within_noise_of_it_does_not():
    assert verify(0.3, _Run(True, 1.0, val_final=1.0), val=0.6)["generalises"] is True
    # 1% of the loss of learning nothing (1.0 here) is the least a validation gain must be
    assert verify(0.3, _Run(True, 1.0, val_final=1.0), val=0.995)["generalises"] is False


def test_without_validation_data_a_fix_is_judged_on_its_training_loss_alone():
    out = verify(0.3, _Run(True, 1.0))
    assert out["generalises"] is None and out["fix_works"]
    # the run blew up: no validation figure of it to compare with, the fix stands on its own
    assert verify(0.3, _Run(False, None), val=0.5)["fix_works"]


def test_a_fix_only_a_little_better_than_the_run_is_not_clearly_better():
    out = verify(0.5, _Run(True, 0.55))
    assert out["sane"] and not out["better"] and not out["fix_works"]


def test_without_a_known_level_the_fix_must_end_below_its_own_start():
    unknown = LossLevels(kind="unknown")
    assert verify(1.0, _Run(True, 2.0), start=1.5, levels=unknown)["fix_works"]
    assert not verify(1.0, _Run(True, 2.0), start=0.8, levels=unknown)["fix_works"]



def test_without_a_known_level_a_fix_that_goes_below_zero_where_the_run_never_did_is_not_better():
    """A WGAN-GP critic's loss (no level, no floor) at 12.9 as the run was; the critic at lr x1000 drives its
    scores apart and ends at -13.6: lower, not better. Where the run itself ends below zero, lower counts."""
    unknown = LossLevels(kind="unknown")
    out = verify(-13.6, _Run(True, 12.9), start=5.9e5, levels=unknown)
    assert out["sane"] and not out["better"] and not out["fix_works"]
    assert verify(-3.0, _Run(True, -1.0), start=-0.5, levels=unknown)["fix_works"]
    # with a floor measured (a loss that may go below zero by its own terms), the floor is the judge
    assert verify(-0.5, _Run(True, 1.0), start=1.2, levels=LossLevels(kind="unknown", floor=-1.0))["fix_works"]

def test_a_counterfactual_that_is_not_paired_claims_nothing():
    assert verification(finite=True, loss_start=1, loss_end=0.1, reference=None, against=None,
                        levels=CLASSIFIER) == {}


def test_a_replay_that_spikes_once_and_recovers_still_verifies():
    """lr x0.1 on a run that diverges: one spike early, then it ends far below the run."""
    def spiky():
        s = mlp_setup(lr=0.05)
        batches = [(x.clone(), y) for x, y in s.batches]
        batches[1] = (batches[1][0] * 30, batches[1][1])  # one hard batch: a spike it recovers from
        return s.model_copy(update={"batches": batches})

    ctx = context(spiky)
    base = REPLAY.measure(ctx, ReplayParams(steps=30, lr_scale=40))
    ctx.outcomes["base"] = base
    ctx.restart()
    fixed = judged_by_walk(REPLAY.measure(ctx, ReplayParams(steps=30, against="base")))
    assert max(fixed.losses[:5]) > 2 * fixed.loss_end  # it did spike
    assert fixed.fix_works, (base.loss_end, fixed.loss_end, fixed.sane_level)


def test_the_learned_nothing_level_of_a_classifier_is_its_label_entropy():
    session = context(mlp_setup).session
    labels = torch.cat([y for _, y in session.batches])
    freq = torch.bincount(labels, minlength=3).double() + 1
    freq /= freq.sum()
    levels = loss_levels(session)
    assert levels.kind == "classification" and levels.chance == pytest.approx(math.log(3))
    assert levels.constant == pytest.approx(float(-(freq * freq.log()).sum()), rel=0.05)


def test_the_learned_nothing_level_of_a_regressor_is_the_target_variance():
    def regression():
        torch.manual_seed(0)
        x = torch.randn(128, 4)
        y = 3 + 2 * x[:, 0]
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                            loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]).squeeze(-1), b[1]),
                            batches=[(x[i:i + 32], y[i:i + 32]) for i in range(0, 128, 32)])

    session = context(regression).session
    y = torch.cat([b[1] for b in session.batches])
    levels = loss_levels(session)
    assert levels.kind == "regression"
    assert levels.constant == pytest.approx(float(y.var(unbiased=False)), rel=0.05)


def test_a_model_whose_output_is_not_one_tensor_is_judged_against_its_label_frequencies():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 3)

        def forward(self, x):
            return {"logits": self.lin(x)}

    def setup():
        model = Pair()
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), batches=blobs(),
                            loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0])["logits"], b[1]))

    levels = loss_levels(context(setup).session)
    # the constant is swapped in where the logits are made (the Linear): the label entropy, ~ln 3 on balanced blobs
    assert levels.chance == pytest.approx(math.log(3))
    assert levels.constant == pytest.approx(math.log(3), abs=0.01) and levels.constant <= levels.chance


def test_a_converged_runs_noise_is_not_a_fix():
    """A linear probe that had all but memorised its data (0.008 against ln 10 = 2.3): a candidate ending at
    0.0047 is 40% lower, by 0.1% of the loss of learning nothing, and is no fix (the blind suite's probe was
    called exploding_gradients, high, on that)."""
    levels = LossLevels(kind="classification", num_classes=10, chance=math.log(10), constant=2.3)
    reference = SimpleNamespace(finite=True, loss_end=0.008, steps_run=40)
    noise = verification(finite=True, loss_start=0.008, loss_end=0.0047, reference=reference, against="baseline",
                         levels=levels)
    assert noise["improvement"] < 0.8 and not noise["better"] and not noise["fix_works"]
    real = verification(finite=True, loss_start=0.9, loss_end=0.3,
                        reference=SimpleNamespace(finite=True, loss_end=0.9, steps_run=40), against="baseline",
                        levels=levels)
    assert real["better"] and real["fix_works"]


def test_where_labels_name_groups_a_clear_gain_in_validation_neighbours_is_a_fix_the_mined_loss_hides():
    """The held-back triplet run at lr x100 over 120 steps: its validation loss 0.187 against 0.138 (a miner's
    mean over the triplets still violating the margin rises as the embedding improves), while 95.7% of the
    distinct validation examples have a nearest neighbour of their label against 82.8%."""
    from triage.judge.fix import judge_fix

    grouped = LossLevels(kind="classification", num_classes=64, chance=math.log(64), constant=0.2)
    seen = dict(finite=True, loss_start=0.128, loss_end=0.0586, reference_end=0.127, levels=grouped,
                fix_val=0.187, reference_val=0.138, neighbour_examples=206)
    clear = judge_fix(**seen, fix_neighbours=0.957, reference_neighbours=0.828)
    assert clear.generalises is False and clear.neighbours_higher and clear.fix_works
    # a gain within three standard errors of the difference (about 0.09 here): no fix, the loss decides as before
    noisy = judge_fix(**seen, fix_neighbours=0.90, reference_neighbours=0.828)
    assert noisy.neighbours_higher is False and not noisy.fix_works
    assert judge_fix(**seen).neighbours_higher is None and not judge_fix(**seen).fix_works
