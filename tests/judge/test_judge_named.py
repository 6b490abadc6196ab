"""The judge's named rules (judge/named.py) decided on figures alone, at each side of their thresholds, with an
unknown figure leaving them unknown where it could settle them (never a fault by default)."""

import math

import pytest

from triage.judge import named
from triage.walk.playbook.conditions import parse_condition


def decide(call: str, figures: dict):
    """The rule's answer on these figures of node `n` (and `i`): True, False, or None (unknown)."""
    return parse_condition(call).value(lambda node, field: figures[(node, field)])


def init(ratio=1.2, vs_nothing=1.1, growth=3.0, default=False):
    return {("i", "setup_init_ratio"): ratio, ("i", "setup_init_vs_nothing"): vs_nothing,
            ("i", "activation_std_growth_setup"): growth, ("i", "setup_init_is_default"): default}


@pytest.mark.parametrize("figures, abnormal", [
    (init(), False),
    (init(ratio=named.INIT_START_RATIO * 1.01), True),
    (init(vs_nothing=named.INIT_START_RATIO * 1.01), True),
    (init(growth=named.INIT_ACTIVATION_GROWTH * 1.01), True),
    (init(growth=named.INIT_ACTIVATION_GROWTH * 0.99), False),
])
def test_init_abnormal_reads_the_start_and_the_growth_with_depth(figures, abnormal):
    assert decide("init_abnormal(i)", figures) is abnormal


def test_bad_init_is_an_abnormal_init_that_is_not_pytorchs_default():
    assert decide("bad_init(i)", init(ratio=5.0)) is True
    assert decide("bad_init(i)", init(ratio=5.0, default=True)) is False  # the inputs make the start abnormal
    assert decide("bad_init(i)", init(ratio=5.0, default=None)) is None  # not known to be custom: unknown


@pytest.mark.parametrize("mean, worst, dead", [(0.1, 0.3, False), (0.51, 0.6, True), (0.2, 0.91, True),
                                               (None, 0.95, True), (None, 0.5, None)])
def test_dead_units_is_half_on_average_or_nearly_all_of_one_layer(mean, worst, dead):
    figures = {("n", "mean_dead_fraction"): mean, ("n", "max_dead_fraction"): worst}
    assert decide("dead_units(n)", figures) is dead


@pytest.mark.parametrize("share, duplicates, few", [(0.0, False, True), (0.11, True, False), (0.1, False, True),
                                                    (None, None, True)])
def test_duplicates_over_a_tenth_of_validation_and_unknown_counts_as_few(share, duplicates, few):
    figures = {("n", "duplicate_fraction"): share}
    assert decide("duplicates_validation(n)", figures) is duplicates
    assert decide("few_duplicates(n)", figures) is few


def test_schedule_decayed_needs_a_scheduler_past_its_peak_under_a_hundredth_of_it():
    figures = {("n", "has_scheduler"): True, ("n", "past_peak"): True, ("n", "lr_now_ratio"): 0.005}
    assert decide("schedule_decayed(n)", figures) is True
    assert decide("schedule_decayed(n)", {**figures, ("n", "past_peak"): False}) is False  # still warming up
    assert decide("schedule_decayed(n)", {**figures, ("n", "lr_now_ratio"): 0.02}) is False


@pytest.mark.parametrize("ratio, vanishing", [(0.005, True), (0.02, False), (0.0, False), (None, None)])
def test_vanishing_is_two_orders_lost_but_not_none_at_all(ratio, vanishing):
    assert decide("vanishing(n)", {("n", "early_late_ratio"): ratio}) is vanishing


def test_weights_shrank_over_the_replay_or_since_the_init():
    figures = {("n", "weight_norm_ratio"): 0.95, ("i", "weight_norm_vs_init"): 0.9}
    assert decide("weights_shrank(n, i)", figures) is False
    assert decide("weights_shrank(n, i)", {**figures, ("n", "weight_norm_ratio"): 0.7}) is True
    assert decide("weights_shrank(n, i)", {**figures, ("i", "weight_norm_vs_init"): 0.4}) is True


