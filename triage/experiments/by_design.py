"""Parameters left untrained on purpose: part of the setup, not a fault (DESIGN §2, "frozen by design").

Two sources, each a fact of the run rather than a guess:
- a PEFT model (peft's LoRA, IA3, prefix tuning, ...: modules whose class comes from the `peft` package):
  every parameter outside its adapters is frozen by the method itself;
- the names the user declares in `Setup.frozen_by_design` (a linear probe's body, a fixed embedding):
  a parameter whose name equals one, or starts with one followed by a dot.
"""

from __future__ import annotations

from typing import Iterable

import torch


def is_peft(model: torch.nn.Module) -> bool:
    """The model holds modules of the peft package (its tuner layers or its PeftModel wrapper)."""
    return any(type(m).__module__.split(".")[0] == "peft" for m in model.modules())


def frozen_by_design(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     declared: Iterable[str] = ()) -> set[str]:
    """Names of the parameters that do not train, and are meant not to: all of them in a PEFT model, the
    declared ones otherwise. (A parameter that trains is never counted, whatever was declared.)"""
    held = {id(q) for group in optimizer.param_groups for q in group["params"]}
    idle = {name for name, q in model.named_parameters() if not q.requires_grad or id(q) not in held}
    if is_peft(model):
        return idle
    prefixes = tuple(declared)
    return {name for name in idle if any(name == p or name.startswith(p.rstrip(".") + ".") for p in prefixes)}
