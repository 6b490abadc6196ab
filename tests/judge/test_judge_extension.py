"""Whether a fix not verified after its steps deserves more (judge/extension.py), on figures alone."""

import math

from triage.judge.extension import BLOWN_UP, ReferenceFigures, worth_more_steps
from triage.judge.levels import LossLevels

LEVELS = LossLevels(kind="classification", num_classes=10, chance=math.log(10), constant=2.3)


def more(start, end, reference, levels=LEVELS):
    return worth_more_steps(start=start, end=end, reference=reference, levels=levels, margin=0.8, level_margin=0.9)


STALLED = ReferenceFigures(finite=True, loss_end=2.0, loss_ratio=0.99, level_ratio=0.87)


def test_a_fix_that_learns_where_the_run_stalled_gets_more_steps():
    assert more(2.0, 1.8, STALLED)  # down 10%, not yet clearly better than the run's 2.0


def test_a_fix_that_does_not_learn_or_already_works_gets_none():
    assert not more(2.0, 1.95, STALLED)  # down under 5%: it does not learn
    assert not more(2.0, 1.0, STALLED)  # already verified: nothing to extend
    assert not more(None, 1.0, STALLED) and not more(0.0, 1.0, STALLED)


def test_against_a_run_that_learns_a_slow_fix_is_not_extended():
    fell = ReferenceFigures(finite=True, loss_end=1.0, loss_ratio=0.6, level_ratio=0.43)
    assert not more(1.6, 1.4, fell)


def test_against_a_run_that_fell_only_to_chance_a_fix_learning_past_it_is_extended():
    to_chance = ReferenceFigures(finite=True, loss_end=2.2, loss_ratio=0.2, level_ratio=0.96)
    assert more(2.2, 1.9, to_chance)  # 0.83 of the loss of learning nothing: past it
    assert not more(2.4, 2.2, to_chance)  # still at chance itself


def test_a_fix_holding_at_chance_where_the_run_blew_up_is_extended():
    blown = ReferenceFigures(finite=True, loss_end=18.7, loss_ratio=1.0, level_ratio=18.7 / 2.3)
    assert blown.level_ratio > BLOWN_UP
    assert more(2.3, 2.29, blown)  # a restart at a sane LR, sitting at chance for its first steps
    assert not more(2.3, 2.5, blown)  # above the loss of learning nothing: not holding