@pytest.mark.parametrize("ratio, flat, learns, memorises", [(0.95, True, False, False), (0.85, False, True, False),
                                                             (0.4, False, True, True)])
def test_flat_learns_and_memorises_read_the_loss_ratio(ratio, flat, learns, memorises):
    figures = {("n", "loss_ratio"): ratio, ("n", "finite"): True, ("n", "level_ratio"): 0.9,
               ("n", "perfect_gap_ratio"): 0.9}
    assert decide("flat(n)", figures) is flat
    assert decide("learns(n)", figures) is learns
    assert decide("memorises(n)", figures) is memorises
    assert decide("learns(n)", {**figures, ("n", "finite"): False}) is False


@pytest.mark.parametrize("gap, memorises", [(0.3, True), (0.7, False), (None, None)])
def test_memorises_reads_the_distance_to_a_perfect_prediction_too(gap, memorises):
    """2 slates of a listwise loss fall from 3.1 to 2.56 against their grades' entropy 2.5: 0.82 of the loss
    kept, 0.09 of the distance to a perfect prediction."""
    figures = {("n", "loss_ratio"): 0.82, ("n", "level_ratio"): 0.86, ("n", "perfect_gap_ratio"): gap}
    assert decide("memorises(n)", figures) is memorises


def test_every_named_rule_says_what_it_means_and_parses():
    for name, rule in named.NAMED.items():
        assert rule.says and len(rule.says) > 20, name
        parse_condition(f"{name}({', '.join(f'n{k}' for k in range(len(rule.nodes)))})")


@pytest.mark.parametrize("ratio, start, end, rises", [
    (1.3, 0.52, 0.60, True),    # ended 30% above its best and above its start
    (1.3, 0.52, 0.50, False),   # dipped to its best and came back, still below its start: noise, not a rise
    (1.05, 0.40, 0.42, False),  # within noise of its best
    (None, None, None, None),   # no validation measured: unknown, never overfitting by default
])
def test_val_rises_needs_a_rise_above_the_best_and_above_the_start(ratio, start, end, rises):
    figures = {("n", "val_ratio"): ratio, ("n", "val_start"): start, ("n", "val_end"): end, ("n", "val_noise"): None,
               ("n", "nothing_level"): None}
    assert decide("val_rises(n)", figures) is rises


@pytest.mark.parametrize("ratio, level, memorises", [
    (0.72, 0.36, True),   # a tabular net already near its two examples (0.29 -> 0.21, learning nothing 0.6)
    (0.72, 0.8, False),   # ... and one still far above them
    (0.72, None, None),   # no level known: the ratio alone cannot settle it
])
def test_memorises_also_counts_ending_under_half_the_loss_of_learning_nothing(ratio, level, memorises):
    figures = {("n", "loss_ratio"): ratio, ("n", "level_ratio"): level, ("n", "perfect_gap_ratio"): 0.9}
    assert decide("memorises(n)", figures) is memorises


@pytest.mark.parametrize("status, nothing, floor, levelless", [
    ("ok", None, None, True), ("ok", 0.69, None, False), ("ok", None, 0.0, False), ("ok", 2.3, 0.0, False),
    ("error", None, None, False)])  # a replay that raised measured no level: that is no levelless loss
def test_levelless_is_a_loss_with_neither_a_level_of_learning_nothing_nor_a_floor(status, nothing, floor, levelless):
    figures = {("n", "status"): status, ("n", "nothing_level"): nothing, ("n", "loss_floor"): floor}
    assert decide("levelless(n)", figures) is levelless


@pytest.mark.parametrize("share, kept", [(0.0, False), (0.45, False), (0.5, True), (1.0, True), (None, None)])
def test_keeps_gradients_is_half_the_steps_of_one_optimizer_on_a_gradient_never_reset(share, kept):
    assert decide("keeps_gradients(n)", {("n", "stale_gradient_share"): share}) is kept


