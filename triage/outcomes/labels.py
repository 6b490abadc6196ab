"""What label_check measures: labels out of range, a single class, class-ordered batches, and labels or
targets unrelated to the inputs (triage/experiments/labels.py)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from triage.outcomes.base import Outcome

NEIGHBOURS = 5  # regression: the mean of 5 neighbours' targets; one neighbour's is too noisy on small snapshots


class LabelShift(Outcome):
    """How far ahead a sequence model's labels make it predict (triage/experiments/label_shift.py)."""

    label_shift: Optional[int] = Field(
        default=None, description="Labels that are the input tokens moved by this many places (0: the tokens "
                                  "themselves, 1: the next token), where one shift accounts for 90% of them; "
                                  "none for labels of another kind.",
        json_schema_extra={"words": "places the labels are moved from the inputs"})
    shift_agreements: list[Optional[float]] = Field(
        default_factory=list, description="For 0, 1 and 2 places: the share of labels that are the input token "
                                          "that many places on.",
        json_schema_extra={"words": "labels equal to the token 0, 1, 2 places on"})
    labelled_share: Optional[float] = Field(
        default=None, description="The share of the (B, T) places that carry a label (not ignore_index): about "
                                  "0.15 for masked-LM labels, 1 for a language model's or an autoencoder's.",
        json_schema_extra={"words": "places that carry a label"})
    model_shifts_labels: Optional[bool] = Field(
        default=None, description="The run's loss scores the output at t against the label at t + 1 (the model "
                                  "shifts its labels inside, as Hugging Face's *ForCausalLM do); false where "
                                  "against the label at t; none where neither matches the loss.",
        json_schema_extra={"words": "the loss shifts the labels"})
    predicts_ahead: Optional[int] = Field(
        default=None, description="The tokens ahead of its input each output is trained to predict: the labels' "
                                  "shift plus the loss's (1 for next-token prediction).",
        json_schema_extra={"words": "places ahead each output is trained to predict"})


