"""batch_scan: a batch that stands out is named by index; clean or identical batches flag none."""

import pytest

from tests._instrument_runs import classifier_setup, digits, run, session_of
from triage.experiments.batch_scan import BATCH_SCAN


def test_a_batch_scaled_1000x_is_flagged_by_index():
    batches = digits(8)
    batches[3] = (batches[3][0] * 1000, batches[3][1])
    out = run(BATCH_SCAN, session_of(lambda: classifier_setup(batches=batches)))
    assert out.outliers == [3]
    assert out.outlier_count == 1 and out.worst_batch == 3
    assert out.worst_z > 6
    assert len(out.losses) == len(out.grad_norms) == 8


def test_clean_batches_have_no_outlier():
    out = run(BATCH_SCAN, session_of(lambda: classifier_setup(batches=digits(8))))
    assert out.outliers == [] and out.outlier_count == 0
    assert out.worst_z < 6


def test_identical_batches_have_no_outlier():
    # A MAD of zero would turn the smallest rounding difference into an infinite z: the floor prevents it.
    batch = digits(1)[0]
    out = run(BATCH_SCAN, session_of(lambda: classifier_setup(batches=[batch] * 6)))
    assert out.outliers == []


def test_a_batch_with_a_non_finite_loss_is_reported_apart_from_the_outliers():
    batches = digits(6)
    batches[2] = (batches[2][0] * float("nan"), batches[2][1])
    out = run(BATCH_SCAN, session_of(lambda: classifier_setup(batches=batches)))
    assert out.nonfinite_batches == [2] and out.nonfinite_count == 1 and out.outliers == []
    assert out.worst_batch == 2 and out.worst_z == float("inf")
    assert max(z for i, z in enumerate(out.z_loss) if i != 2) < 6  # the others are scored among themselves


def test_the_outlying_batch_names_the_tensor_whose_scale_stands_out_and_its_largest_value():
    batches = digits(8)
    batches[3] = (batches[3][0] * 1000, batches[3][1])
    out = run(BATCH_SCAN, session_of(lambda: classifier_setup(batches=batches)))
    x = batches[3][0]
    assert out.worst_tensor == "[0]" and out.worst_tensor_z > 6  # the inputs, not the labels
    assert out.worst_value == x[tuple(out.worst_value_index)].item() and abs(out.worst_value) == x.abs().max().item()
    others = sorted(b[0].abs().max().item() for i, b in enumerate(batches))
    assert out.typical_value == pytest.approx((others[3] + others[4]) / 2)
    assert out.worst_sample_id is None  # tuple batches carry no dataset indices


def test_without_an_outlier_no_tensor_is_named():
    out = run(BATCH_SCAN, session_of(lambda: classifier_setup(batches=digits(8))))
    assert out.outliers == [] and out.worst_tensor is None and out.worst_value is None
