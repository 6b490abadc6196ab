"""The fault-injection benchmark (benchmarks/suite/): its grid, split and CI sample, and the stock-PyTorch
validity check on real generated runs, including runs it must reject."""

import sys
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from suite import CAUSES, FAMILY_NAMES, HEALTHY, all_cases, build_case, sample_for_ci, split_of, validate  # noqa: E402
from suite.cache import CaseCache, source_hash  # noqa: E402
from suite.cases import Case, CaseSpec  # noqa: E402
from suite.faults import Fault, baseline, lr_too_low  # noqa: E402
from suite.axes import AXES  # noqa: E402
from suite.cases import blind_cases  # noqa: E402
from suite.loop import Knobs, train  # noqa: E402
from suite.runner import run_case  # noqa: E402
from suite.symptoms import DIVERGENCE, NO_LEARNING  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- the grid ---------------------------------------------------------------------------------------

def test_grid_spans_every_cause_family_optimizer_and_severity():
    specs = all_cases()
    assert len(specs) >= 330 and len(set(s.id for s in specs)) == len(specs)
    cells = defaultdict(set)
    for s in specs:
        cells[s.cause].add((s.family, s.optimizer, s.severity))
    assert set(cells) == set(CAUSES) | {HEALTHY}
    assert len(CAUSES) == 20 and len(FAMILY_NAMES) == 7
    for cause in CAUSES:
        assert cells[cause] == {(f, o, v) for f in FAMILY_NAMES for o in ("sgd", "adamw") for v in ("mild", "severe")}
    assert sum(s.cause == HEALTHY for s in specs) >= 30


def test_every_spec_builds_a_case_and_its_id_round_trips():
    for spec in all_cases():
        assert CaseSpec.from_id(spec.id) == spec
        case = build_case(spec)
        assert case.expected == spec.cause and case.story
        assert case.fault.faulty.family == spec.family and case.fault.faulty.optimizer == spec.optimizer


def test_split_is_deterministic_balanced_and_holds_out_two_families():
    specs = all_cases()
    first = {s.id: split_of(s) for s in specs}
    held_out = ("rnn", "binary_classifier")
    assert {s.id: split_of(s) for s in reversed(specs)} == first
    assert {first[s.id] for s in specs if s.family in held_out} == {"lofo"}
    assert "lofo" not in {first[s.id] for s in specs if s.family not in held_out}
    strata = defaultdict(Counter)
    for s in specs:
        if s.family not in held_out:
            strata[(s.cause, s.family)][first[s.id]] += 1
    for counts in strata.values():  # half tune, half heldout in every (cause, family)
        assert counts["tune"] == counts["heldout"]


def test_ci_sample_covers_every_cause_in_two_families():
    for pool in (all_cases(), [s for s in all_cases() if split_of(s) == "tune"]):
        sample = sample_for_ci(pool)
        families = defaultdict(set)
        for s in sample:
            families[s.cause].add(s.family)
        assert set(families) == set(CAUSES) | {HEALTHY}
        assert all(len(f) >= 2 for f in families.values())
        assert len({s.family for s in sample}) == len({s.family for s in pool})
        assert len(sample) <= 3 * len(families)


def test_ci_sample_passes_over_cases_the_check_excludes():
    passed_over = []

    def is_valid(spec):  # stands in for the cached stock check: rejects every mlp case and every SGD case
        ok = spec.family != "mlp" and spec.optimizer == "adamw"
        if not ok:
            passed_over.append(spec)
        return ok

    sample = sample_for_ci(all_cases(), is_valid=is_valid)
    assert passed_over and all(s.family != "mlp" and s.optimizer == "adamw" for s in sample)
    families = defaultdict(set)
    for s in sample:
        families[s.cause].add(s.family)
    assert set(families) == set(CAUSES) | {HEALTHY} and all(len(f) == 2 for f in families.values())


