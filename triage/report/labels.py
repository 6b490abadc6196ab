"""The one table of what a figure is called where a person reads it: its words, its unit and a one-line
meaning, by the field name report.json keeps. Both report.html and summary.md name figures through it;
tests/test_report_words.py fails on a figure shown without an entry here.

Units: `×` a ratio, `%` a share (stored 0-1, shown in percent), `steps`, `batches`, `σ` (a z-score);
empty where the words say it (a loss, a learning rate, a norm) or it is a count.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple, Optional

from triage.report.words import format_figure


class Label(NamedTuple):
    words: str
    unit: str
    meaning: str


def label(key: str) -> Optional[Label]:
    """The entry of a field (`loss_ratio`) or of a decision's figure (`baseline.loss_ratio`)."""
    entry = LABELS.get(key.rsplit(".", 1)[-1])
    return Label(*entry) if entry else None


def words(key: str, node: Optional[str] = None) -> str:
    """A figure's words; another node's figure (`baseline.max_rise` read at `divergence`) names its node:
    `largest rise of the loss (baseline)`. A field missing from the table shows its name in words."""
    owner, _, field = key.rpartition(".")
    entry = label(field)
    said = entry.words if entry else field.replace("_", " ")
    return f"{said} ({owner})" if owner and owner != node else said


def meaning(key: str) -> str:
    entry = label(key)
    return entry.meaning if entry else ""


def value(key: str, figure: Any) -> str:
    """A figure with its unit: `92.5%` for a share, `1.448×` for a ratio, `40 steps`."""
    entry = label(key)
    unit = entry.unit if entry else ""
    number = figure if isinstance(figure, (int, float)) and not isinstance(figure, bool) else None
    if number is None or not math.isfinite(number):
        return format_figure(figure)
    if unit == "%":
        return f"{100 * number:.3g}%"
    if unit == "×":
        return f"{format_figure(float(number))}×"
    return f"{format_figure(figure)} {unit}" if unit else format_figure(figure)


def shown(key: str, figure: Any, node: Optional[str] = None) -> str:
    """`largest rise of the loss 1.193 × start loss`: words and value, as prose and summary.md write it."""
    return f"{words(key, node)} {value(key, figure)}"


_REFERENCE = re.compile(r"\b([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b")


def condition_words(text: str, node: Optional[str] = None) -> str:
    """A playbook clause in words: `baseline.loss_ratio > 1.5` -> `loss end / start (baseline) > 1.5`."""
    return _REFERENCE.sub(lambda m: words(m.group(0), node), text)


