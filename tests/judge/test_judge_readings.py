"""The judge's readings of raw measurements, on figures alone: each threshold, on both sides."""

from triage.judge.readings import (CLASS_ORDERED, DEFAULT_SPREAD_TOLERANCE, FLOOR_BELOW_CONSTANT, SHIFT_AGREEMENT,
                                   class_ordered, has_floor, label_shift, same_init_scheme, scores_shifted)


def test_an_init_within_the_spread_tolerance_of_the_default_is_the_default_scheme():
    assert same_init_scheme([1.0, 0.97, 1.03])  # two draws of one scheme
    assert not same_init_scheme([1.0, 0.1])  # a 10x smaller init in one layer
    assert same_init_scheme([DEFAULT_SPREAD_TOLERANCE]) and not same_init_scheme([DEFAULT_SPREAD_TOLERANCE * 1.01])


def test_batches_with_few_classes_each_are_sorted_by_class():
    assert class_ordered(10, 0.15) and class_ordered(2, 0.5)
    assert not class_ordered(10, 0.95)  # shuffled
    assert not class_ordered(1, 0.1)  # one class: nothing to sort
    assert not class_ordered(10, None) and not class_ordered(10, CLASS_ORDERED)


def test_a_loss_has_a_floor_only_where_a_perfect_prediction_scores_well_under_a_constant_one():
    assert has_floor(constant=2.3, perfect=0.0)  # cross-entropy
    assert not has_floor(constant=1.0, perfect=0.9)  # "perfect" about as good as predicting the mean
    assert not has_floor(constant=None, perfect=0.0) and not has_floor(constant=1.0, perfect=None)
    assert not has_floor(constant=1.0, perfect=FLOOR_BELOW_CONSTANT)


def test_labels_are_the_inputs_moved_by_the_shift_that_accounts_for_nearly_all_of_them():
    assert label_shift([0.01, 1.0, 0.01]) == 1  # labels = input_ids[1:]
    assert label_shift([0.97, 0.02, 0.03]) == 0  # labels = input_ids, a document boundary or two aside
    assert label_shift([0.2, 0.0, 0.0]) is None  # tags, or a target sentence: labels of another kind
    assert label_shift([None, None, None]) is None  # nothing labelled
    assert label_shift([0.0, SHIFT_AGREEMENT, 0.0]) == 1 and label_shift([0.0, SHIFT_AGREEMENT - 0.01, 0.0]) is None


def test_a_loss_scores_the_label_it_equals_to_rounding_and_none_where_both_are_near():
    assert scores_shifted(2.3026, unshifted=2.9, shifted=2.30261) is True  # a causal LM's loss shifts inside
    assert scores_shifted(2.3026, unshifted=2.30259, shifted=2.9) is False  # a hand-written loop's does not
    assert scores_shifted(2.3026, unshifted=2.31, shifted=2.30262) is None  # both within 1%: not told apart
    assert scores_shifted(2.5, unshifted=2.9, shifted=2.3) is None  # neither: other terms, smoothing
