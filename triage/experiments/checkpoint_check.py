"""Checkpoint check: NaN or Inf already in the checkpoint's own weights, buffers or optimizer state.

A checkpoint that holds them was saved after the failure: every replay from it starts broken, and
what they measure says nothing about the cause. Runs before any replay; reads the restored state.
"""

from __future__ import annotations

import torch
from pydantic import Field

from triage.experiments.base import Context, Experiment, Params
from triage.outcomes.checkpoint_check import CheckpointCheckOutcome, NonFiniteState


class CheckpointCheckParams(Params):
    names: int = Field(default=20, ge=1, le=1000, description="How many tensors to name at most.")


@torch.no_grad()
def measure(ctx: Context, p: CheckpointCheckParams) -> CheckpointCheckOutcome:
    setup = ctx.session.setup
    model, optimizer = setup.model, setup.optimizer
    names = {id(param): name for name, param in model.named_parameters()}
    states: list[tuple[str, str, torch.Tensor]] = [("weights", n, t) for n, t in model.named_parameters()]
    states += [("buffers", n, t) for n, t in model.named_buffers()]
    for param, state in optimizer.state.items():
        owner = names.get(id(param), "a parameter outside the model")
        states += [("optimizer", f"optimizer {key} of {owner}", value) for key, value in state.items()
                   if isinstance(value, torch.Tensor)]
    found: list[NonFiniteState] = []
    for part, name, tensor in states:
        if not (tensor.is_floating_point() or tensor.is_complex()) or bool(torch.isfinite(tensor).all()):
            continue
        found.append(NonFiniteState(name=name, part=part, nan=int(torch.isnan(tensor).sum()),
                                    inf=int(torch.isinf(tensor).sum()), numel=tensor.numel()))
    count = {part: sum(f.part == part for f in found) for part in ("weights", "buffers", "optimizer")}
    return CheckpointCheckOutcome(
        tensors_checked=len(states), nonfinite_count=len(found), weights_nonfinite=count["weights"],
        buffers_nonfinite=count["buffers"], optimizer_nonfinite=count["optimizer"],
        tensors=[f.name for f in found[:p.names]], nonfinite=found[:p.names])


CHECKPOINT_CHECK = Experiment(
    name="checkpoint_check",
    summary="Scans the checkpoint's weights, buffers and optimizer state for NaN and Inf (a checkpoint saved "
            "after the failure).",
    params=CheckpointCheckParams,
    outcome=CheckpointCheckOutcome,
    measure=measure,
)