@pytest.mark.parametrize("knn, chance, at_chance", [(0.29, 0.33, True), (0.42, 0.33, True), (0.44, 0.33, False),
                                                    (None, None, None)])
def test_labels_at_chance_is_neighbour_agreement_within_a_tenth_of_chance(knn, chance, at_chance):
    figures = {("n", "is_classification"): True, ("n", "knn_agreement"): knn, ("n", "chance_agreement"): chance}
    assert decide("labels_at_chance(n)", figures) is at_chance
    assert decide("labels_at_chance(n)", {**figures, ("n", "is_classification"): False}) is False


def test_targets_carry_nothing_reads_the_neighbours_target_correlation():
    figures = {("n", "is_classification"): False, ("n", "knn_target_correlation"): 0.05}
    assert decide("targets_carry_nothing(n)", figures) is True
    assert decide("targets_carry_nothing(n)", {**figures, ("n", "knn_target_correlation"): 0.6}) is False


@pytest.mark.parametrize("no_grad, frozen, outside, misses, cut", [
    (0.9, 0.0, 0.5, True, True),  # the gradient goes around the optimizer (and reaches none of its own)
    (0.9, 0.0, 0.0, False, True),  # the graph is cut: nothing outside gets one either
    (0.9, 0.6, 0.5, False, False),  # mostly frozen: another fault
    (0.2, 0.0, 0.5, False, False),
])
def test_a_gradient_that_misses_the_optimizer_or_a_cut_graph_reads_frozen_weights_apart(no_grad, frozen, outside,
                                                                                       misses, cut):
    figures = {("n", "no_grad_fraction"): no_grad, ("n", "frozen_fraction"): frozen,
               ("n", "outside_with_grad_fraction"): outside}
    assert decide("optimizer_misses_the_gradient(n)", figures) is misses
    assert decide("graph_cut(n)", figures) is cut


@pytest.mark.parametrize("frozen, missing, mostly", [(0.4, 0.2, True), (0.3, 0.1, False), (0.996, 0.0, True)])
def test_mostly_frozen_counts_weights_frozen_or_missing_from_the_optimizer(frozen, missing, mostly):
    figures = {("n", "frozen_fraction"): frozen, ("n", "not_in_optimizer_fraction"): missing}
    assert decide("mostly_frozen(n)", figures) is mostly


def test_the_loop_and_clipping_rules_read_nine_tenths():
    assert decide("weights_left_still(n)", {("n", "extra_unchanged_fraction"): 0.95}) is True
    assert decide("weights_left_still(n)", {("n", "extra_unchanged_fraction"): 0.5}) is False
    assert decide("clips_always(n)", {("n", "clipped_fraction"): 0.95}) is True
    assert decide("clips_always(n)", {("n", "clipped_fraction"): 0.6}) is False


@pytest.mark.parametrize("gradient, own", [(0.2, True), (0.01, False), (None, None)])
def test_a_loss_of_its_own_sends_another_gradient_than_the_standard_loss(gradient, own):
    assert decide("loss_of_its_own(n)", {("n", "gradient_vs_standard"): gradient}) is own


@pytest.mark.parametrize("level, nothing, learned", [(0.95, True, False), (0.05, False, True), (0.5, False, False)])
def test_the_standard_loss_says_nothing_learned_or_the_task_learned(level, nothing, learned):
    figures = {("n", "standard_level_ratio"): level}
    assert decide("standard_says_nothing_learned(n)", figures) is nothing
    assert decide("standard_says_learned(n)", figures) is learned


@pytest.mark.parametrize("level, half, little", [(0.9, True, True), (0.6, True, False), (0.3, False, False)])
def test_levels_of_learning_nothing_a_replay_ends_at(level, half, little):
    figures = {("n", "level_ratio"): level}
    assert decide("above_half_learned_nothing(n)", figures) is half
    assert decide("learned_little(n)", figures) is little


