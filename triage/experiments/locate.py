"""Locate the first non-finite value: replay until a step goes NaN/Inf, then bisect that step.

At the failing step (its pre-step state kept: the weights are untouched because the step is
stopped before the optimizer moves them; RNG and buffers are saved before every step), one
instrumented forward/backward finds:

- forward: the first module, in completion order, whose output is non-finite, preferring one
  that *creates* the value rather than passing it on; and, through a TorchFunctionMode, the
  first torch op that module ran itself which creates one, with the user's source line. To
  create is to output a NaN where no input held one (0/0, softmax of an all -inf row) or an Inf
  from finite inputs (overflow); a number argument is an input, so `masked_fill(mask, -inf)`
  passes a mask on and creates nothing;
- backward: hooks on every autograd node find the first node whose gradient outputs are
  non-finite while the gradients flowing into it were finite (an Inf counts: anomaly mode only
  checks NaN, and sqrt(0)'s Inf becomes NaN one node later); the module that created the node in
  the forward is the culprit module. One anomaly-mode pass of the same step then gives that
  node's forward traceback, hence the user's source line.

Module backward hooks (`register_full_backward_hook`) are not used: they wrap module outputs in
a custom Function, and any in-place op on such an output (ReLU(inplace=True) after a BatchNorm,
as in every torchvision ResNet) makes the forward raise. Autograd node hooks have no such limit.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Optional

import torch
from pydantic import Field

from triage.contract import Precision
from triage.load.wrappers import is_sharded, unwrap
from triage.experiments.base import Context, Experiment, Params
from triage.experiments.locate_probe import all_finite, anomaly_pass, probe_step
from triage.experiments.places import module_place
from triage.experiments.schedule import RunSchedule
from triage.experiments.training import (forward_backward, grad_scaler, needs_closure, optimizer_step,
                                         reference_step, trainable)
from triage.experiments.user_source import display_path, source_context, source_line
from triage.load.snapshot import rng_state, set_rng_state
from triage.views import SourceExcerpt
from triage.outcomes.locate import LocateOutcome

log = logging.getLogger(__name__)


class LocateParams(Params):
    steps: int = Field(default=40, ge=1, le=100_000, description="Replay at most this many steps.")
    lr_scale: float = Field(default=1.0, gt=0, description="Multiply the learning rate at every step.")
    precision: Optional[Precision] = Field(default=None, description="Autocast dtype; None: as the run.")
    anomaly: bool = Field(default=True, description="For a backward culprit, one anomaly-mode pass of "
                                                    "the failing step to find the forward source line.")


def measure(ctx: Context, p: LocateParams) -> LocateOutcome:
    session = ctx.session
    setup = session.setup
    model = setup.model
    schedule = RunSchedule(setup.scheduler, setup.scheduler_interval, setup.steps_per_epoch,
                           getattr(session.checkpoint, "step", None))
    precision = p.precision or setup.precision
    scaler = grad_scaler(setup, precision, session.device)
    params = trainable(model)
    model.train()
    for step in range(p.steps):
        if ctx.out_of_time():
            return LocateOutcome(found=False, steps_run=step, truncated=True)
        batch = session.batches[step % len(session.batches)]
        before = _PreStep.take(model)
        if not _train_step(ctx, setup, batch, precision, setup.grad_clip, scaler, session.device, params,
                           p.lr_scale):
            before.restore(model)
            return _origin(ctx, _bisect_on_rank(ctx, setup, batch, precision, before, step, p.anomaly))
        schedule.after_step(math.nan)  # the loss is not kept here: a plateau scheduler sees none fall
        ctx.progress(step + 1, p.steps)
    return LocateOutcome(found=False, steps_run=p.steps)


def _train_step(ctx, setup, batch, precision, clip, scaler, device, params, lr_scale) -> bool:
    """replay's reference step, stopped before the optimizer moves on a non-finite loss or gradient.

    Returns whether the step was finite (on every rank: all stop at the same step). Under a
    GradScaler an inf gradient is routine (the scaler skips that step), so only the loss counts there.
    """
    loss, norm = forward_backward(setup, batch, precision, clip, scaler, device, params)
    if not ctx.ranks.all(math.isfinite(loss) and (scaler is not None or math.isfinite(norm))):
        return False
    if needs_closure(setup.optimizer):  # LBFGS: its step re-evaluates the loss through a closure
        reference_step(setup, batch, precision, clip, scaler, device, params, lr_scale)
    else:
        optimizer_step(setup, scaler, lr_scale)
    return True


def _bisect_on_rank(ctx, setup, batch, precision, before, step, anomaly) -> LocateOutcome:
    """This rank's own failing step, bisected. Under DDP on the wrapped module alone: its gradients are
    this rank's, not the all-reduced ones (which are non-finite on every rank once one rank's is), and
    no collective runs, so each rank probes on its own. A sharded (FSDP2) model's passes are collective:
    every rank probes in lockstep, without the anomaly pass (a backward that raises on one rank only
    would leave the others waiting)."""
    sharded = is_sharded(setup.model)
    local = setup if sharded else setup.model_copy(update={"model": unwrap(setup.model)})
    backward_if = (lambda finite: ctx.ranks.any(finite)) if sharded else (lambda finite: finite)
    return _bisect_step(local, batch, precision, ctx.session.device, before, step, anomaly and not sharded,
                        backward_if, warn_unlocated=not ctx.ranks.distributed)


def _origin(ctx, mine: LocateOutcome) -> LocateOutcome:
    """The rank where the non-finite value starts: of the ranks whose own step created one, the first
    whose loss went non-finite (else the first located). One process: its own outcome."""
    if not ctx.ranks.distributed:
        return mine
    every = ctx.ranks.gather(mine)
    located = [r for r, o in enumerate(every) if o.stage is not None]
    if not located and ctx.ranks.rank == 0:
        log.warning("step %d went non-finite but no rank's step did when repeated with hooks; nothing located",
                    mine.step)
    origin = next((r for r in located if not every[r].loss_finite), located[0] if located else 0)
    return every[origin].model_copy(update={"rank": origin, "located_ranks": located})


@dataclass
class _PreStep:
    """What a stopped step changes besides gradients: the RNG streams and the buffers (BN stats)."""

    rng: dict[str, Any]
    buffers: dict[str, torch.Tensor]

    @classmethod
    def take(cls, model: torch.nn.Module) -> "_PreStep":
        return cls(rng_state(), {k: b.detach().clone() for k, b in model.named_buffers()})

    def restore(self, model: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(self.buffers[name])
        set_rng_state(self.rng)


def _bisect_step(setup, batch, precision, device, before: _PreStep, step: int, anomaly: bool,
                 backward_if=lambda loss_finite: loss_finite, warn_unlocated: bool = True) -> LocateOutcome:
    bad_params = [name for name, q in setup.model.named_parameters() if not all_finite(q)]
    probe = probe_step(setup, batch, precision, device, backward_if)
    before.restore(model=setup.model)
    forward = probe.forward_culprit()
    backward_node = probe.backward.first if probe.backward else None
    if forward is not None or not probe.loss_finite:
        stage = "forward"
    elif backward_node is not None:
        stage = "backward"
    else:  # a non-deterministic kernel, say (or, distributed, another rank's step): it stayed finite here
        if warn_unlocated:
            log.warning("step %d went non-finite but did not when repeated with hooks; nothing located", step)
        stage = None
    backward_module = probe.module_of(backward_node.node) if backward_node else None
    op = anomaly_op = frame = None
    if stage == "forward":
        creator = probe.recorder.creator_in(forward.name if forward else None)
        if creator:
            op, frame = creator.op, creator.frame
    elif backward_node is not None:
        op = backward_node.name
        if anomaly:
            traced, anomaly_op, frame = anomaly_pass(setup, batch, precision, device)
            before.restore(model=setup.model)
            op = traced or op
    setup.optimizer.zero_grad(set_to_none=True)
    if stage == "forward":
        module = forward.name if forward else None
        inputs_finite = forward.inputs_finite if forward else None
    else:
        module, inputs_finite = backward_module, (True if stage else None)
    place = module_place(setup.model, module)
    return LocateOutcome(
        found=True, step=step, steps_run=step + 1, stage=stage, module_type=place.type,
        previous_module=place.previous, previous_module_type=place.previous_type,
        forward_module=forward.name if forward else None,
        forward_module_type=forward.kind if forward else None,
        backward_module=backward_module, module=module, op=op, anomaly_op=anomaly_op,
        domain_edge=has_domain_edge(op) if op else None,
        source=display_path(frame[0], frame[1]) if frame else None,
        source_line=source_line(frame[0], frame[1]) if frame else None,
        source_context=source_context(frame[0], frame[1]) if frame else [],
        inputs_finite=inputs_finite, loss_finite=probe.loss_finite, nonfinite_parameters=bad_params,
    )


# Ops that turn finite inputs into NaN/Inf at the edge of their domain (log of 0, x/0, sqrt of a negative
# number, 0 ** -1, ...), by their base name: what an eps or a clamp guards.
DOMAIN_EDGE_OPS = frozenset({
    "log", "log2", "log10", "log1p", "xlogy", "logit", "div", "divide", "true_divide", "floor_divide",
    "truediv", "rtruediv", "reciprocal", "sqrt", "rsqrt", "pow", "rpow", "float_power", "acos", "asin",
    "acosh", "atanh", "erfinv", "digamma", "lgamma", "polygamma", "cdist", "norm",
})


def has_domain_edge(op: str) -> bool:
    """Whether the named op ("torch.log", "Tensor.__truediv__", "SqrtBackward0", "aten.div_") is one of
    DOMAIN_EDGE_OPS."""
    name = re.sub(r"Backward\d*$", "", op.rsplit(".", 1)[-1]).strip("_").lower()
    return name in DOMAIN_EDGE_OPS


LOCATE_NONFINITE = Experiment(
    name="locate_nonfinite",
    summary="Replays to the first non-finite step and names the module, op and source line that "
            "first produce the NaN/Inf, in the forward or the backward.",
    params=LocateParams,
    outcome=LocateOutcome,
    measure=measure,
    views=(SourceExcerpt(title="The user's source", field="source_context"),),
)
