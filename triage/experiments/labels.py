"""Label checks for classification: labels out of range of the logits, a single class, class-ordered
batches, labels unrelated to the inputs (nearest-neighbour agreement vs chance), and a sequence model's
labels against its input tokens (how far ahead they make it predict); for regression, targets unrelated to
the inputs (correlation with the neighbours' targets)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.experiments.fingerprint import graph_membership
from triage.experiments.label_shift import measure_shift
from triage.experiments.levels import regression_target, top_output
from triage.experiments.pairing import pair_lift, paired_views
from triage.experiments.loss_inputs import binary_targets, loss_broadcast, other_terms_gradient
from triage.experiments.neighbours import leave_one_out_agreement
from triage.experiments.sequence_targets import distinct_inputs, target_lift, token_bags
from triage.batches import named_tensors, replace_tensor, to_device
from triage.experiments.probes import (IGNORE_INDEX, class_targets, example_weights, input_tensor, labels_unread,
                                       loss_reads, model_output, reward_push)
from triage.outcomes.labels import NEIGHBOURS, LabelCheckOutcome
from triage.judge.readings import class_ordered
from triage.experiments.training import autocast, untouched_buffers_and_rng


class LabelCheckParams(Params):
    knn_examples: int = Field(default=2000, ge=10, description="Examples used for the neighbour agreement.")
    ignore_index: int = Field(default=IGNORE_INDEX, description="A target value that marks padding, not a class.")
    max_vocabulary: int = Field(default=1024, ge=2, description="Token inputs with ids beyond this are not "
                                                               "compared (a count vector per example would be too wide).")


def measure(ctx: Context, p: LabelCheckParams) -> LabelCheckOutcome:
    outcome = _labels(ctx, p)
    if outcome.is_classification or (class_targets(ctx.session.batches[0]) is not None and not labels_unread(ctx.session)):
        return outcome
    # No labels read: where the model is handed two views of each example, and the loss itself reads no float
    # beside them (a regressor's target), their pairing is the supervision.
    views = paired_views(ctx.session)
    if views and not set(loss_reads(ctx.session.setup, ctx.session.batches[0], ctx.session.device).floats_by_loss) \
            <= set(views):
        views = None
    lift, compared = pair_lift(ctx.session.batches, views, p.knn_examples) if views else (None, 0)
    return outcome.model_copy(update=dict(paired_views=list(views) if views else None, pair_lift=lift,
                                          pair_examples=compared))


def _labels(ctx: Context, p: LabelCheckParams) -> LabelCheckOutcome:
    session = ctx.session
    batches = session.batches
    broadcast = loss_broadcast(session.setup, batches[0], session.device)
    ctx.restart()
    if labels_unread(session):
        return LabelCheckOutcome(is_classification=False, knn_target_correlation=_knn_target_correlation(session, p),
                                 target_broadcast=broadcast)
    reads = loss_reads(session.setup, batches[0], session.device) if class_targets(batches[0]) is not None else None
    read = reads.by_loss if reads is not None else []
    ctx.restart()
    # The labels are what the loss reads; of several (targets and lengths), the largest tensor.
    target = max(read, key=lambda name: dict(named_tensors(batches[0]))[name].numel()) if read else None
    targets = [dict(named_tensors(b)).get(target) for b in batches] if target else [class_targets(b) for b in batches]
    logits = model_output(session.setup, batches[0], session.device) if targets[0] is not None else None
    ctx.restart()  # the probe's forward may have moved BatchNorm statistics
    if targets[0] is None or logits is None or logits.shape[-1] < 2 or not _paired(targets[0], logits):
        return LabelCheckOutcome(is_classification=False, knn_target_correlation=_knn_target_correlation(session, p),
                                 target_broadcast=broadcast)
    k = int(logits.shape[-1])
    per_batch = [t.reshape(-1)[t.reshape(-1) != p.ignore_index].long().cpu() for t in targets if t is not None]
    labels = torch.cat(per_batch)
    if labels.numel() == 0:
        return LabelCheckOutcome(is_classification=True, num_classes=k, target_broadcast=broadcast)
    counts = torch.unique(labels, return_counts=True)[1]  # not bincount: one label of 1e9 would need GBs
    read_as_indices = _out_of_range_read(ctx, targets, k, p.ignore_index)
    if read_as_indices is False and counts.numel() > labels.numel() / 2:
        # The loss ran on values no class index can take, nearly one per example: an example's id, not a label.
        return LabelCheckOutcome(is_classification=False, knn_target_correlation=_knn_target_correlation(session, p),
                                 target_broadcast=broadcast, out_of_range_read=False)
    distinct = int(counts.numel())
    single_batches = sum(int(t.unique().numel()) == 1 for t in per_batch if t.numel())
    single_batch_fraction = single_batches / max(1, sum(1 for t in per_batch if t.numel()))
    frequencies = counts.double() / labels.numel()
    ratio = _batch_class_ratio(per_batch, frequencies)
    knn, used = _knn_agreement(batches, p)
    floats_read = reads.floats_by_loss if reads is not None else []
    soft = _soft_target(batches[0], k, floats_read)
    soft_knn, soft_chance = _soft_agreement(batches, soft, p) if soft else (None, None)
    name = target or _name_of(batches[0], targets[0])
    shift = measure_shift(session.setup, batches[0], name, session.device, p.ignore_index)
    if shift.shift_agreements:  # the loss ran a forward, as the probe's above
        ctx.restart()
    lift, compared = target_lift(batches, name, k, p.ignore_index, p.max_vocabulary, p.knn_examples)
    pushed = reward_push(session)
    others = other_terms_gradient(session.setup, batches[0], session.device)
    return LabelCheckOutcome(
        **shift.model_dump(), target_lift=lift, target_lift_examples=compared,
        is_classification=True, num_classes=k, target=name, target_broadcast=broadcast,
        target_ambiguous=len(read) > 1,
        label_min=int(labels.min()), label_max=int(labels.max()), labels_seen=int(labels.numel()),
        out_of_range_count=int(((labels < 0) | (labels >= k)).sum()),
        out_of_range_read=read_as_indices,
        distinct_labels=distinct, single_class=distinct == 1,
        majority_fraction=float(frequencies.max()),
        single_class_batch_fraction=single_batch_fraction,
        batch_class_ratio=ratio,
        class_ordered=class_ordered(distinct, ratio),
        knn_agreement=knn, chance_agreement=float((frequencies ** 2).sum()) if knn is not None else None,
        knn_examples=used, soft_target=soft, soft_knn_agreement=soft_knn, soft_chance_agreement=soft_chance,
        example_weights=example_weights(session), other_terms_gradient=others,
        reward_name=pushed.name if pushed else None,
        reward_push_correlation=pushed.correlation if pushed else None,
    )


def _paired(targets: torch.Tensor, logits: torch.Tensor) -> bool:
    """The integer tensor can be the labels of these scores: one per example row (the first dims agree), or
    one per score vector (a sequence's tokens). A link predictor's node-pair indices, (2, E) against (N, D)
    node embeddings, are neither: they index the output, they do not label it."""
    if targets.dim() == 0:
        return False
    return targets.shape[0] == logits.shape[0] or targets.numel() * logits.shape[-1] == logits.numel()


def _out_of_range_read(ctx: Context, targets: list, k: int, ignore_index: int) -> Optional[bool]:
    """Whether the run's loss, on a snapshot batch holding a label < 0 or >= K (up to OUT_OF_RANGE_BATCHES of
    them), raises or hands a binary cross-entropy a target outside [0, 1]: it reads the labels as class
    indices or probabilities. False: it ran clean on every one. None: no label is out of range, or the run is
    not on the CPU (there a CUDA assert on an index would end the walk)."""
    session = ctx.session
    holding = [b for b, t in zip(session.batches, targets) if t is not None and _out_of_range(t, k, ignore_index)]
    if not holding or torch.device(session.device).type != "cpu":
        return None
    for batch in holding[:OUT_OF_RANGE_BATCHES]:
        try:
            with binary_targets() as beyond, torch.no_grad(), untouched_buffers_and_rng(session.setup.model), \
                    autocast(session.setup.precision, session.device):
                session.setup.loss_fn(session.setup.model, to_device(batch, session.device))
        except Exception:  # noqa: BLE001  (whatever it raises: it could not take the label)
            return True
        finally:
            ctx.restart()
        if beyond:
            return True
    return False


OUT_OF_RANGE_BATCHES = 8  # batches holding a label out of range that the loss is run on, at most


def _out_of_range(t: torch.Tensor, k: int, ignore_index: int) -> bool:
    kept = t.reshape(-1)[t.reshape(-1) != ignore_index]
    return bool(((kept < 0) | (kept >= k)).any())


def _name_of(batch, tensor) -> Optional[str]:
    return next((name for name, t in named_tensors(batch) if t is tensor), None)


def _batch_class_ratio(per_batch: list[torch.Tensor], frequencies: torch.Tensor) -> Optional[float]:
    """Observed distinct classes per batch over the expectation for a shuffled batch of the same size.

    A batch of B labels drawn at random holds class c with probability 1 - (1 - p_c)^B.
    """
    sized = [t for t in per_batch if t.numel()]
    if len(sized) < 2:
        return None
    observed = sum(int(t.unique().numel()) for t in sized) / len(sized)
    expected = sum(float((1 - (1 - frequencies) ** t.numel()).sum()) for t in sized) / len(sized)
    return observed / expected


def _soft_target(batch: Any, k: int, floats_read: list[str]) -> Optional[str]:
    """The soft targets the loss reads beside the labels (a teacher's cached logits, a label distribution): a
    floating (B, K) tensor of the batch, K the model's outputs, that is not the model's input."""
    tensors, inputs = dict(named_tensors(batch)), input_tensor(batch, floating=True)
    return next((name for name in floats_read if tensors[name] is not inputs and tensors[name].dim() == 2
                 and tensors[name].shape[-1] == k), None)


def _soft_agreement(batches: list, name: str, p: LabelCheckParams) -> tuple[Optional[float], Optional[float]]:
    """The nearest-neighbour agreement of the soft targets' top class, as `_knn_agreement` reads labels, and its
    chance (the sum of the top classes' frequencies squared)."""
    def top_class(batch: Any) -> Optional[torch.Tensor]:
        soft = dict(named_tensors(batch)).get(name)
        return soft.argmax(dim=-1) if soft is not None and soft.dim() == 2 else None
    agreement, _ = _knn_agreement(batches, p, labels_of=top_class)
    tops = [t.cpu() for t in map(top_class, batches) if t is not None]
    if agreement is None or not tops:
        return None, None
    frequencies = torch.unique(torch.cat(tops), return_counts=True)[1].double()
    return agreement, float(((frequencies / frequencies.sum()) ** 2).sum())


def _knn_agreement(batches: list, p: LabelCheckParams, labels_of=class_targets) -> tuple[Optional[float], int]:
    """Leave-one-out 1-nearest-neighbour agreement of labels, on standardised flattened inputs.

    Only for one label per example (not per token). Floating inputs are compared as they are; token
    ids as bag-of-token counts (which tokens, how often: the order is lost, the content is not).
    Labels that carry information about the inputs agree well above chance; shuffled labels agree
    at chance.
    """
    xs, ys = [], []
    for batch in batches:
        x, y = input_tensor(batch, floating=True), labels_of(batch)
        if x is None:
            x = _token_counts(input_tensor(batch), y, p.max_vocabulary)
        if x is not None and y is not None and y.dim() == 1 and x.shape[0] != y.shape[0]:
            x = _pooled_per_graph(batch, x, y.shape[0])
        if x is None or y is None or y.dim() != 1 or x.shape[0] != y.shape[0]:
            continue
        x, y = x.reshape(x.shape[0], -1).cpu(), y.cpu()  # token counts are built on the CPU
        # Padding labels and non-finite inputs (data_check's finding) would poison the distances.
        keep = (y != p.ignore_index) & torch.isfinite(x).all(dim=1)
        xs.append(x[keep].float())
        ys.append(y[keep].long())
        if sum(len(v) for v in ys) >= p.knn_examples:
            break
    if not ys:
        return None, 0
    x, y = distinct_inputs(torch.cat(xs), torch.cat(ys))
    x, y = x[:p.knn_examples], y[:p.knn_examples]
    if len(y) < 2:
        return None, 0
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)  # (N, D): every feature on the same scale
    return leave_one_out_agreement(x, y), len(y)


def _pooled_per_graph(batch: Any, x: torch.Tensor, graphs: int) -> Optional[torch.Tensor]:
    """A batch of graphs, one label per graph: each graph's node features averaged, and its node count, as
    the graph's features (what a pooling readout sees first). None where no membership vector (a graph id
    per node, 0 to graphs - 1) says which nodes are whose."""
    member = graph_membership(batch, x.shape[0], graphs)
    if member is None:
        return None
    flat = x.reshape(x.shape[0], -1).float()
    counts = torch.zeros(graphs).index_add_(0, member.cpu(), torch.ones(x.shape[0]))
    sums = torch.zeros(graphs, flat.shape[1]).index_add_(0, member.cpu(), flat.cpu())
    return torch.cat([sums / counts.clamp_min(1)[:, None], counts[:, None]], 1)


def _knn_target_correlation(session: Any, p: LabelCheckParams) -> Optional[float]:
    """Leave-one-out: the Pearson correlation of each example's float target (the batch's last floating
    tensor, one value per example) with the mean target of its nearest neighbours, on standardised inputs.
    Where the batch holds lists whose items the model scores each on its own (a query's documents: inputs
    (B, L, F) beside targets (B, L), `_items_scored_alone`), each item is an example, read once (padding
    items, all alike, are one); a forecaster's steps, whose targets depend on the whole window, are not."""
    xs, ys = [], []
    per_item = _items_scored_alone(session)
    for batch in session.batches:
        x, target = input_tensor(batch, floating=True), regression_target(batch, None)
        if x is None or target is None or target is x:
            return None
        if per_item and target.dim() == 2 and x.dim() == 3 and x.shape[:2] == target.shape:
            x, target = x.reshape(-1, x.shape[-1]), target.reshape(-1)
        y = target.reshape(target.shape[0], -1)
        if y.shape[1] != 1 or x.shape[0] != y.shape[0]:
            return None
        x = x.reshape(x.shape[0], -1)
        keep = torch.isfinite(x).all(dim=1) & torch.isfinite(y[:, 0])
        xs.append(x[keep].double().cpu())
        ys.append(y[keep, 0].double().cpu())
        if sum(len(v) for v in ys) >= p.knn_examples:
            break
    if not ys:
        return None
    # Batches padded each to its own longest example (sets, sentences) flatten to different widths: the
    # examples of the width most of them share are read, set against one another.
    widths: Counter = Counter()
    for x in xs:
        widths[x.shape[1]] += len(x)
    width = max(widths, key=widths.get)
    xs, ys = zip(*[(x, y) for x, y in zip(xs, ys) if x.shape[1] == width])
    x, y = torch.cat(xs), torch.cat(ys)
    if per_item:
        x, y = distinct_inputs(x, y)
    x, y = x[:p.knn_examples], y[:p.knn_examples]
    if len(y) <= NEIGHBOURS + 1 or float(y.std()) == 0:
        return None
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    neighbours = distances.topk(NEIGHBOURS, largest=False).indices  # (N, NEIGHBOURS)
    predicted = y[neighbours].mean(1)
    return float(torch.corrcoef(torch.stack([y, predicted]))[0, 1])


def _items_scored_alone(session: Any) -> bool:
    """The first batch holds lists (inputs (B, L, F) beside targets (B, L)) and the model scores each item
    on its own: the items reordered along L, its output (in eval mode) is reordered the same way."""
    batch = session.batches[0]
    x, target = input_tensor(batch, floating=True), regression_target(batch, None)
    if x is None or target is None or target.dim() != 2 or x.dim() != 3 or x.shape[:2] != target.shape \
            or x.shape[1] < 2:
        return False
    name = next((n for n, t in named_tensors(batch) if t is x), None)
    order = torch.roll(torch.arange(x.shape[1]), 1).to(x.device)
    with untouched_buffers_and_rng(session.setup.model):
        output = top_output(session.setup, batch)
        moved = top_output(session.setup, replace_tensor(batch, name, x[:, order])) if name else None
    if output is None or moved is None or output.shape[:2] != target.shape or moved.shape != output.shape:
        return False
    scale = float(output.abs().max()) or 1.0
    return bool(torch.allclose(moved, output[:, order], rtol=1e-4, atol=1e-5 * scale))


def _token_counts(tokens: Optional[torch.Tensor], labels: Optional[torch.Tensor],
                  max_vocabulary: int) -> Optional[torch.Tensor]:
    """(N, V) counts of each token id per example, for integer (N, T) inputs with a small vocabulary."""
    if tokens is None or tokens is labels or tokens.is_floating_point() or tokens.dim() != 2:
        return None
    if tokens.numel() == 0 or tokens.min() < 0 or tokens.max() >= max_vocabulary:
        return None
    return token_bags(tokens, max_vocabulary).float()


LABEL_CHECK = Experiment(
    name="label_check",
    summary="Checks classification labels: out of range for the logits, a single class, class-ordered "
            "batches, agreement with input-space neighbours against chance, and how far ahead a sequence "
            "model's labels make it predict.",
    params=LabelCheckParams,
    outcome=LabelCheckOutcome,
    measure=measure,
)