def test_a_checkpoint_near_chance_and_a_replay_that_trains_on():
    assert decide("starts_near_chance(i)", {("i", "checkpoint_ratio"): 0.9}) is True
    assert decide("starts_near_chance(i)", {("i", "checkpoint_ratio"): 0.4}) is False
    assert decide("trains_on(n)", {("n", "loss_ratio"): 0.9}) is True
    assert decide("trains_on(n)", {("n", "loss_ratio"): 0.97}) is False


@pytest.mark.parametrize("val, train, overfits", [(1.2, 0.8, True), (1.05, 0.8, False), (1.2, 0.95, False)])
def test_the_runs_log_overfits_when_validation_turns_up_while_training_falls(val, train, overfits):
    figures = {("h", "val_ratio"): val, ("h", "train_ratio_since_val_best"): train}
    assert decide("log_overfits(h)", figures) is overfits


@pytest.mark.parametrize("identical, shared, batches, examples", [
    (0.9, 0.9, True, False), (0.1, 0.8, False, True), (0.1, 0.1, False, False)])
def test_ranks_fed_the_same_batches_or_the_same_examples(identical, shared, batches, examples):
    figures = {("r", "world_size"): 2, ("r", "identical_batch_fraction"): identical,
               ("r", "shared_example_fraction"): shared}
    assert decide("ranks_share_batches(r)", figures) is batches
    assert decide("ranks_share_examples(r)", figures) is examples
    assert decide("ranks_share_batches(r)", {**figures, ("r", "world_size"): 1}) is False


@pytest.mark.parametrize("slope, se, level, moved, confirmed", [
    (0.0, 0.0, 0.5, 0.05, True),  # flat to the digit: stalled
    (-0.0005, 0.0005, 0.5, 0.05, True),  # steepest plausible: -0.0015 x 40 = -6%, under the 10% threshold
    (-0.00097, 0.0019, 0.62, 0.075, False),  # a noisy tabular run down 3%: it may be falling 17%
    (-0.00097, 0.0019, 0.95, 0.075, True),  # ... but at the loss of learning nothing, stalled however it moves
    (0.0027, 0.004, 0.17, 0.0001, True),  # an LR decayed to ~0: the batches' scatter about an unchanged model
    (None, None, 0.5, 0.05, None),  # not measured (a loss with negative values): unknown
])
def test_a_stall_is_confirmed_only_where_the_runs_noise_cannot_hide_a_fall(slope, se, level, moved, confirmed):
    figures = {("n", "log_slope"): slope, ("n", "log_slope_se"): se, ("n", "steps_run"): 40, ("n", "level_ratio"): level,
               ("n", "update_ratio"): moved}
    assert decide("stall_confirmed(n)", figures) is confirmed


@pytest.mark.parametrize("decay, reach, harms", [(0.0, None, False), (0.01, 0.002, False), (0.5, 0.8, True),
                                                 (0.01, None, True)])
def test_decay_can_harm_reads_how_far_the_decay_can_have_shrunk_the_weights(decay, reach, harms):
    figures = {("setup", "weight_decay"): decay, ("setup", "decay_reach"): reach}
    assert decide("decay_can_harm()", figures) is harms


@pytest.mark.parametrize("ahead, shifted", [(2, True), (1, False), (0, False), (None, None)])
def test_shifted_twice_is_an_output_trained_on_a_token_past_the_next(ahead, shifted):
    assert decide("shifted_twice(n)", {("n", "predicts_ahead"): ahead}) is shifted


@pytest.mark.parametrize("speedup, factor, kept_up", [
    (2.8, 10.0, True),  # a healthy wide-and-deep run: 113 steps to the loss x10 reached in 40
    (1.26, 10.0, True),  # a healthy siamese run: 151 steps to x10's loss at 120
    (9.0, 10.0, False),  # about in proportion to the LR: held back by it
    (None, 100.0, None),  # never reached the x100 loss within the long window: not shown to keep up
])
def test_run_kept_up_reached_the_higher_lrs_loss_in_under_a_third_of_its_factor_times_the_steps(speedup, factor,
                                                                                                 kept_up):
    figures = {("n", "search_speedup"): speedup, ("s", "lr_factor"): factor}
    assert decide("run_kept_up(n, s)", figures) is kept_up


