"""How the judge reads an experiment's raw measurements: where an experiment turns what it measured into a
figure or a flag a rule reads (an outlier batch, an init that is PyTorch's default, sorted batches, a loop
that accumulates), the threshold is here, with what it means, and the experiment asks for it.

Each was measured on healthy runs against broken ones; the sentence says what separates them.
"""

from __future__ import annotations

from typing import Optional

# init_loss: two draws of one init scheme give weight spreads within a few % of each other; a custom
# scheme (a 10x smaller init, Xavier where Kaiming is the default) differs by 2x or more.
DEFAULT_SPREAD_TOLERANCE = 1.25

# label_check: batches whose distinct classes average under 60% of what a shuffled batch holds are sorted by
# class (2 balanced classes sorted score ~0.5, 10 classes ~0.15; shuffled ones ~1).
CLASS_ORDERED = 0.6

# loop_diff: a gradient summed instead of replaced is, after k steps, about sqrt(k) (uncorrelated) to k
# (aligned) times a fresh one: an optimizer step that used more than 1.5x a fresh gradient accumulates (1.5
# is clear of both 1, zeroed each step, and sqrt(10), step 10). A first step under 0.6 of a fresh gradient
# is the loop's own division of its loss over micro-batches (1/k, k >= 2); later steps are read against it.
GRADIENT_GROWTH = 1.5
SCALED_MICRO_BATCHES = 0.6

# batch_scan: a batch whose log loss or log gradient norm lies over 6 robust z (median, MAD) from the rest is
# an outlier (minibatch noise on the runs benchmarked stays under 4); the MAD is floored at 0.1 so that a
# snapshot of near-identical batches does not make every small difference an outlier.
OUTLIER_Z = 6.0
OUTLIER_MAD_FLOOR = 0.1

# levels: a loss has a floor (its value on a perfect prediction) only where that value lies under half the
# constant prediction's: a loss whose "perfect" scores about as much as predicting the mean measures no floor.
FLOOR_BELOW_CONSTANT = 0.5

# activation_health: a sigmoid unit outside [0.01, 0.99], a tanh unit with |y| above 0.99, is saturated (its
# gradient under 1% of its slope at 0).
SATURATED = 0.99

# label_check: labels that are the input tokens moved by k places agree with them at nearly every labelled
# place (padding and a document's boundary aside); labels of another kind (tags, a target sentence) agree by
# chance, well under half.
SHIFT_AGREEMENT = 0.9
# label_check: the run's loss is the cross-entropy of its scores at t against the labels at t + 1 (the model
# shifts them inside) where it equals that to fp32 rounding and is clear of the unshifted one: two readings of
# one forward differ in their last bits, and a shift by one token changes the loss by far more than 1%.
SAME_LOSS = 1e-3
OTHER_LOSS = 1e-2

# lr_range_test: the sweep stops once its smoothed loss passes 4x the best it reached: diverged.
LR_RANGE_DIVERGED = 4.0

# replay: a rise of the loss counts on the running median of 5 steps: a spike that matters lasts; one hard
# batch is batch_scan's business.
RISE_WINDOW = 5


def same_init_scheme(ratios: list[float]) -> bool:
    """Each weight matrix's spread at setup()'s init over the default init's, all within the tolerance."""
    return all(1 / DEFAULT_SPREAD_TOLERANCE <= r <= DEFAULT_SPREAD_TOLERANCE for r in ratios)


def class_ordered(distinct_labels: int, batch_class_ratio: Optional[float]) -> bool:
    """The batches are sorted by class (see CLASS_ORDERED)."""
    return distinct_labels > 1 and batch_class_ratio is not None and batch_class_ratio < CLASS_ORDERED


def label_shift(agreements: list[Optional[float]]) -> Optional[int]:
    """The places the labels are moved from the input tokens (agreements[k]: the share of labels that are the
    token k places on), where one shift accounts for them (see SHIFT_AGREEMENT); None where none does."""
    return next((k for k, share in enumerate(agreements) if share is not None and share >= SHIFT_AGREEMENT), None)


def scores_shifted(loss: float, unshifted: float, shifted: float) -> Optional[bool]:
    """Whether the run's loss scores the output at t against the label at t + 1 (True) or at t (False);
    None where it is neither (a loss with other terms, label smoothing, another reduction)."""
    def same(a: float, b: float, tolerance: float) -> bool:
        return abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-12)
    if same(loss, shifted, SAME_LOSS) and not same(loss, unshifted, OTHER_LOSS):
        return True
    if same(loss, unshifted, SAME_LOSS) and not same(loss, shifted, OTHER_LOSS):
        return False
    return None


def has_floor(constant: Optional[float], perfect: Optional[float]) -> bool:
    """A perfect prediction's loss well under the constant prediction's: the loss has a floor there."""
    return perfect is not None and constant is not None and perfect < FLOOR_BELOW_CONSTANT * constant