# field: (words, unit, one-line meaning)
LABELS: dict[str, tuple[str, str, str]] = {
    'activation_std_growth_checkpoint': ('activation std growth checkpoint', '', "Std of the last Linear/Conv output over the first's, at the checkpoint."),
    'activation_std_growth_default': ('activation std growth default', '', 'The same at default init.'),
    'activation_std_growth_setup': ('activation std growth setup', '', "The same at setup()'s init."),
    'against': ('compared with', '', 'The experiment that replayed the run as it was.'),
    'anomaly_op': ('anomaly op', '', "The node anomaly mode's NaN check named."),
    'applies': ('applies', '', 'Replicas to compare.'),
    'backward_module': ('backward module', '', 'Module whose forward built the first autograd node with a non-finite grad.'),
    'batch': ('batch', '', ''),
    'batch_class_ratio': ('batch class ratio', '×', 'Mean distinct classes per batch / the mean a shuffled batch of that size would hold.'),
    'batches_checked': ('batches checked', '', ''),
    'batches_compared': ('batches compared', '', ''),
    'batches_scanned': ('batches scanned', '', ''),
    'below_floor': ('went below the lowest possible loss', '', 'A symptom (a term with the wrong sign), never a fix.'),
    'best_lr': ('best LR', '', 'LR at the lowest smoothed loss.'),
    'better': ('clearly better than the run', '', "Ends at most the margin times the run's own end loss."),
    'buffers_nonfinite': ('buffers non-finite', '', 'Of those, buffers (BatchNorm statistics, ...).'),
    'by_design': ('by design', '', 'Parameters that do not train on purpose.'),
    'by_design_fraction': ('by design share', '%', 'Of all parameter elements.'),
    'chance_agreement': ('chance agreement', '', 'Sum of class frequency squared.'),
    'checkpoint_ratio': ('checkpoint ratio', '×', 'loss_checkpoint / ln K.'),
    'checkpoint_step': ('checkpoint step', '', 'Where the run stopped on the schedule.'),
    'chosen': ('setting chosen', '', 'The trial whose replay this is.'),
    'class_ordered': ('class ordered', '', 'batch_class_ratio < 0.6 with several classes.'),
    'clip_threshold': ('gradient clip', '', 'The global-norm clip the replay used (none: no clipping).'),
    'clipped_fraction': ('steps clipped', '%', 'Share of steps whose gradient norm exceeded the clip.'),
    'converged': ('converged', '', 'The estimate settled within tolerance.'),
    'current_lr': ('current LR', '', "The LR the sweep is relative to (the optimizer's at the checkpoint)."),
    'dead_fraction': ('dead units', '%', 'Rectifier units never active.'),
    'default_init_ratio': ('default init ratio', '×', 'loss_default_init / ln K.'),
    'differ_at_checkpoint': ('differ at checkpoint', '', "Parameters that differ at the checkpoint (setup()'s init when none was given)."),
    'differ_at_init': ('differ at init', '', 'Parameters setup() itself builds differently on each rank.'),
    'distinct_labels': ('distinct labels', '', ''),
    'diverged_at_lr': ('diverged at LR', '', 'LR where the loss blew up, if it did.'),
    'domain_edge': ('domain edge', '', 'The op has an edge to its domain where finite inputs give NaN/Inf (a log, a division, a square root, a power, ...); false for ops that only overflow.'),
    'drifted': ('drifted', '', 'Parameters equal at the checkpoint that differ after the replay.'),
    'duplicate_fraction': ('duplicate share', '%', 'duplicates / val_examples; unknown where examples are not rows.'),
    'duplicates': ('duplicates', '', 'Val examples whose input is also a train example.'),
    'early_late_ratio': ('early late ratio', '×', 'Median grad norm of the first quarter of weight matrices (dim >= 2) over that of the last quarter.'),
    'edge': ('stable limit of sharpness', '', 'The largest sharpness this optimizer at this LR keeps stable (2/lr for SGD).'),
    'edge_ratio': ('sharpness / stable limit', '×', "Above 1: past the edge of stability at the run's learning rate."),
    'estimates': ('estimates', '', "The power iteration's estimate per step."),
    'eval_after_step': ('eval after step', '', 'The model was in eval mode after a user step.'),
    'eval_forward_fraction': ('eval forward share', '%', "Share of the user's forwards in eval mode."),
    'expected_loss': ('loss of uniform guessing', '', 'ln K for K classes.'),
    'explanation': ('explanation', '', 'What the pattern points to.'),
    'extra_unchanged_fraction': ('extra unchanged share', '%', "Share of trainable elements unchanged by the user's steps only."),
    'finite': ('stayed finite', '', 'Every loss and gradient norm stayed finite.'),
    'first_bad_batch': ('first bad batch', '', 'Index of the first bad train batch.'),
    'first_duplicates': ('first duplicates', '', 'Up to 20 val example indices.'),
    'first_moment': ('first moment', '', 'The first moment replicas differed.'),
    'first_nonfinite_ranks': ('first non-finite ranks', '', 'Distributed.'),
    'first_nonfinite_step': ('first non-finite step', '', 'The replay step (from 0) whose loss or gradient was not finite.'),
    'fix_reshuffles': ('fix reshuffles', '', "With sampler.set_epoch(1) called, epoch 1's order differs from epoch 0's (the sampler shuffles, and set_epoch is what changes its order)."),
    'fix_works': ('fix works', '', 'Finite, clearly better and at a sane level: the fix is verified.'),
    'forward_module': ('forward module', '', 'First module creating a non-finite output.'),
    'forward_module_type': ('forward module type', '', ''),
    'found': ('found', '', 'A step with a non-finite loss or gradient was reached.'),
    'frozen': ('frozen', '', 'Parameters with requires_grad=False (those frozen by design left out).'),
    'frozen_count': ('frozen count', '', ''),
    'frozen_fraction': ('frozen share', '%', 'Of all parameter elements.'),
    'grad_growth': ('gradient growth', '×', 'Median over the second half of the calls of |the gradient optimizer.step was given| / |the fresh gradients, at the same weights, of the batches since the gradients were last reset: ~1 normal, above 1.5 accumulating.'),
    'grad_norm_start': ('gradient norm at the start', '', 'Median gradient norm of the first fifth of steps.'),
    'grad_norms': ('gradient norm per step', '', 'The global gradient norm of each step, before clipping.'),
    'gradient_vs_standard': ('gradient vs standard', '×', '|d own/d output - d standard/d output| / |d standard/d output| at the checkpoint.'),
    'grads_accumulate': ('gradients accumulate', '', 'grad_growth > growth_threshold.'),
    'has_epoch_batches': ('has epoch batches', '', "setup() gave the loop's epoch_batches(epoch)."),
    'has_loader': ('has loader', '', "setup() gave a DataLoader (as epoch_batches' result or as batches)."),
    'has_output': ('has output', '', 'A floating output of dim >= 2 was seen.'),
    'has_scheduler': ('has scheduler', '', ''),
    'has_train_step': ('has train step', '', ''),
    'has_val': ('has validation', '', 'The history logs a validation loss.'),
    'hooked_layers': ('hooked layers', '', ''),
    'horizon': ('horizon', 'steps', 'Steps the trace was meant to cover.'),
    'identical_batch_fraction': ('identical batch share', '%', 'Share of batch positions at which every rank holds the very same batch.'),
    'identical_groups': ('identical groups', '', 'Groups of ranks whose compared batches are all the same.'),
    'improvement': ('end loss vs the run as it was', '×', "The fix's end loss over the run's own: lower is better; 0 when the run blew up."),
    'inf': ('Inf', '', ''),
    'inputs_finite': ('inputs finite', '', "The culprit's inputs (forward) or incoming gradients (backward) were finite."),
    'is_classification': ('is classification', '', 'Batches carry integer labels and the model outputs >= 2 scores.'),
    'key': ('key', '', ''),
    'kind': ('kind', '', 'Its class.'),
    'knn_agreement': ('nearest-neighbour agreement', '', 'Share of examples whose nearest neighbour in input space has their label.'),
    'knn_examples': ('nearest-neighbour examples', '', ''),
    'knn_target_correlation': ('nearest-neighbour target correlation', '', 'Regression.'),
    'label_max': ('label max', '', ''),
    'label_min': ('label min', '', ''),
    'labels_seen': ('labels seen', '', 'Labels counted (ignore_index left out).'),
    'layer_norms': ('layer norms', '', 'Per parameter, in registration (depth) order.'),
    'layers': ('layers', '', 'In the order they first ran.'),
    'left_in_eval': ('left in eval', '', "Some forward of the user's step ran in eval mode."),
    'level_ratio': ('end loss / learning nothing', '×', 'About 1: the run learned nothing.'),
    'pace_vs_run': ('learning pace vs the run before', '×', "Loss shed per step in the replay over the run's own average before the checkpoint: under 0.1 it has stalled."),
    'loader_repeats': ('loader repeats', '', 'Only a DataLoader given.'),
    'located_ranks': ('located ranks', '', 'Distributed.'),
    'log_slope': ('slope of log loss', 'per step', 'Slope of ln(loss) per step: below 0 the run learns.'),
    'looks_like_log_probabilities': ('looks like log probabilities', '', "<= 0, rows' logsumexp is 0."),
    'looks_like_probabilities': ('looks like probabilities', '', 'In [0, 1], rows sum to 1.'),
    'loop': ('loop', '', 'Whose step the replay ran.'),
    'loop_note': ('loop note', '', 'Why the replay ran on the reference loop although the run has its own train_step.'),
    'loop_used': ('training step used', '', "user: the run's own train_step; reference: triage's loop on loss_fn."),
    'loss': ('loss', '', 'Mean loss over the batches used.'),
    'loss_checkpoint': ('loss at the checkpoint', '', "Mean loss over the batches checked, at the checkpoint's weights."),
    'loss_default_init': ('loss default init', '', "Loss with every module's reset_parameters()."),
    'loss_detached': ('loss detached', '', 'No trainable parameter received a gradient in any user step.'),
    'loss_end': ('loss at the end', '', "Median loss of the replay's last fifth of steps."),
    'loss_finite': ('loss finite', '', 'The loss of the failing step was finite.'),
    'loss_first': ('loss first', '', ''),
    'loss_floor': ('lowest loss possible', '', 'The loss of a perfect prediction (0 for cross-entropy, MSE, BCE).'),
    'loss_floor_ratio': ('loss floor ratio', '×', 'loss_checkpoint / probability_ce_floor.'),
    'loss_has_grad': ('loss has gradient', '', 'The loss is attached to a graph (loss.requires_grad).'),
    'loss_last': ('loss last', '', ''),
    'loss_max': ('highest loss', '', 'The highest loss of any replayed step.'),
    'loss_min': ('lowest loss', '', 'The lowest loss of any replayed step.'),
    'loss_ratio': ('loss end / start', '×', 'Above 1 the loss rose over the replay, below 1 it fell.'),
    'loss_setup_init': ('loss setup init', '', "Loss with setup()'s own init (setup() called again)."),
    'loss_start': ('loss at the start', '', "Median loss of the replay's first fifth of steps."),
    'loss_vs_standard': ('loss vs standard', '×', "The run's own loss / the standard loss, on the same forwards."),
    'losses': ('loss per step', '', 'The loss of each step (or batch).'),
    'lr': ('learning rate', '', "The run's learning rate at the checkpoint (first parameter group)."),
    'lr_changed_in': ('LR changed in', '', 'Several optimizers (Setup.optimizers).'),
    'lr_end': ('LR end', '', 'The LR at the end of the trace.'),
    'lr_factor': ('LR factor that trained', '×', "The chosen trial's multiplier of the run's learning rate."),
    'lr_now': ('LR now', '', "The optimizer's LR at the checkpoint."),
    'lr_now_ratio': ('LR now ratio', '×', 'lr_now / lr_peak.'),
    'lr_peak': ('LR peak', '', 'The highest LR of the schedule (or lr_now, if higher).'),
    'lrs': ('learning rate per step', '', 'The learning rate of each replayed step.'),
    'majority_fraction': ('majority share', '%', 'Share of the most frequent label.'),
    'manual_updates': ('manual updates', '', 'Calls that moved the weights with no optimizer step.'),
    'max_dead_fraction': ('max dead share', '%', ''),
    'max_grad_norm': ('largest gradient norm', '', 'The largest global gradient norm of any step, before clipping.'),
    'max_layer_norm': ('max layer norm', '', ''),
    'max_rise': ('largest rise of the loss', '× start loss', 'Largest rise above the best loss so far, in units of the starting loss.'),
    'max_saturated_fraction': ('max saturated share', '%', ''),
    'max_spread': ('max spread', '', 'The largest relative spread measured.'),
    'mean_dead_fraction': ('mean dead share', '%', 'Over rectifier layers, unit-weighted.'),
    'median_grad_norm': ('typical gradient norm', '', 'Median global gradient norm over the steps, before clipping.'),
    'metric_driven': ('metric driven', '', 'ReduceLROnPlateau.'),
    'min_layer_norm': ('min layer norm', '', 'Over parameters that got a gradient.'),
    'module': ('module', '', 'The culprit module for the stage.'),
    'module_type': ('module type', '', 'Its class.'),
    'moment': ('moment', '', ''),
    'name': ('name', '', 'Module name; a module called again in one forward is "name#2".'),
    'nan': ('NaN', '', ''),
    'no_grad': ('no gradient', '', 'Trainable parameters that got no gradient at all (grad None).'),
    'no_grad_count': ('no gradient count', '', ''),
    'no_grad_fraction': ('no gradient share', '%', "Of the trainable parameters' elements."),
    'nonfinite': ('non-finite', '', ''),
    'nonfinite_batches': ('non-finite batches', '', 'Batches whose loss or gradient is non-finite at these weights.'),
    'nonfinite_count': ('non-finite tensors', '', 'Tensors holding a NaN or Inf.'),
    'nonfinite_parameters': ('non-finite parameters', '', 'Parameters already non-finite before the failing step (an earlier optimizer update overflowed them).'),
    'norm': ('norm', '', ''),
    'not_in_optimizer': ('not in optimizer', '', 'requires_grad=True but in no optimizer param group (those left out by design not counted).'),
    'not_in_optimizer_count': ('not in optimizer count', '', ''),
    'not_in_optimizer_fraction': ('not in optimizer share', '%', 'Of all parameter elements.'),
    'not_measured': ('not measured', '', 'Why the examples could not be compared.'),
    'nothing_level': ('loss of learning nothing', '', 'The loss of the best constant prediction (label entropy, target variance), else ln K.'),
    'num_classes': ('classes', '', 'K, the number of scores the model outputs.'),
    'numel': ('elements', '', ''),
    'op': ('op', '', 'The operation that first produced a non-finite value.'),
    'optimizer_nonfinite': ('optimizer non-finite', '', 'Of those, optimizer state (moments, ...).'),
    'optimizer_stepped': ('optimizer stepped', '', "The user's steps updated the weights."),
    'optimizer_steps': ('optimizer steps', '', "optimizer.step() calls the run's own step took."),
    'out_of_range_count': ('out of range count', '', 'Labels < 0 or >= K.'),
    'out_of_sync_count': ('out of sync count', '', ''),
    'outlier_count': ('outlying batches', '', 'Batches whose loss or gradient lies far from the others.'),
    'outliers': ('outliers', '', 'Batches with a finite loss whose z is above the threshold.'),
    'output_dim': ('output dim', '', "The output's last dim (K for a classifier)."),
    'output_max': ('output max', '', ''),
    'output_min': ('output min', '', ''),
    'overflow_count': ('steps skipped by the scaler', '', 'How many replay steps the GradScaler skipped.'),
    'overflow_steps': ('steps a GradScaler skipped', '', 'Replay steps (from 0) whose update the scaler skipped: their gradient overflowed.'),
    'overflowing_batches': ('batches skipped on every pass', '', 'Snapshot batches the GradScaler skipped each time they came round (two passes or more): never learned from.'),
    'parameter_count': ('parameter count', '', ''),
    'parameters': ('parameters', '', 'Every parameter out of sync, worst first.'),
    'params_never_changed': ('parameters never changed', '', "Trainable parameters the user's steps left exactly as they were."),
    'part': ('part', '', 'weights, buffers or optimizer.'),
    'past_peak': ('past peak', '', "The checkpoint's step is at or after the schedule's peak (a low LR before it is warmup, not decay)."),
    'peft': ('PEFT', '', 'The model is a PEFT model (adapters on a frozen base).'),
    'points': ('points', '', "Logged points in the run's history."),
    'preconditioned': ('preconditioned', '', 'Adam-style.'),
    'previous_module': ('previous module', '', "Where the culprit is an nn.Sequential's bare index (`3`)."),
    'previous_module_type': ('previous module type', '', ''),
    'probability_ce_floor': ('probability cross-entropy floor', '', 'ln(e + K - 1) - 1.'),
    'rank': ('rank', '', 'The rank where the non-finite value starts.'),
    'rank_loss_end': ('rank loss end', '', 'Distributed.'),
    'ranks_apart': ('ranks apart', '', 'Ranks whose copy of the worst parameter differs from the most common one.'),
    'raw_losses': ('raw losses', '', 'The same, unsmoothed.'),
    'reference_end': ('end loss of the run as it was', '', 'The run replayed as it was, over the same steps (inf: it did not stay finite).'),
    'reference_loss_ratio': ('reference loss ratio', '×', 'The same for the reference.'),
    'reference_losses': ('reference losses', '', ''),
    'reference_never_changed': ('reference never changed', '', 'Trainable parameters the reference loop left unchanged too.'),
    'reference_steps': ('steps of the run compared', '', 'Steps of the run as it was that the fix is compared with.'),
    'relu_layers': ('ReLU layers', '', 'Rectifier (ReLU-family) layers.'),
    'repeats': ('repeats', '', "The run's epochs 0 and 1 begin with the same batches in the same order."),
    'returned_loss_has_grad': ('returned loss has gradient', '', 'The loss train_step returned is part of an autograd graph (a float or a detached tensor is a normal thing to return).'),
    'rule': ('rule', '', 'The standard loss for these outputs and targets (e.g. cross_entropy).'),
    'run_losses': ('run losses', '', 'The run as it was, replayed from the same start on its own loss, scored per step by the standard loss.'),
    'sampler': ('sampler', '', "The loader's sampler."),
    'sampler_has_set_epoch': ('sampler has set epoch', '', ''),
    'sampler_shards': ('sampler shards', '', 'A DistributedSampler over the same dataset gives every rank a different first batch.'),
    'sane': ('ends at a sane level', '', "Ends below the level of learning nothing, and not below the loss's floor."),
    'sane_kind': ('sane level from', '', 'constant: the best constant prediction; chance: ln K; start: its own start.'),
    'sane_level': ('level it must end below', '', 'The sane level: a margin under the loss of learning nothing.'),
    'saturated_fraction': ('saturated share', '%', 'Sigmoid/tanh.'),
    'scaler_skipped_steps': ('scaler skipped steps', '', "Calls in which Setup.scaler's scale fell."),
    'scheduler_steps': ('scheduler steps', '', "Times the run's scheduler was stepped."),
    'setting': ('setting', '', 'What this trial changed.'),
    'setup_init_is_default': ('setup init is default', '', "setup()'s init is PyTorch's default scheme."),
    'setup_init_ratio': ('setup init ratio', '×', 'loss_setup_init / ln K.'),
    'setup_init_vs_nothing': ('setup init vs nothing', '×', 'loss_setup_init / the loss of learning nothing (label entropy, binary entropy, target variance).'),
    'shared_example_fraction': ('shared example share', '%', "Mean over ranks of the share of a rank's examples another rank also holds."),
    'sharpness': ('sharpness', '', "Top eigenvalue of the loss's Hessian (preconditioned for Adam)."),
    'single_class': ('single class', '', ''),
    'single_class_batch_fraction': ('single class batch share', '%', 'Batches holding one class.'),
    'skipped': ('batches skipped', '', 'Indices of the snapshot batches the replay left out.'),
    'source': ('source', '', '"path/file.py:123" of the user code.'),
    'source_context': ('source context', '', 'Lines around it, the line marked.'),
    'source_line': ('source line', '', ''),
    'split': ('split', '', ''),
    'spread': ('spread', '', "max over elements of (largest - smallest rank's value) / max |w|."),
    'spreads': ('spreads', '', 'The parameters out of sync (at most 20).'),
    'squashed': ('squashed', '', 'Every output lies in [0, 1] (sigmoid or softmax).'),
    'stable_lr_scale': ('stable LR scale', '', 'The LR factor at which sharpness meets the edge (1 / edge_ratio).'),
    'stage': ('stage', '', '"forward" or "backward".'),
    'standard_level_ratio': ('standard level ratio', '×', 'The standard loss at the checkpoint / its loss of learning nothing (label entropy, binary entropy, target variance).'),
    'standard_loss': ('standard loss', '', 'That loss at the checkpoint (eval mode).'),
    'standard_rule': ('standard rule', '', 'The standard loss for these outputs and targets.'),
    'status': ('how it ended', '', 'ok, error, oom, timeout or not applicable.'),
    'std': ('std', '', 'Standard deviation of all its outputs.'),
    'std_growth': ('std growth', '×', 'std of the last layer / std of the first.'),
    'step': ('step', '', 'That step, counted from 0 in the replay.'),
    'step_grads_zero': ('step gradients zero', '', 'The optimizer stepped, but every time on all-zero (or no) gradients.'),
    'steps': ('steps', '', 'Steps traced (subsampled).'),
    'steps_run': ('steps replayed', '', 'Training steps the replay ran.'),
    'suggested_lr': ('suggested LR', '', 'LR at the steepest descent of the loss.'),
    'suggested_ratio': ('suggested ratio', '×', 'suggested_lr / current_lr.'),
    'target': ('target', '', 'The batch tensor read as the class labels.'),
    'target_ambiguous': ('target ambiguous', '', 'The loss reads several integer tensors of the batch (targets and their lengths, say).'),
    'targets_discrete': ('targets discrete', '', 'The targets are class indices or 0/1 values (what a loss on scores expects; pixel intensities are not).'),
    'tensors': ('tensors', '', 'Their names, the first `names` of them.'),
    'tensors_checked': ('tensors checked', '', ''),
    'train_examples': ('train examples', '', ''),
    'train_nonfinite_count': ('non-finite values in the training batches', '', ''),
    'train_ratio_since_val_best': ('train ratio since validation best', '', 'Train loss at the end / train loss when val was best.'),
    'train_step_source': ('train step source', '', "file:line where the run's train_step is defined."),
    'trainable_count': ('trainable count', '', 'Parameters with requires_grad that the optimizer holds.'),
    'trials': ('trials', '', 'Every trial, in the order run.'),
    'truncated': ('cut short by the time ceiling', '', 'Cut by --max-minutes part way.'),
    'unchanged_fraction': ('unchanged share', '%', 'Their share of the trainable elements.'),
    'units': ('units', '', ''),
    'unknown_optimizers': ('unknown optimizers', '', 'The optimizers train_step stepped that setup() did not hand triage.'),
    'unsquash_ratio': ('unsquash ratio', '×', 'unsquashed_loss / loss_checkpoint.'),
    'unsquashed_loss': ('unsquashed loss', '', "The loss when the model's output is replaced by its squashing undone (log of probability rows, logit of [0, 1] values); None when the…"),
    'update_ratio': ('weights moved', '× their size', 'How far the weights moved, relative to their size at the start.'),
    'user_loss_ratio': ('user loss ratio', '×', 'Median last fifth / first fifth.'),
    'user_losses': ('user losses', '', ''),
    'val_best': ('validation best', '', ''),
    'val_best_step': ('validation best step', '', ''),
    'val_end': ('validation end', '', ''),
    'val_examples': ('validation examples', '', ''),
    'val_last': ('validation last', '', ''),
    'val_losses': ('validation losses', '', ''),
    'val_ratio': ('last / best validation loss', '×', 'Above 1: validation loss rose from its best.'),
    'val_start': ('validation start', '', ''),
    'val_steps': ('validation steps', '', ''),
    'weight_norm_checkpoint': ('weight norm checkpoint', '', "Norm of all the checkpoint's weight matrices (dim >= 2)."),
    'weight_norm_ratio': ('weight norm after / before', '×', 'Size of the weights at the end over their size at the start.'),
    'weight_norm_setup_init': ('weight norm setup init', '', "The same at setup()'s own init."),
    'weight_norm_vs_init': ('weight norm vs init', '×', 'weight_norm_checkpoint / weight_norm_setup_init.'),
    'weights_nonfinite': ('weights non-finite', '', 'Of those, parameters.'),
    'world_size': ('ranks', '', 'Processes in the distributed run.'),
    'worst_batch': ('most outlying batch', '', 'Index in the data snapshot of the batch with the highest z-score.'),
    'worst_layer': ('worst layer', '', 'The rectifier with most dead units; without rectifiers, the most saturated.'),
    'worst_layer_previous': ('worst layer previous', '', "Where it is an nn.Sequential's bare index (`3`)."),
    'worst_layer_previous_type': ('worst layer previous type', '', ''),
    'worst_layer_type': ('worst layer type', '', 'Its class.'),
    'worst_parameter': ('worst parameter', '', ''),
    'worst_z': ('its z-score', 'σ', "How far that batch's loss or gradient lies from the others (robust z)."),
    'wrapper': ('wrapper', '', 'What setup() returned.'),
    'z_grad': ('z-score gradient', '', 'Robust z-score of log gradient norm.'),
    'z_loss': ('z-score loss', '', 'Robust z-score of log loss (inf for a non-finite loss).'),
    'zero_grad': ('zero gradient', '', 'Trainable parameters whose gradient is exactly zero through an intact graph.'),
    'zero_grad_calls': ('zero gradient calls', '', 'optimizer.zero_grad() and model.zero_grad() calls.'),
    'zero_grad_fraction': ('zero gradient share', '%', "Of the trainable parameters' elements."),
    'first_index': ('where the first non-finite value is', '', 'Its index in the tensor; the first entry is the example in the batch.'),
    'first_value': ('first non-finite value', '', 'That value: NaN, inf or -inf.'),
    'sample_id': ('dataset index of the example', '', "Where the batch carries its examples' indices (an 'index' or 'idx' key)."),
    'worst_tensor': ('tensor that stands out', '', "The outlying batch's tensor whose largest |value| stands out from the same tensor's in the other batches."),
    'worst_tensor_z': ("that tensor's z-score", 'σ', "How far its largest |value| lies from the same tensor's in the other batches (robust z of the log)."),
    'worst_value': ('its largest value', '', "That tensor's value of largest magnitude."),
    'worst_value_index': ('where that value is', '', 'Its index in the tensor; the first entry is the example in the batch.'),
    'typical_value': ("the tensor's typical largest |value|", '', "The same tensor's largest |value|, median over the snapshot's batches."),
    'worst_sample_id': ('dataset index of that example', '', "Where the batch carries its examples' indices (an 'index' or 'idx' key)."),
    'lr_owner': ('optimizer whose LR is the fix', '', "Of the run's several optimizers, the one whose LR alone, scaled, trains."),
}