@pytest.mark.parametrize("lift, at_chance", [(0.02, True), (-0.05, True), (0.6, False), (None, None)])
def test_sequence_targets_at_chance_reads_the_lift_over_chance_of_a_neighbours_target(lift, at_chance):
    assert decide("sequence_targets_at_chance(n)", {("n", "target_lift"): lift}) is at_chance


@pytest.mark.parametrize("missed, shift, misses", [
    (0.2, 0.03, True),  # a router the task reads through its argmax, trained by the balance term alone
    (0.2, 0.0, False),  # a prior the task never reads: trained by its own term, no fault
    (0.0, None, False),  # the objective reaches every weight
    (0.2, None, None),  # the shift could not be measured
])
def test_objective_misses_weights_it_reads_and_sends_no_gradient(missed, shift, misses):
    figures = {("f", "objective_missed_fraction"): missed, ("f", "objective_shift"): shift,
               ("f", "auxiliary_declared"): True, ("f", "objective_reaches_input"): None}
    assert decide("objective_misses(f)", figures) is misses


@pytest.mark.parametrize("reaches_input, misses", [(False, True), (True, False), (None, False)])
def test_a_term_the_run_did_not_name_is_a_fault_where_the_others_train_nothing_that_reads_the_input(
        reaches_input, misses):
    """A VQ-VAE without its straight-through estimator: the reconstruction trains the decoder alone (nothing
    that reads the input), and the commitment term alone the encoder. With it (or an actor-critic's critic,
    read through a detached advantage), the other terms reach the input layer: by design."""
    figures = {("f", "objective_missed_fraction"): 0.55, ("f", "objective_shift"): 0.05,
               ("f", "auxiliary_declared"): False, ("f", "objective_reaches_input"): reaches_input}
    assert decide("objective_misses(f)", figures) is misses


@pytest.mark.parametrize("bf16, fp32, trains", [
    ((True, 0.01, True), (True, 0.02, True), True),
    ((False, None, False), (True, 0.5, True), True),  # fp32 alone trains
    ((True, 0.95, True), (True, 0.97, True), False),  # finite and better than a diverged run, but not learning
    ((True, 0.5, False), (True, 0.5, False), False),  # learns, no better than the run
    ((None, None, None), (None, None, None), False),  # neither ran (a run not in fp16, a step of its own)
    ((None, None, None), (False, None, False), False),  # bf16 not applicable, fp32 blew up: a restart gate opens
])
def test_precision_trains_is_another_precision_finite_learning_and_better_than_the_run(bf16, fp32, trains):
    figures = {}
    for node, (finite, ratio, better) in (("b", bf16), ("f", fp32)):
        figures.update({(node, "finite"): finite, (node, "loss_ratio"): ratio, (node, "better"): better})
    assert decide("precision_trains(b, f)", figures) is trains


@pytest.mark.parametrize("share, repeats, alike", [
    (0.567, 0.537, True),  # a recommender's popular pairs: as often across the split as within training
    (0.30, 0.70, True),  # a pool of augmented copies split after augmenting looks the same
    (1.0, 0.0, False),  # training rows that never repeat, copied into validation
    (0.5, 0.05, False),  # within training rarely (under a tenth), across the split often
    (0.9, 0.4, False),  # over half again the training rows' own rate
])
def test_repeats_like_training_is_an_overlap_the_datas_own_repetition_explains(share, repeats, alike):
    figures = {("o", "duplicate_fraction"): share, ("o", "train_repeat_fraction"): repeats}
    assert decide("repeats_like_training(o)", figures) is alike