def test_setup_returns_fresh_seeded_objects():
    case = build_case(CaseSpec("dead_relu", "cnn_bn", "adamw", "mild"))
    a, b = case.setup(), case.setup()
    assert a.model is not b.model and a.optimizer is not b.optimizer
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    assert all(torch.equal(x, y) for batch_a, batch_b in zip(a.batches, b.batches) for x, y in zip(batch_a, batch_b))
    fixed = case.fixed_setup()
    assert not torch.equal(dict(fixed.model.named_parameters())["neck.0.bias"],
                           dict(a.model.named_parameters())["neck.0.bias"])


# --- the stock check --------------------------------------------------------------------------------

@pytest.mark.parametrize("case_id, symptom", [
    ("lr_too_high-mlp-sgd-severe-0", DIVERGENCE),
    ("fp16_overflow-cnn_bn-adamw-severe-0", DIVERGENCE),
    ("frozen_parameters-tabular_regressor-adamw-mild-0", NO_LEARNING),
    ("lr_schedule_decayed-resnet-sgd-severe-0", NO_LEARNING),
    ("nonfinite_data-rnn-sgd-mild-0", DIVERGENCE),
])
def test_stock_check_certifies_real_faults(case_id, symptom):
    verdict = validate(build_case(CaseSpec.from_id(case_id)))
    assert verdict.ok, verdict.reason
    assert verdict.symptom == symptom and symptom in verdict.faulty.symptoms
    assert verdict.fix.removes and symptom not in verdict.fix.symptoms
    assert verdict.faulty.nonfinite or verdict.fix.end < 0.8 * verdict.faulty.end
    assert verdict.competitors and not any(c.removes for c in verdict.competitors)


def test_stock_check_passes_a_healthy_run():
    verdict = validate(build_case(CaseSpec("healthy", "mlp", "sgd", "mild", 0)))
    assert verdict.ok, verdict.reason
    assert verdict.faulty.symptoms == () and verdict.faulty.end < 0.5 * verdict.faulty.start


def test_stock_check_rejects_a_healthy_run_labelled_lr_too_high():
    base = baseline("mlp", "sgd")
    mislabelled = Fault("lr_too_high", base, replace(base, lr=base.lr / 10), (DIVERGENCE,), "knobs",
                        "a healthy run, mislabelled", Knobs(lr_scale=0.1))
    verdict = validate(Case(CaseSpec("lr_too_high", "mlp", "sgd", "mild"), mislabelled))
    assert not verdict.ok and verdict.reason.startswith("symptom did not reproduce")


def test_stock_check_rejects_a_fix_that_does_not_fix():
    fault = lr_too_low(baseline("mlp", "sgd"), "severe")
    wrong_fix = replace(fault, cause="clipping_too_aggressive", fix_knobs=Knobs(clip=None))  # there is no clip
    verdict = validate(Case(CaseSpec("clipping_too_aggressive", "mlp", "sgd", "severe"), wrong_fix))
    assert not verdict.ok and verdict.reason.startswith("the named fix does not remove")


def test_stock_check_rejects_a_case_a_competing_fix_also_explains():
    # An LR 30x too low, labelled as dead units: its named fix (the LR x30) works, but so does lr x10
    # (lr_too_low's fix), so the label is ambiguous.
    base = baseline("mlp", "sgd")
    faulty = replace(base, lr=base.lr / 30, checkpoint_step=20)
    ambiguous = Fault("dead_relu", faulty, replace(faulty, lr=base.lr), (NO_LEARNING,), "knobs",
                      "an LR too low, labelled as dead units", Knobs(lr_scale=30.0))
    verdict = validate(Case(CaseSpec("dead_relu", "mlp", "sgd", "mild"), ambiguous))
    assert not verdict.ok and "competing fix (lr x10, for lr_too_low)" in verdict.reason


# --- the blind axes and kinds (issues 20/21): held out, selectable, certified by the same check --------

