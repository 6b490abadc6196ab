"""The judge's readings of raw measurements, on figures alone: each threshold, on both sides."""

from triage.judge.readings import (CLASS_ORDERED, DEFAULT_SPREAD_TOLERANCE, FLOOR_BELOW_CONSTANT, class_ordered,
                                   has_floor, same_init_scheme)


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