@pytest.mark.parametrize("ratio, start, end, rises", [
    (1.18, 0.1782, 0.1783, False),  # dipped and came back to its start: a healthy metric-learning run
    (1.30, 0.50, 0.60, True),  # 20% above where it started
    (1.05, 0.50, 0.60, False),  # not 10% above its best
])
def test_val_rises_needs_the_end_clearly_above_the_start(ratio, start, end, rises):
    figures = {("v", "val_ratio"): ratio, ("v", "val_start"): start, ("v", "val_end"): end, ("v", "val_noise"): None,
               ("v", "nothing_level"): None}
    assert decide("val_rises(v)", figures) is rises


@pytest.mark.parametrize("start, end, kept, init, runs_off", [
    (-1e4, -2e9, None, -100.0, True),  # 100 times as far below zero: whatever its pace
    (-49.0, -90.0, 1.22, -12.0, True),  # a CRF's log-likelihood not negated: half as far again, at its pace
    (-1.0, -1.6, 0.4, -0.2, False),  # a likelihood early in its training: as far, but slowing as it settles
    (-1.23, -1.38, 1.03, 1.88, False),  # a healthy flow late in training: at its pace, 12% further
    (-49.0, -60.0, 1.22, -12.0, False),  # not half as far again
    (-49.0, -120.0, math.inf, -12.0, True),  # flat, then falling in the second half: a term that kicks in late
    (-49.0, -90.0, None, -12.0, True)])  # too few steps to read a pace: the fall alone
def test_runs_off_is_a_loss_below_zero_that_falls_without_bound(start, end, kept, init, runs_off):
    figures = {("n", "loss_start"): start, ("n", "loss_end"): end, ("n", "fall_kept"): kept,
               ("i", "loss_setup_init"): init}
    assert decide("runs_off(n, i)", figures) is runs_off


def _second_difference_noise(values):
    from triage.experiments.replay import _noise
    return _noise(values)


@pytest.mark.parametrize("values, rises", [
    # FixMatch's validation, 0.022..0.084 from one measurement to the next, ending near where it began: no rise
    ([0.0445, 0.0824, 0.053, 0.0842, 0.0339, 0.0256, 0.0223, 0.0496], False),
    ([0.50, 0.515, 0.53, 0.545, 0.56, 0.575, 0.59, 0.60], True),  # a steady climb
    ([1.0, 0.95, 0.90, 0.85, 0.80, 0.85, 0.90, 0.975, 1.05], True),  # a U: down to its best, then 31% above it
])
def test_val_rises_needs_a_rise_beyond_the_validation_figures_own_noise(values, rises):
    figures = {("v", "val_ratio"): values[-1] / min(values), ("v", "val_start"): values[0],
               ("v", "val_end"): values[-1], ("v", "val_noise"): _second_difference_noise(values),
               ("v", "nothing_level"): None}
    assert decide("val_rises(v)", figures) is rises


def test_under_four_validation_figures_the_rise_alone_decides():
    figures = {("v", "val_ratio"): 1.3, ("v", "val_start"): 0.5, ("v", "val_end"): 0.6, ("v", "val_noise"): None,
               ("v", "nothing_level"): None}
    assert decide("val_rises(v)", figures) is True


@pytest.mark.parametrize("best, end, nothing, rises", [
    (0.0063, 0.0077, 0.49, False),  # a focal loss near its floor: 21% up, 16x its noise, 0.3% of learning nothing
    (0.0063, 0.0077, 0.10, True),  # the same rise where learning nothing scores 0.1: 1.4% of it
    (0.0063, 0.0077, None, True),  # no level known: the ratios decide
    (0.020, 0.040, 2.30, True),  # a 10-class classifier's validation loss doubling near 0 (review, helper-25)
])
def test_val_rises_needs_a_rise_of_a_size_that_matters_beside_learning_nothing(best, end, nothing, rises):
    figures = {("v", "val_ratio"): end / best, ("v", "val_start"): 0.0070, ("v", "val_end"): end,
               ("v", "val_noise"): 8.6e-5, ("v", "nothing_level"): nothing}
    assert decide("val_rises(v)", figures) is rises