def test_blind_cases_are_held_out_of_the_tuned_grid_and_the_ci_sample():
    blind = blind_cases()
    ids = {s.id for s in blind}
    assert len(ids) == len(blind) and not ids & {s.id for s in all_cases()}
    assert all(CaseSpec.from_id(s.id) == s and split_of(s) == "blind" for s in blind)
    assert {s.axis for s in blind} == set(AXES)
    assert all(s.axis == "" and split_of(s) != "blind" for s in all_cases())
    tune = [s for s in all_cases() if split_of(s) == "tune"]
    assert not {s.id for s in sample_for_ci(tune)} & ids
    for axis in AXES:  # every axis has healthy runs and faults
        assert {s.cause == HEALTHY for s in blind if s.axis == axis} == {True, False}


@pytest.mark.parametrize("case_id, symptom", [
    ("healthy-mlp+sched_plateau-adamw-mild-0", "none"),
    ("lr_too_high-mlp+sched_onecycle-sgd-severe-0", DIVERGENCE),
    ("healthy-tabular_regressor+probe_opt-adamw-mild-0", "none"),
    ("fp16_overflow-tabular_regressor+raw_fp16-sgd-mild-0", DIVERGENCE),
    ("lr_too_low-multilabel-sgd-mild-0", NO_LEARNING),
    ("healthy-self_loss_lm-adamw-mild-0", "none"),
    ("healthy-mlp+loop_lbfgs-lbfgs-mild-0", "none"),
    ("healthy-mlp+loop_epoch_sched-sgd-mild-0", "none"),
])
def test_stock_check_certifies_blind_cases(case_id, symptom):
    verdict = validate(build_case(CaseSpec.from_id(case_id)))
    assert verdict.ok, verdict.reason
    assert verdict.symptom == symptom


def test_the_suite_loop_steps_plateau_and_per_epoch_schedules_as_a_run_does():
    plateau = build_case(CaseSpec.from_id("frozen_parameters-mlp+sched_plateau-sgd-mild-0")).setup()
    train(plateau, 40)  # a frozen run plateaus: ReduceLROnPlateau, fed the loss, halves the LR
    assert plateau.optimizer.param_groups[0]["lr"] < 0.5 * baseline("mlp", "sgd").lr
    epoch = build_case(CaseSpec.from_id("healthy-mlp+loop_epoch_sched-sgd-mild-0")).setup()
    train(epoch, 2 * len(epoch.batches))  # two passes over the batches: two StepLR(0.7) steps, not 24
    assert epoch.optimizer.param_groups[0]["lr"] == pytest.approx(baseline("mlp", "sgd").lr * 0.7 ** 2)


