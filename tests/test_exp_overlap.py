"""overlap_check: validation examples copied from the training batches are counted."""

import torch

from tests._instrument_runs import classifier_setup, digits, run, session_of
from triage.experiments.overlap import OVERLAP_CHECK


def _outcome(train, val):
    return run(OVERLAP_CHECK, session_of(lambda: classifier_setup(batches=train, val_batches=val)))


def test_half_of_val_copied_from_train_is_half_duplicates():
    train = digits(8)
    fresh = digits(2, offset=8 * 64)  # digits holds no duplicate image: these are new examples
    val = [(torch.cat([fresh[0][0][:32], train[5][0][:32]]), torch.cat([fresh[0][1][:32], train[5][1][:32]])),
           (torch.cat([train[2][0][32:], fresh[1][0][32:]]), torch.cat([train[2][1][32:], fresh[1][1][32:]]))]
    out = _outcome(train, val)
    assert out.has_val and out.val_examples == 128 and out.train_examples == 512
    assert out.duplicates == 64 and out.duplicate_fraction == 0.5
    assert out.first_duplicates[:3] == [32, 33, 34]


def test_copies_that_differ_below_the_rounding_still_count():
    train = digits(4)
    val = [(train[0][0] + 1e-9, train[0][1])]
    assert _outcome(train, val).duplicate_fraction == 1.0


def test_disjoint_train_and_val_have_no_duplicates():
    out = _outcome(digits(8), digits(4, offset=8 * 64))
    assert out.duplicates == 0 and out.duplicate_fraction == 0.0 and out.val_examples == 256


def test_without_val_batches_there_is_nothing_to_check():
    out = run(OVERLAP_CHECK, session_of(lambda: classifier_setup()))
    assert not out.has_val and out.val_examples == 0