class LabelCheckOutcome(LabelShift):
    target_broadcast: Optional[str] = Field(
        default=None, description="A loss of torch.nn.functional (mse_loss, gaussian_nll_loss, ...) the run's loss hands "
                                  "a prediction and a target of shapes that broadcast to a larger one: every "
                                  "prediction scored against every target of the batch. None where none does.",
        json_schema_extra={"words": "target broadcast"})
    is_classification: bool = Field(
        description="Batches carry integer labels and the model outputs >= 2 scores.",
        json_schema_extra={"words": "is classification"})
    num_classes: Optional[int] = Field(
        default=None, description="K, the number of scores the model outputs (the logits' last dim).",
        json_schema_extra={"words": "classes"})
    label_min: Optional[int] = Field(default=None, json_schema_extra={"words": "label min"})
    label_max: Optional[int] = Field(default=None, json_schema_extra={"words": "label max"})
    labels_seen: int = Field(
        default=0, description="Labels counted (ignore_index left out).",
        json_schema_extra={"words": "labels seen"})
    out_of_range_count: int = Field(
        default=0, description="Labels < 0 or >= K.",
        json_schema_extra={"words": "out of range count"})
    out_of_range_read: Optional[bool] = Field(
        default=None, description="The run's loss raised on the first snapshot batch holding a label out of range "
                                  "(it reads the labels as class indices: cross_entropy, nll_loss, a gather, "
                                  "one_hot all raise on one), or handed a binary cross-entropy a target outside "
                                  "[0, 1] (a mask saved as 0/255). False: it ran, so it reads them otherwise (an "
                                  "ordinal grade turned into levels, an example id). None: no label out of range.",
        json_schema_extra={"words": "loss could not take an out-of-range label"})
    distinct_labels: int = Field(default=0, json_schema_extra={"words": "distinct labels"})
    single_class: bool = Field(default=False, json_schema_extra={"words": "single class"})
    majority_fraction: Optional[float] = Field(
        default=None, description="Share of the most frequent label.",
        json_schema_extra={"words": "majority share", "unit": "%"})
    single_class_batch_fraction: Optional[float] = Field(
        default=None, description="Batches holding one class.",
        json_schema_extra={"words": "single class batch share", "unit": "%"})
    batch_class_ratio: Optional[float] = Field(
        default=None, description="Mean distinct classes per batch / the mean a shuffled batch of that size would "
                                  "hold: ~1 shuffled, << 1 when batches come sorted by class.",
        json_schema_extra={"words": "batch class ratio", "unit": "×"})
    class_ordered: bool = Field(
        default=False, description="batch_class_ratio < 0.6 with several classes.",
        json_schema_extra={"words": "class ordered"})
    knn_agreement: Optional[float] = Field(
        default=None, description="Share of examples whose nearest neighbour in input space has their label.",
        json_schema_extra={"words": "nearest-neighbour agreement"})
    chance_agreement: Optional[float] = Field(
        default=None, description="Sum of class frequency squared.",
        json_schema_extra={"words": "chance agreement"})
    knn_examples: int = Field(default=0, json_schema_extra={"words": "nearest-neighbour examples"})
    paired_views: Optional[list[str]] = Field(
        default=None, description="A run whose loss reads no labels, its model handed two floating views of each "
                                  "example (an image and its caption, two augmentations): the two, by their place "
                                  "in the batch.",
        json_schema_extra={"words": "paired views"})
    pair_lift: Optional[float] = Field(
        default=None, description="How well the views pair row by row: 1 - 2 x the mean rank of an example's "
                                  "first-view nearest neighbour's second view among the others', by distance from "
                                  "its own second view; ~0 where rows are paired with other examples' views.",
        json_schema_extra={"words": "views' pairing over chance"})
    pair_examples: int = Field(default=0, json_schema_extra={"words": "paired examples compared"})
    example_weights: Optional[str] = Field(
        default=None, description="A float per example that the loss reads beside the labels (a policy gradient's "
                                  "returns or advantages, an importance weight): the loss weighs each label's "
                                  "log-likelihood by it, and may go below zero by design. Its place in the batch.",
        json_schema_extra={"words": "example weights"})
    other_terms_gradient: Optional[float] = Field(
        default=None, description="The gradient the loss sends the weights through its terms other than nll_loss / "
                                  "cross_entropy, over the one those send, on the first batch: 0 where the loss is "
                                  "the class log-likelihood alone; near 1 or more where another term (a point "
                                  "process's integral of its intensities) weighs as much.",
        json_schema_extra={"words": "gradient of the loss's other terms over its class terms'", "unit": "×"})
    reward_name: Optional[str] = Field(
        default=None, description="A float per example the loss reads, named as a reward (returns, rewards, "
                                  "advantages), whose values move the loss's gradient on the actions: its place in "
                                  "the batch.",
        json_schema_extra={"words": "reward read by the loss"})
    reward_push_correlation: Optional[float] = Field(
        default=None, description="The rank correlation, within a batch, between that reward's change when its "
                                  "values are shuffled across the batch and the change in how far the loss raises "
                                  "each action's score. Near +1 where minimising the loss makes the better-rewarded "
                                  "actions likelier, near -1 where it makes them rarer.",
        json_schema_extra={"words": "reward against the loss's push on each action"})
    soft_target: Optional[str] = Field(
        default=None, description="Soft targets the loss reads beside the labels (a teacher's cached logits): a "
                                  "floating (B, K) tensor of the batch, by its place in it.",
        json_schema_extra={"words": "soft targets"})
    soft_knn_agreement: Optional[float] = Field(
        default=None, description="Share of examples whose nearest neighbour in input space has their soft "
                                  "targets' top class: near chance where the soft targets belong to other examples.",
        json_schema_extra={"words": "soft targets' nearest-neighbour agreement"})
    soft_chance_agreement: Optional[float] = Field(
        default=None, description="Sum of the soft targets' top-class frequencies squared.",
        json_schema_extra={"words": "soft targets' chance agreement"})
    target: Optional[str] = Field(
        default=None, description="The batch tensor read as the class labels: the integer tensor the loss reads (by "
                                  "its place in the batch, e.g. [1]), else the last integer tensor.",
        json_schema_extra={"words": "target"})
    target_ambiguous: bool = Field(
        default=False, description="The loss reads several integer tensors of the batch (targets and their lengths, "
                                   "say): the largest was taken for the labels, and range checks on it are not proof "
                                   "of a label bug.",
        json_schema_extra={"words": "target ambiguous"})
    target_lift: Optional[float] = Field(
        default=None, description="Sequence targets (a translation's token ids beside its source's): how much more "
                                  "an example's target resembles the target of its nearest neighbour in input "
                                  "space than a random other example's, (nearest - chance) / (1 - chance), as "
                                  "bags of tokens weighted by rarity; ~0 when targets were paired with other "
                                  "examples' inputs.",
        json_schema_extra={"words": "target likeness to the nearest input's target, over chance"})
    target_lift_examples: int = Field(default=0, json_schema_extra={"words": "sequence examples compared"})
    knn_target_correlation: Optional[float] = Field(
        default=None, description="Regression: correlation of each example's target with the mean target of its "
                                  f"{NEIGHBOURS} nearest neighbours in input space: ~0 when the targets are "
                                  "unrelated to the inputs (shuffled apart from them).",
        json_schema_extra={"words": "nearest-neighbour target correlation"})