def test_frozen_by_design_probe_trains_only_its_head():
    rg = build_case(CaseSpec.from_id("healthy-mlp+probe_rg-sgd-mild-0")).setup()
    assert [n for n, p in rg.model.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    opt = build_case(CaseSpec.from_id("healthy-mlp+probe_opt-sgd-mild-0")).setup()
    held = {id(p) for g in opt.optimizer.param_groups for p in g["params"]}
    assert held == {id(p) for p in opt.model.head.parameters()}
    assert all(p.requires_grad for p in opt.model.parameters())


def test_peft_family_is_a_lora_model_with_the_base_frozen():
    pytest.importorskip("peft")
    setup = build_case(CaseSpec.from_id("healthy-peft_lm-adamw-mild-0")).setup()
    trainable = [n for n, p in setup.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert float(setup.loss_fn(setup.model, setup.batches[0])) > 0


# --- cache and runner -------------------------------------------------------------------------------

def test_cache_reuses_the_verdict_and_checkpoint(tmp_path):
    case = build_case(CaseSpec("label_bug", "tabular_regressor", "sgd", "severe"))
    cache = CaseCache(tmp_path)
    first, path, cached = cache.validity(case)
    assert not cached and path.exists() and first.ok, first.reason
    again, path_again, cached = cache.validity(case)
    assert cached and path_again == path and again == first
    assert source_hash() == source_hash() and cache.folder.name == source_hash()


def test_runner_triages_a_valid_case_in_process(tmp_path):
    result = run_case(("lr_too_high-mlp-sgd-severe-0", str(tmp_path / "cache"), str(tmp_path / "reports"), True, True))
    assert result.valid and result.error is None, result.error
    assert result.predicted and result.confidence in {"high", "medium", "low"} and result.seconds > 0
    assert (Path(result.report) / "report.json").exists()
    excluded = run_case(("exploding_gradients-mlp-adamw-mild-0", str(tmp_path / "cache"), None, True, True))
    assert not excluded.valid and excluded.predicted is None and excluded.validity.reason


# --- triage on a sample of the suite (regression guard; the measurement is `benchmarks/suite.py`) ----

# Every cause (and healthy) in two model families, tune-split cases only: the quickest of each
# cause to triage in a family not already there, from a run where triage named each right (a guard
# against regressions, not an accuracy figure; `exploding_gradients` has no certified tune case).
CI_CASES = [
    "bad_batch-tabular_regressor-sgd-severe-0", "bad_batch-transformer_lm-sgd-severe-0",
    "bad_initialization-mlp-adamw-mild-0", "bad_initialization-tabular_regressor-sgd-severe-0",
    "clipping_too_aggressive-tabular_regressor-sgd-severe-0", "clipping_too_aggressive-mlp-sgd-severe-0",
    "dead_relu-tabular_regressor-sgd-severe-0", "dead_relu-mlp-adamw-mild-0",
    "fp16_overflow-mlp-adamw-severe-0", "fp16_overflow-tabular_regressor-sgd-mild-0",
    "frozen_parameters-mlp-sgd-mild-0", "frozen_parameters-resnet-adamw-mild-0",
    "healthy-tabular_regressor-adamw-severe-1", "healthy-resnet-adamw-severe-0",
    "label_bug-cnn_bn-adamw-mild-0", "label_bug-tabular_regressor-sgd-severe-0",
    "loop_bug-mlp-adamw-severe-0", "loop_bug-resnet-adamw-mild-0",
    "lr_schedule_decayed-mlp-adamw-mild-0", "lr_schedule_decayed-tabular_regressor-sgd-mild-0",
    "lr_too_high-mlp-sgd-severe-0", "lr_too_high-tabular_regressor-adamw-mild-0",
    "lr_too_low-tabular_regressor-sgd-severe-0", "lr_too_low-mlp-sgd-severe-0",
    "no_gradient_flow-tabular_regressor-adamw-severe-0", "no_gradient_flow-mlp-sgd-severe-0",
    "nonfinite_data-tabular_regressor-sgd-mild-0", "nonfinite_data-resnet-sgd-mild-0",
    "numerical_instability-cnn_bn-sgd-severe-0", "numerical_instability-tabular_regressor-sgd-severe-0",
    "overfitting-tabular_regressor-sgd-mild-0", "overfitting-mlp-adamw-severe-0",
    "train_val_overlap-mlp-sgd-severe-0", "train_val_overlap-cnn_bn-sgd-severe-0",
    "vanishing_gradients-resnet-sgd-mild-0", "vanishing_gradients-tabular_regressor-sgd-mild-0",
    "weight_decay_too_high-mlp-sgd-severe-0", "weight_decay_too_high-tabular_regressor-sgd-mild-0",
    "wrong_loss-tabular_regressor-sgd-mild-0", "wrong_loss-mlp-sgd-severe-0",
]


def test_the_ci_sample_holds_every_cause_in_two_families():
    families = defaultdict(set)
    for case_id in CI_CASES:
        spec = CaseSpec.from_id(case_id)
        assert split_of(spec) == "tune"
        families[spec.cause].add(spec.family)
    assert set(families) == (set(CAUSES) | {HEALTHY}) - {"exploding_gradients"}
    assert all(len(f) >= 2 for f in families.values())


@pytest.mark.parametrize("case_id", CI_CASES)
def test_triage_names_the_injected_cause(case_id, tmp_path):
    result = run_case((case_id, str(tmp_path / "cache"), None, True, True))
    assert result.split == "tune" and result.valid, result.validity.reason
    assert result.error is None, result.error
    assert result.predicted == result.expected, (result.predicted, result.confidence, result.path)
