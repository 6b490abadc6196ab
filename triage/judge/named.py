"""The judge's symptom rules, which a playbook calls by name: `when: stalls(baseline)`.

Each rule is written in the playbook's condition language (walk/playbook/conditions.py) and is spelt out
in place when the playbook is loaded, on the nodes the call names. So a rule reads the same figures as any
condition, with the same unknowns (a figure that could not be measured leaves it unknown, and the branch
is not taken), it is type-checked at load like one (a node that does not run the right experiment, or
runs after the branch, is refused then), and the report names the clause of it that settled the branch.
A name the judge does not know, or a call with the wrong number of nodes, is refused at load too.

The thresholds are the judge's and live here, nowhere else; a team's playbook that calls a rule follows
any change to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from string import Template

from triage.judge.fix import DEFAULT_MARGIN

# Over the baseline replay's steps (40 by default), in steps of this run:
DIVERGES_LOSS_RATIO = 1.5  # the loss ends 50% above where it started
STALL_LOSS_RATIO = 0.9  # under a 10% drop: a stall
CLEAR_STALL_LOSS_RATIO = 0.95  # under a 5% drop: clear of the stall threshold
SLOW_PACE = 0.1  # a tenth of the run's own pace before the checkpoint (pace_vs_run)
NOTHING_LEARNED = 0.9  # at 90% of the loss of learning nothing or above: nothing learned
CONVERGED = 0.1  # under a tenth of it: a converged run, nothing left to fix
LITTLE_SINCE_INIT = 0.8  # the checkpoint's loss above 80% of setup()'s fresh init's: little learned since
# setup()'s own init, measured on the snapshot (init_check). PyTorch's default inits start within ~1.5x of ln K
# and of the loss of learning nothing, and keep activations within a few x from the first layer to the last.
INIT_START_RATIO = 3  # setup()'s init starts above 3x ln K, or 3x the loss of learning nothing
INIT_ACTIVATION_GROWTH = 100  # activations grow more than 100x from the first layer to the last
# ReLU units that never fire on the snapshot (activation_health): a few dead units are normal, half is not.
DEAD_ON_AVERAGE = 0.5  # over half the units dead, averaged over the ReLU layers
DEAD_IN_A_LAYER = 0.9  # or over 90% in one layer
# Validation rows that duplicate training rows (overlap_check): a few are chance, a tenth is a leak.
DUPLICATE_SHARE = 0.1
# A model output spread over the examples under a quarter of what outputs spread over every direction do
# (outputs.least_spread): nearly the same vector for every input, a collapsed representation. Healthy
# Siamese encoders measure ~1, a SimSiam without its stop-gradient 0.1 a few epochs in.
COLLAPSED_SPREAD = 0.25
# A batch's examples reversed change the loss by more than this share of it: no float summation order does
# (~1e-6); a loss or forward that works across examples by their place in the batch does.
ORDER_GAP = 0.01
ORDER_OVER_DRAWS = 10  # ... and ten times its change between two random draws (negatives drawn in the loss)
# A loss that weighs each action by a float named as a reward, minimised, should make the better-rewarded actions
# likelier: the float's change when shuffled and the change in how far the loss raises each action's score rank
# together (labels.reward_push_correlation). Under this, the loss makes them rarer.
REWARD_PUSHED_DOWN = -0.5
# Scores handed a loss on raw scores, all in [0, 1]: spread over at least this much of it, they are probabilities.
SQUASHED_SPREAD = 0.5
# Token labels that are the input token at their own place (label_shift 0), mostly one token, on a minority of
# the places: masked-LM labels built from the already masked ids (the [MASK] id at 80% of the 15% of places
# labelled). An autoencoder's labels are its inputs too, at every place, and text's commonest token is a few
# percent of them; one whose padding is labelled, or a two-token vocabulary, labels every place as well.
COPIED_MAJORITY = 0.5
COPIED_PLACES = 0.5
# Where the training rows repeat one another (the chance that a row drawn from the same data repeats one already
# drawn), validation rows drawn apart from them repeat them about as often: a recommender's (user, item) pairs
# repeat 54% within training and 57% across the split, and the repeats are its popular pairs, which score better
# whether or not anything leaked. Up to half again that rate, an overlap is not told from the data's own
# repetition (a validation set cut from a pool of augmented copies looks the same: 70% and 30%).
REPEATS_MARGIN = 1.5
# Validation windows that are training windows moved by a few steps (overlap_check): a chronological split
# shares a handful at its boundary; a series cut into windows and shuffled before the split shares nearly
# all (every validation window has a training neighbour): over half.
SHIFTED_SHARE = 0.5
# Validation examples near a training one (overlap_check's near copies: under the training examples' 5th
# percentile of nearest distances, and under half their own distance to the nearest other validation example).
# Random splits of digits put 0-0.6% there, and none with noise added to training only; digits whose validation
# is half training images plus noise of 0.05 of the pixel range, 48%. Over a fifth, and at least NEAR_COUNT of
# them, is a split drawn after the data was copied.
NEAR_SHARE = 0.2
NEAR_COUNT = 10
DECAYED_LR = 0.01  # the schedule's LR now under 1% of its peak, past the peak: decayed to ~0
IDLE_SHARE = 0.5  # ... or, its place on the schedule unknown, from before half of the run's declared steps on
BROUGHT_DOWN_LR = 0.1  # ... under a tenth of it: weights freed now barely move at that LR
# The earliest layers' gradient norm under 1% of the latest's (gradient_flow): two orders of magnitude
# lost on the way down, where a healthy deep net stays within one.
VANISHING = 0.01
# Weights that collapse (weight decay): their norm down 20% over the replay, or down to half of setup()'s
# fresh init's at the checkpoint.
SHRANK_OVER_REPLAY = 0.8
SHRANK_SINCE_INIT = 0.5
# A run held back by its LR learns at about 1/k the pace of the same run at k times the LR: it takes about k
# times the steps to reach the loss the faster one reached. One that, replayed long enough, reaches it in
# under a third of that (a 10x LR 2.8x faster) is slower, not stuck: more LR pays far less than in proportion.
KEPT_UP = 0.33
# Weights the objective sends no gradient: moved by a tenth of their size (gradient_flow), an objective that reads
# them moves (a router's argmax flips for some examples); one that does not read them moves by fp32 rounding at most
# (an eval forward twice gives the same value to the bit).
OBJECTIVE_READS = 1e-4
LOG_IN_RUN_UNITS = 1.5  # a logged first training loss at most this times the loss of learning nothing
MEMORISES = 0.5  # a replay on 2 examples halves its loss: the model can learn what it is given
# An optimizer built on the wrong parameters: over half of those it holds get no gradient (a frozen head or
# two is a design; most of the model is a misbuilt optimizer).
MISSED_BY_OPTIMIZER = 0.5
# A loss that runs off below zero: negative at the replay's start and 100 times that at its end, 40 steps on;
# or half as far again below zero, by a fall larger than the whole loss at setup()'s init. A loss negative by
# nature (a Gaussian NLL, an ELBO, a flow's NLL) moves by a fraction of itself over a replay from a recent
# checkpoint (a healthy RealNVP -1.23 -> -1.38); a term with the wrong sign runs away (a KL added where it is
# subtracted: -1.1e4 -> -2.3e9; a CRF's log-likelihood not negated: -49 -> -90, its init at -12).
RUNS_OFF = 100
RUNS_FAR = 1.5
# ... and, for the half-as-far clause, its second half's fall at least 0.7 of its first's: a term with the wrong
# sign keeps its pace (the CRF above 1.22, RealNVP's log-det sign 1.18); a likelihood early in its training,
# falling far, slows as it settles. A guard, not a separation by itself: a healthy RealNVP late in training
# keeps its pace too (1.03), and is told apart by how little it falls. A fall that only starts in the second
# half (a term that kicks in late) keeps its pace by any measure (inf).
FALL_KEPT = 0.7
# Two views handed to the model, no labels read (label_check's pair_lift): paired at random the lift is 0, its
# standard error about 1.2 / sqrt(n) (0.026 at 500 examples); real pairs score well above (a CLIP's image and
# caption 0.88, two augmentations of one digit 0.10). Under 0.05 over 500 examples or more: unpaired.
UNPAIRED_LIFT = 0.05
PAIRED_EXAMPLES = 500
# Labels that carry no signal about the inputs (label_check's leave-one-out nearest neighbour): a
# classifier's neighbours agree on the label within 0.1 of chance agreement; a regressor's target
# correlates under 0.1 with its neighbours' (a real one correlates well above it).
KNN_OVER_CHANCE = 0.1
KNN_TARGET_CORRELATION = 0.1
# Validation during a replay: ends 10% above its best (a logged val loss's noise stays within a few percent)
# and above where the replay started it. A val loss that wobbles and ends below its start has not risen.
VAL_ABOVE_BEST = 1.1
# ... and clearly above where it started: a validation loss that dipped and came back to its start (0.1782 ->
# 0.1783 for a healthy metric-learning run while its training loss fell 43%) has not risen.
VAL_ABOVE_START = 1.02
# ... and its end above its best by more than three times its own noise (the replay's val_noise, read from second
# differences: blind to a steady climb or a U): a figure that jumps by 50% from one measurement to the next and
# ends 10% up has not risen.
VAL_RISE_NOISE = 3.0
# ... and by at least this share of the loss of learning nothing, half the size the judge asks of a validation
# gain (judge/fix.py MIN_GAIN): a focal loss near its floor (0.0063 -> 0.0077, against 0.49 for learning
# nothing) rose 21% and 16x its noise over 40 steps of a healthy run, by 0.3% of what the task is worth; a
# 10-class classifier whose validation loss doubles from 0.02 (0.9%) or a regressor on standardised targets
# from 0.012 to 0.018 (0.6%) overfits.
VAL_RISE_SIZE = 0.005
# A stall is confirmed where even the replay's steepest plausible trend, its fitted log-loss slope less two
# standard errors of it, falls less than the stall threshold over its steps: its noise cannot hide a run
# learning at that pace. (A noisy tabular run down 3% over 40 steps, each step 0.29 to 0.51, may be falling
# 17%: a stall there is not measured, and a verdict built on it is medium at most.)
PLAUSIBLE_SIGMAS = 2
# ... or where the replay left its weights where they were: moved under 0.1% of their norm, it ends with the
# model it started with (an LR decayed to ~0, an optimizer stepping other parameters), and the loss's scatter
# is the batches', not a trend's.
WEIGHTS_STILL = 0.001
# ... or where it moved them a tenth of their norm or more in its 40 steps and its last batches still score as
# they did at its start, within 5% either way: the steps move the weights without changing what the model
# computes (a vector field held near zero by a weight decay it cannot outgrow: its training loss "fell" 29% on
# its batches' scatter while its validation loss moved 0.01%). Healthy runs move theirs 1.8-5% from a mid-run
# checkpoint; a healthy VQ-VAE moved 12% and its last batches scored 13% worse at the end: no stall.
WEIGHTS_BUSY = 0.1
# The run's own log (history_check): validation ends 10% above its best (VAL_ABOVE_BEST) while training fell
# another 10% since (STALL_LOSS_RATIO): the textbook overfitting curve.
# A replay's training loss still falling: down 5% or more over its steps (CLEAR_STALL_LOSS_RATIO).
# Learned little: at 80% of the loss of learning nothing or above (a replay), or a checkpoint at 80% of ln K.
LEARNED_LITTLE = 0.8
# Parameters that do not train: most of the optimizer's (over half, MISSED_BY_OPTIMIZER) is a bug, a few a design.
# The run's own step leaves over 90% of the trainable weights where they were while the reference loop moves them.
LEFT_STILL = 0.9
# The run clips (almost) every step: over 90% of its steps: the threshold, not the gradient, sets each step.
CLIPS_ALWAYS = 0.9
# The gradient the run's loss sends into the model's output differs from the standard loss's by more than
# autocast rounding (5%): a loss of its own making (smoothing, weights, a squashing, a broadcast).
OWN_LOSS_GRADIENT = 0.05
# ... unless it is the standard's times one positive weight per class (or per column's positives and negatives)
# within the same rounding: the standard loss weighted (pos_weight, class weights), a choice its owner made.
WEIGHTED_STANDARD = 0.05
# Above half the loss of learning nothing: the run has not learned the task by its own measure.
HALF_LEARNED = 0.5
# Weight decay can have done harm only where, over the run so far and the replay, it can remove 5% of the
# weights or more (its lr x weight_decay summed: SetupFacts.decay_reach). Below that, removing it changes a
# chaotic run's path without being the cause (AdamW at its default 0.01 and lr 1e-3 removes 0.1% over 100
# steps). Unknown reach (Adam's coupled L2) is tried.
DECAY_REACH = 0.05
# Ranks of a distributed run fed the same data: over half their batches identical, or their examples shared.
RANKS_SHARE = 0.5
# An optimizer of a set given its previous step's gradient again (loop_diff's exact check) on half its steps
# or more: a reset left out. A loop that resets scores 0, whatever its noise.
STALE_STEPS = 0.5
# A loss's terms besides its nll_loss / cross_entropy send its weights a tenth of the gradient those send, or
# more: the class log-likelihood is one term of a larger likelihood (a point process's log-intensities at its
# events, bounded by the integral of its intensities: 1.13x), and a value below zero is no sign of scores
# handed to nll_loss unnormalised. A 1e-4 L2 penalty on a small MLP's weights sends under a tenth; a 0.05 penalty
# on the logits themselves sends 0.74, and nll_loss on raw logits beside it is then left to the floor check.
OTHER_TERMS = 0.1
# A quarter of the trainable weights (by element) get a gradient of exactly zero through an intact graph: an
# operation with no gradient (round, argmax, sign) between them and the loss, where no dead units explain it.
ZEROED_SHARE = 0.25
# Optimizers whose step is normalised per weight (about lr a step, whatever the gradient's scale): under them a
# step too large is the LR's doing; under SGD the gradient's scale (inputs in raw units) makes it as large.
# Not Adagrad (its step shrinks as squared gradients pile up) nor Adadelta (its step is not the LR's size). By
# class name: a subclass, a fused or 8-bit Adam, Lion, reads as not normalised (dead_relu, as before).
NORMALISED_STEP = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "SparseAdam", "RMSprop")


_INIT_ABNORMAL = (f"$init.setup_init_ratio > {INIT_START_RATIO} or $init.setup_init_vs_nothing > {INIT_START_RATIO} "
                  f"or $init.activation_std_growth_setup > {INIT_ACTIVATION_GROWTH}")


@dataclass(frozen=True)
class NamedRule:
    nodes: tuple[str, ...]  # what each node named in the call must be, in call order (the placeholders)
    rule: str  # condition text, a $placeholder for each node
    says: str  # the rule in words, for `triage playbook` errors and the docs (generated into docs/playbooks.md)

    def written_out(self, names: list[str]) -> str:
        return Template(self.rule).substitute(dict(zip(self.nodes, names)))


NAMED: dict[str, NamedRule] = {
    # A spike counts as divergence when it rose above the best loss so far by more than the whole starting
    # loss (minibatch noise on a healthy run rises a fraction of it) and reached a tenth of chance level and
    # of the loss of learning nothing, where they are known (a memorised run at loss 0.002 jumping to 0.006
    # is noise; a binary classifier has no ln K, but has its label entropy).
    "diverges": NamedRule(
        ("replay", "init"),
        f"not $replay.finite or $replay.loss_ratio > {DIVERGES_LOSS_RATIO} or ($replay.max_rise > 1.0 "
        "and ($init.expected_loss == none or $replay.loss_max > 0.1 * $init.expected_loss) "
        "and ($replay.nothing_level == none or $replay.loss_max > 0.1 * $replay.nothing_level))",
        "the replay's loss went non-finite, ended 50% above its start, or spiked by more than its starting "
        "loss to a tenth of chance level"),
    # Clear of the threshold (under a 5% drop), or near it (5-10%) while learning at under a tenth of the
    # run's own pace before the checkpoint; or at the loss of learning nothing however it moved. Not a
    # converged run (its loss still above a tenth of learning nothing: a memorised run flat at 0.005 has
    # nothing left to fix).
    "stalls": NamedRule(
        ("replay",),
        f"$replay.level_ratio > {NOTHING_LEARNED} or (($replay.level_ratio == none or $replay.level_ratio > "
        f"{CONVERGED}) and $replay.loss_ratio > {STALL_LOSS_RATIO} and ($replay.loss_ratio > "
        f"{CLEAR_STALL_LOSS_RATIO} or $replay.pace_vs_run < {SLOW_PACE})) or "
        f"($replay.same_batches_ratio != none and ($replay.level_ratio == none or $replay.level_ratio > "
        f"{CONVERGED}) and $replay.same_batches_ratio > {CLEAR_STALL_LOSS_RATIO} "
        f"and $replay.same_batches_ratio < {1 / CLEAR_STALL_LOSS_RATIO:.6f})",
        "the replay's loss dropped under 5% (or under 10% at a tenth of the run's own pace), or sits at the "
        "loss of learning nothing, or its weights barely moved (or moved a tenth of their norm) and the batches of "
        "its last steps score within 5% of what they scored at its start, either way"),
    # Stalled at the loss of learning nothing, with its weights still, or flat beyond what its noise allows.
    "stall_confirmed": NamedRule(
        ("replay",),
        f"$replay.level_ratio > {NOTHING_LEARNED} or $replay.update_ratio < {WEIGHTS_STILL} or "
        f"($replay.log_slope - {PLAUSIBLE_SIGMAS} * $replay.log_slope_se) * $replay.steps_run > "
        f"{math.log(STALL_LOSS_RATIO):.6f}",
        "the replay sits at the loss of learning nothing, or left its weights where they were (moved under 0.1% "
        "of their norm), or its fitted log-loss slope less two standard errors of it falls under 10% over its "
        "steps: its noise cannot hide a run learning at the stall threshold's pace"),
    # Near the threshold and keeping up its pace (a slow run still learning, or one whose pace is unknown):
    # a verdict reached through it is medium at most (the playbook's branch says so).
    "slows_to_a_stall": NamedRule(
        ("replay",),
        f"$replay.loss_ratio > {STALL_LOSS_RATIO} and ($replay.level_ratio == none or $replay.level_ratio > "
        f"{CONVERGED})",
        "the replay's loss dropped under 10%, not yet converged"),
    "run_kept_up": NamedRule(
        ("replay", "search"), f"$replay.search_speedup < {KEPT_UP} * $search.lr_factor",
        "the run, replayed long enough, reached the loss the search's higher LR reached in under a third of the "
        "LR's factor times the steps: slower than at the higher LR, not held back by its LR"),
    "normalised_step": NamedRule(
        ("search",), f"$search.optimizer_kind in {list(NORMALISED_STEP)}",
        "the optimizer whose LR the search scaled normalises its step per weight (Adam, RMSprop and the like: each "
        "weight moves about the LR a step, whatever its gradient)"),
    "class_loss_alone": NamedRule(
        ("labels",), f"$labels.other_terms_gradient == none or $labels.other_terms_gradient < {OTHER_TERMS}",
        "the loss's terms other than nll_loss / cross_entropy send the weights under a tenth of the gradient those "
        "send (or none are measured)"),
    "learned_nothing": NamedRule(
        ("replay",), f"$replay.level_ratio > {NOTHING_LEARNED}",
        "the replay ended at 90% or more of the loss of learning nothing (a constant prediction)"),
    # The run's own progress: its checkpoint barely below setup()'s fresh init, or the replay at the loss
    # of learning nothing. A drastic change (another init) is worth trying only then.
    # setup()'s init is abnormal: it starts far above chance or the loss of learning nothing, or its
    # activations explode with depth. A restart from another init is worth trying then.
    "init_abnormal": NamedRule(
        ("init",), _INIT_ABNORMAL,
        "setup()'s init starts above 3x ln K or 3x the loss of learning nothing, or its activations grow over "
        "100x from the first layer to the last"),
    # ... and is not PyTorch's default scheme: then the inputs, not the init, make the start abnormal
    # (raw-unit features, say), and the init is no measured abnormality.
    "bad_init": NamedRule(
        ("init",), f"({_INIT_ABNORMAL}) and not $init.setup_init_is_default",
        "setup()'s init is abnormal (init_abnormal) and is not PyTorch's default scheme"),
    "dead_units": NamedRule(
        ("activations",),
        f"$activations.mean_dead_fraction > {DEAD_ON_AVERAGE} or $activations.max_dead_fraction > {DEAD_IN_A_LAYER}",
        "over half the ReLU units never fire on the snapshot (averaged over layers), or over 90% in one layer"),
    "duplicates_validation": NamedRule(
        ("overlap",), f"$overlap.duplicate_fraction > {DUPLICATE_SHARE}",
        "over a tenth of the validation rows duplicate training rows"),
    # Unknown counts as few: a run without validation data, or whose overlap could not be measured.
    "few_duplicates": NamedRule(
        ("overlap",), f"$overlap.duplicate_fraction == none or $overlap.duplicate_fraction <= {DUPLICATE_SHARE}",
        "a tenth of the validation rows or fewer duplicate training rows, or no overlap measured"),
    "repeats_like_training": NamedRule(
        ("overlap",), f"$overlap.train_repeat_fraction > {DUPLICATE_SHARE} "
                      f"and $overlap.duplicate_fraction <= {REPEATS_MARGIN} * $overlap.train_repeat_fraction",
        "the training rows repeat one another over a tenth of the time, and the validation rows repeat them no more "
        "than half again as often"),
    # The overlap matters where it flatters the validation figure: every validation example is a training one,
    # or those that are score clearly better (the fix bar's margin) at the checkpoint than those that are not.
    "duplicates_flatter": NamedRule(
        ("overlap",), f"$overlap.duplicates == $overlap.val_examples or $overlap.duplicate_loss < "
                      f"{DEFAULT_MARGIN} * $overlap.other_loss",
        "every validation example is a training example, or those that are score clearly better (under 0.8x the "
        "loss) at the checkpoint than the rest"),
    "duplicates_score_alike": NamedRule(
        ("overlap",), f"$overlap.duplicates < $overlap.val_examples and $overlap.duplicate_loss >= "
                      f"{DEFAULT_MARGIN} * $overlap.other_loss",
        "the validation examples that are training examples do not score clearly better at the checkpoint than "
        "the rest (0.8x their loss or above)"),
    "shifted_windows": NamedRule(
        ("overlap",), f"$overlap.shifted_fraction > {SHIFTED_SHARE}",
        "over half the validation sequences are training sequences moved by 1 to 32 steps (windows of one "
        "series, split after they were cut)"),
    "near_copies_validation": NamedRule(
        ("overlap",), f"$overlap.near_fraction > {NEAR_SHARE} and $overlap.near_copies >= {NEAR_COUNT}",
        "over a fifth of the validation examples (exact copies left out), and at least ten, lie nearer a training "
        "example than 95% of the snapshot's training examples lie to their nearest other one, and nearer it than "
        "half their distance to the nearest other validation example"),
    "near_copies_flatter": NamedRule(
        ("overlap",), f"$overlap.near_loss < {DEFAULT_MARGIN} * $overlap.far_loss",
        "the near validation examples score clearly better (under 0.8x the loss) at the checkpoint than the rest"),
    "schedule_decayed": NamedRule(
        ("schedule",),
        f"$schedule.has_scheduler and $schedule.past_peak and $schedule.lr_now_ratio < {DECAYED_LR}",
        "the run has a scheduler, is past its peak, and its LR now is under 1% of the peak"),
    # Where the checkpoint does not say where the run stood (no step, no scheduler state): the schedule, traced
    # over the length the run declares, sits under 1% of its peak for over half of it (a warm-up-and-decay
    # schedule handed the epoch count where it counts batches). A schedule and a run length that disagree.
    "schedule_ends_early": NamedRule(
        ("schedule",),
        f"$schedule.has_scheduler and not $schedule.position_known and $schedule.lr_idle_from != none "
        f"and $schedule.lr_idle_from < {IDLE_SHARE} * $schedule.horizon",
        "the checkpoint holds no step or scheduler state, and the schedule, traced over the run's declared "
        "total_steps, is under 1% of its peak for over half of them"),
    "schedule_brought_down": NamedRule(
        ("schedule",),
        f"$schedule.has_scheduler and $schedule.past_peak and $schedule.lr_now_ratio < {BROUGHT_DOWN_LR}",
        "the run has a scheduler, is past its peak, and its LR now is under a tenth of the peak"),
    # The gradient goes to parameters no optimizer holds while those it holds get none (an optimizer built
    # on a DQN's target network instead of its Q network): the graph is not cut, the optimizer is misbuilt.
    # ... and under half are frozen: frozen parameters are another fault (frozen_parameters).
    "optimizer_misses_the_gradient": NamedRule(
        ("flow",), f"$flow.no_grad_fraction > {MISSED_BY_OPTIMIZER} and $flow.outside_with_grad_fraction > 0 "
                   f"and $flow.frozen_fraction < {MISSED_BY_OPTIMIZER}",
        "over half the optimizer's parameters get no gradient, while parameters it does not hold get one (and "
        "under half are frozen)"),
    "decay_can_harm": NamedRule(
        (), f"setup.weight_decay > 0 and (setup.decay_reach == none or setup.decay_reach > {DECAY_REACH})",
        "the run decays its weights, by enough to have shrunk them 5% over the run and the replay (or by an "
        "amount not known)"),
    # Where the run named no auxiliary term, a term's weights the others read but do not train are by design
    # as often as not (a VQ-VAE's codebook, an actor-critic's critic read through a detached advantage): a
    # fault only where the others' gradient reaches nothing that reads the input (a VQ-VAE without its
    # straight-through estimator: the reconstruction trains the decoder alone).
    "objective_misses": NamedRule(
        ("flow",), f"$flow.objective_missed_fraction > 0 and $flow.objective_shift > {OBJECTIVE_READS} and "
                   f"($flow.auxiliary_declared or $flow.objective_reaches_input == false)",
        "the objective's gradient reaches none of some weights that only auxiliary terms train, yet its value "
        "moves when they move (where the run named no term auxiliary: and it reaches no weight that reads the "
        "input)"),
    "gradient_zeroed": NamedRule(
        ("flow",), f"$flow.zero_grad_fraction >= {ZEROED_SHARE}",
        "a quarter of the trainable weights or more get a gradient of exactly zero through an intact graph"),
    "graph_cut": NamedRule(
        ("flow",), f"$flow.no_grad_fraction > {MISSED_BY_OPTIMIZER} and $flow.frozen_fraction < {MISSED_BY_OPTIMIZER}",
        "over half the optimizer's parameters get no gradient at all, and under half are frozen"),
    "mostly_frozen": NamedRule(
        ("flow",), f"$flow.frozen_fraction + $flow.not_in_optimizer_fraction > {MISSED_BY_OPTIMIZER}",
        "over half the weights are frozen or missing from the optimizer (a bug, not a partial freeze of a head)"),
    "weights_left_still": NamedRule(
        ("loop",), f"$loop.extra_unchanged_fraction > {LEFT_STILL}",
        "the run's own step leaves over 90% of the trainable weights unchanged where the reference loop moves them"),
    "clips_always": NamedRule(
        ("replay",), f"$replay.clipped_fraction > {CLIPS_ALWAYS}", "the replay clipped over 90% of its steps"),
    "order_matters": NamedRule(
        ("example_order",), f"$example_order.loss_gap != none and $example_order.loss_gap > {ORDER_GAP} and "
                            f"$example_order.loss_gap > {ORDER_OVER_DRAWS} * $example_order.draw_gap",
        "the loss changed by over 1% when the batch's examples came in reverse order, ten times what it changes "
        "from one random draw to another in their own order (the batch not sorted by any of its tensors, the "
        "model handed the same examples reversed)"),
    "minimises_its_reward": NamedRule(
        ("labels",), f"$labels.reward_push_correlation != none and $labels.reward_push_correlation < "
                     f"{REWARD_PUSHED_DOWN}",
        "the loss weighs each action by a float named as a reward, and minimised it makes the better-rewarded "
        "actions rarer: the push the reward makes on each action's score ranks against the reward (under -0.5)"),
    "collapsed": NamedRule(
        ("outputs", "labels"), f"$labels.paired_views != none and $outputs.least_spread != none and "
                               f"$outputs.least_spread < {COLLAPSED_SPREAD}",
        "the model is handed two views of each example, and one of its outputs is nearly the same vector for "
        "every input: scaled to unit length, it spreads over the examples under a quarter of what outputs spread "
        "over every direction do"),
    # Everything the run's loss handed a loss on raw scores lay in [0, 1], spread over half of it: probabilities
    # squashed again by that loss's own sigmoid or softmax (raw scores that small and that spread, never once
    # negative, are not seen; an untrained model's near-constant scores are not read).
    "squashed_twice": NamedRule(
        ("outputs",), f"$outputs.scores_squashed and $outputs.scores_max - $outputs.scores_min >= {SQUASHED_SPREAD}",
        "every value the run's loss handed binary_cross_entropy_with_logits or cross_entropy lay in [0, 1], "
        "spread over half of it"),
    # The loss is finite on confident predictions but its gradient is not: training runs until one example is
    # that sure, and then that step's gradient is NaN for the whole batch (a focal loss with gamma under 1).
    "nan_when_confident": NamedRule(
        ("outputs",), "$outputs.unstable_margin != none",
        "the run's loss is finite where the model is sure of every example (a margin of 10 to 30 logits on its "
        "class), but its gradient on the output is not"),
    "loss_of_its_own": NamedRule(
        ("outputs",), f"$outputs.gradient_vs_standard > {OWN_LOSS_GRADIENT}",
        "the gradient the run's loss sends into the output differs from the standard loss's by over 5%"),
    "not_a_weighting": NamedRule(
        ("outputs",), f"$outputs.weighting_spread == none or $outputs.weighting_spread > {WEIGHTED_STANDARD}",
        "the run's loss is not the standard one with a weight per class (or per column's positives and "
        "negatives), or that could not be told"),
    "standard_says_nothing_learned": NamedRule(
        ("outputs",), f"$outputs.standard_level_ratio > {NOTHING_LEARNED}",
        "by the standard loss, the model is at 90% of the loss of learning nothing or above"),
    "standard_says_learned": NamedRule(
        ("outputs",), f"$outputs.standard_level_ratio < {CONVERGED}",
        "by the standard loss, the model is under a tenth of the loss of learning nothing: it learned the task"),
    "above_half_learned_nothing": NamedRule(
        ("replay",), f"$replay.level_ratio > {HALF_LEARNED}",
        "the replay ended above half the loss of learning nothing"),
    "learned_little": NamedRule(
        ("replay",), f"$replay.level_ratio > {LEARNED_LITTLE}",
        "the replay ended at 80% of the loss of learning nothing or above"),
    "starts_near_chance": NamedRule(
        ("init",), f"$init.checkpoint_ratio > {LEARNED_LITTLE}", "the checkpoint's loss is above 0.8 ln K"),
    "log_overfits": NamedRule(
        ("history",), f"$history.val_ratio > {VAL_ABOVE_BEST} and $history.train_ratio_since_val_best < {STALL_LOSS_RATIO}",
        "in the run's own log, validation ended 10% above its best while training fell another 10% since"),
    # ... and its validation loss was never under the loss of learning nothing (that prediction scored on the
    # validation batches), while training fell under half of it: what the training labels taught holds on no
    # validation example on average (training labels that follow the row, not the example). Only for a log in
    # the run's own units: its first training loss at most 1.5x the level, its last validation loss within
    # 1.5x of the validation loss measured at the checkpoint (a sum over batches, a perplexity are not).
    "val_never_learned": NamedRule(
        ("history",), f"$history.val_best > $history.val_nothing_level and $history.loss_last < {MEMORISES} * "
                      f"$history.nothing_level and $history.loss_first <= {LOG_IN_RUN_UNITS} * $history.nothing_level "
                      f"and $history.val_last <= {LOG_IN_RUN_UNITS} * $history.val_checkpoint "
                      f"and $history.val_checkpoint <= {LOG_IN_RUN_UNITS} * $history.val_last",
        "in the run's own log, validation never went under the loss of learning nothing (scored on the validation "
        "batches), while training fell under half of it"),
    # Memorised before the checkpoint: training under half the loss of learning nothing, validation (its first
    # measure in the replay, before the replay can have moved it) above that loss scored on the validation
    # batches: the model predicts held-out examples worse than a constant would.
    "memorised_past_nothing": NamedRule(
        ("replay",), f"$replay.level_ratio < {MEMORISES} and $replay.val_start > $replay.val_nothing_level",
        "the replay's training loss sits under half the loss of learning nothing while its validation loss, from "
        "its first measure, is above that loss scored on the validation batches"),
    "trains_on": NamedRule(
        ("replay",), f"$replay.loss_ratio < {CLEAR_STALL_LOSS_RATIO}", "the replay's loss fell 5% or more"),
    "ranks_share_batches": NamedRule(
        ("rank_data",), f"$rank_data.world_size > 1 and $rank_data.identical_batch_fraction > {RANKS_SHARE}",
        "a distributed run's ranks trained on identical batches over half the time"),
    "ranks_share_examples": NamedRule(
        ("rank_data",), f"$rank_data.world_size > 1 and $rank_data.identical_batch_fraction <= {RANKS_SHARE} and "
                        f"$rank_data.shared_example_fraction > {RANKS_SHARE}",
        "a distributed run's ranks' batches differ, but over half their examples are shared"),
    "vanishing": NamedRule(
        ("flow",), f"$flow.early_late_ratio < {VANISHING} and $flow.early_late_ratio > 0",
        "the earliest layers' gradient norm is under 1% of the latest layers' (and not zero)"),
    "weights_shrank": NamedRule(
        ("replay", "init"),
        f"$replay.weight_norm_ratio < {SHRANK_OVER_REPLAY} or $init.weight_norm_vs_init < {SHRANK_SINCE_INIT}",
        "the weights' norm fell 20% over the replay, or is under half of setup()'s fresh init's"),
    "labels_at_chance": NamedRule(
        ("labels",),
        f"$labels.is_classification and $labels.knn_agreement < $labels.chance_agreement + {KNN_OVER_CHANCE}",
        "a classifier's labels: nearest neighbours in input space agree on them no more than chance (+0.1)"),
    # Labels beyond the outputs that the loss ran on clean (label_check ran it on the batches holding them):
    # it may read them otherwise on purpose (CORAL's levels) or misread them where triage does not look.
    "labels_unread_out_of_range": NamedRule(
        ("labels",),
        "$labels.is_classification and not $labels.target_ambiguous and $labels.out_of_range_count > 0 "
        "and $labels.out_of_range_read == false",
        "a classifier's labels lie outside the range of its outputs, and its loss ran on them without complaint"),
    "runs_off": NamedRule(
        ("replay", "init"),
        f"$replay.loss_start < 0 and ($replay.loss_end < {RUNS_OFF} * $replay.loss_start or "
        f"($replay.loss_end < {RUNS_FAR} * $replay.loss_start and ($replay.fall_kept == none or $replay.fall_kept > "
        f"{FALL_KEPT}) and ("
        "($init.loss_setup_init > 0 and $replay.loss_end < $replay.loss_start - $init.loss_setup_init) or "
        "($init.loss_setup_init < 0 and $replay.loss_end < $replay.loss_start + $init.loss_setup_init))))",
        "the replay's loss, below zero at its start, ends 100 times as far below zero, or half as far again, "
        "without slowing, by a fall larger than the whole loss at setup()'s init: it falls without bound"),
    "views_unpaired": NamedRule(
        ("labels",), f"$labels.pair_lift < {UNPAIRED_LIFT} and $labels.pair_examples >= {PAIRED_EXAMPLES}",
        "the two views the model is handed pair no better than at random: an example's nearest neighbour by its "
        "first view has a second view no nearer its own than a random example's"),
    # Soft targets (a teacher's cached logits) beside labels that carry signal: their top class agrees with
    # input-space neighbours no more than chance (+0.1) while the labels agree above it: they were paired with
    # other examples (a cache indexed by batch position across shuffles).
    "soft_targets_at_chance": NamedRule(
        ("labels",),
        f"$labels.soft_knn_agreement < $labels.soft_chance_agreement + {KNN_OVER_CHANCE} and "
        f"$labels.knn_agreement >= $labels.chance_agreement + {KNN_OVER_CHANCE}",
        "a classifier's soft targets: their top class agrees with input-space neighbours no more than chance "
        "(+0.1), while its labels agree above it"),
    # Next-token prediction is 1 place ahead; labels moved by the dataset and again by the model's loss (a
    # Hugging Face causal LM shifts them inside) make it 2: a slower, noisier task, and no label out of range.
    "shifted_twice": NamedRule(
        ("labels",), "$labels.predicts_ahead > 1",
        "a sequence model's labels, moved from its input tokens by the data and again by its loss, train each "
        "output on a token more than 1 place ahead"),
    "labels_copy_their_input": NamedRule(
        ("labels",), f"$labels.label_shift == 0 and $labels.majority_fraction >= {COPIED_MAJORITY} and "
                     f"$labels.labelled_share < {COPIED_PLACES}",
        "a sequence model's labels, on under half of the places, are the input token at their own place, and "
        "half or more of them are one token: each output is trained to copy what it is handed, mostly that one "
        "token"),
    # A sequence model's targets (token ids of a translation, a summary): an example's target resembles its
    # input-space neighbour's within a tenth of chance, on the scale from chance to identical.
    "sequence_targets_at_chance": NamedRule(
        ("labels",), f"$labels.target_lift < {KNN_OVER_CHANCE}",
        "a sequence model's targets resemble the targets of their nearest neighbours in input space no more "
        "than a random example's (within a tenth of the way from chance to identical)"),
    "targets_carry_nothing": NamedRule(
        ("labels",), f"not $labels.is_classification and $labels.knn_target_correlation < {KNN_TARGET_CORRELATION}",
        "a regressor's targets correlate under 0.1 with those of their nearest neighbours in input space"),
    # Or it ends under half the loss of learning nothing: a model that already nearly fits the two examples
    # (a tabular net starting at 0.29 on them, chance 0.67) has little left to halve. Or it more than halved
    # its distance to a perfect prediction: a listwise loss over 2 slates falls from 3.1 towards their grades'
    # entropy (2.5), never to half of 3.1.
    "memorises": NamedRule(
        ("replay",), f"$replay.loss_ratio < {MEMORISES} or $replay.level_ratio < {MEMORISES} "
                     f"or $replay.perfect_gap_ratio < {MEMORISES}",
        "the replay (on a tiny subset) more than halved its loss or its distance to a perfect prediction's loss, "
        "or ended under half the loss of learning nothing: the model learns what it is given"),
    "val_rises": NamedRule(
        ("replay",), f"$replay.val_ratio > {VAL_ABOVE_BEST} and $replay.val_end > {VAL_ABOVE_START} * $replay.val_start "
                     f"and ($replay.val_noise == none or $replay.val_end - $replay.val_end / $replay.val_ratio > "
                     f"{VAL_RISE_NOISE} * $replay.val_noise) and ($replay.nothing_level == none or "
                     f"$replay.val_end - $replay.val_end / $replay.val_ratio >= {VAL_RISE_SIZE} * $replay.nothing_level)",
        "the replay's validation loss ended 10% above its best and 2% above where it started, and above its best by "
        "more than three times its own noise and by 0.5% of the loss of learning nothing"),
    "keeps_gradients": NamedRule(
        ("loop",), f"$loop.stale_gradient_share >= {STALE_STEPS}",
        "one optimizer of several was given its previous step's gradient again (plus the new ones) on half "
        "its steps or more: nothing reset its gradients between steps"),
    "takes_foreign_gradients": NamedRule(
        ("loop",), f"$loop.foreign_gradient_share >= {STALE_STEPS}",
        "one optimizer of several was given, besides its own loss's gradient, the gradient of a backward only the "
        "others stepped on, pointing against its own, on half its steps or more: its gradients were reset before "
        "that backward, not after"),
    # A loss of a kind with neither level (a policy surrogate, a GAN's pair, a contrastive or ranking loss, a
    # likelihood): a flat stretch of it is no symptom by itself; it is read by its counterfactuals alone.
    "levelless": NamedRule(
        ("replay",), '$replay.status == "ok" and $replay.nothing_level == none and $replay.loss_floor == none',
        "the replay ran, and neither the loss of learning nothing (a constant prediction) nor the loss's floor (its "
        "value on a perfect prediction) could be measured for the run's loss"),
    # The loss dropped less than the stall threshold (a 10% drop), whatever its level.
    "flat": NamedRule(
        ("replay",), f"$replay.loss_ratio > {STALL_LOSS_RATIO}",
        "the replay's loss dropped under 10%"),
    "precision_trains": NamedRule(
        ("bf16", "fp32"),
        # `== true`: a precision replay that did not run (not applicable, raised) counts as not training, so a
        # gate on this rule is not left unknown.
        f"($bf16.finite == true and $bf16.better == true and $bf16.loss_ratio < {STALL_LOSS_RATIO}) "
        f"or ($fp32.finite == true and $fp32.better == true and $fp32.loss_ratio < {STALL_LOSS_RATIO})",
        "in bf16 or fp32, from the checkpoint, the run stays finite, its loss falls 10% or more and ends clearly "
        "below the run's (a replay that did not run does not count)"),
    "learns": NamedRule(
        ("replay",), f"$replay.finite and $replay.loss_ratio < {STALL_LOSS_RATIO}",
        "the replay stayed finite and its loss dropped 10% or more"),
    "barely_trained": NamedRule(
        ("init", "replay"),
        f"$init.loss_checkpoint > {LITTLE_SINCE_INIT} * $init.loss_setup_init or $replay.level_ratio > "
        f"{NOTHING_LEARNED}",
        "the checkpoint's loss is above 80% of a fresh init's, or the replay learned nothing"),
}
