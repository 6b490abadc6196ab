"""Which torch optimizer saved an optimizer state_dict, from the keys it holds.

A state_dict does not name its optimizer. Loading an Adam state into SGD "works" and fails at the first
step (or silently drops the moments), so the session compares the saver, as far as its keys tell,
with the optimizer setup() built, and names both when they differ.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

# (names, param-group keys that must all be present, per-parameter state keys that tell it apart),
# most specific first. Only keys every torch 2.x version writes: newer flags (fused, capturable,
# decoupled_weight_decay, ...) are missing from states saved by older versions.
_SIGNATURES: tuple[tuple[tuple[str, ...], frozenset[str], frozenset[str]], ...] = (
    (("NAdam",), frozenset({"betas", "momentum_decay"}), frozenset({"mu_product"})),
    (("Adam", "AdamW"), frozenset({"betas", "amsgrad"}), frozenset({"exp_avg", "exp_avg_sq"})),
    (("Adamax",), frozenset({"betas"}), frozenset({"exp_inf"})),
    (("RAdam",), frozenset({"betas"}), frozenset({"exp_avg", "exp_avg_sq"})),
    (("SparseAdam",), frozenset({"betas"}), frozenset()),
    (("Adafactor",), frozenset({"beta2_decay"}), frozenset()),
    (("ASGD",), frozenset({"lambd", "alpha", "t0"}), frozenset()),
    (("RMSprop",), frozenset({"alpha", "centered"}), frozenset()),
    (("Adagrad",), frozenset({"lr_decay", "initial_accumulator_value"}), frozenset()),
    (("Adadelta",), frozenset({"rho"}), frozenset()),
    (("Rprop",), frozenset({"etas", "step_sizes"}), frozenset()),
    (("LBFGS",), frozenset({"history_size", "max_iter"}), frozenset()),
    (("SGD",), frozenset({"momentum", "dampening", "nesterov"}), frozenset()),
)


def saved_by(state: Any) -> Optional[tuple[str, ...]]:
    """The torch optimizer class names whose state this is (several when the keys cannot tell them
    apart, e.g. Adam and AdamW); None when it matches none of them (another library's optimizer)."""
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not groups or not isinstance(groups[0], dict):
        return None
    group_keys = set(groups[0])
    per_param = state.get("state") if isinstance(state.get("state"), dict) else {}
    state_keys = set().union(*(set(s) for s in per_param.values() if isinstance(s, dict))) if per_param else set()
    for names, needs, tells in _SIGNATURES:
        if needs <= group_keys and (not state_keys or not tells or tells <= state_keys):
            if names == ("Adam", "AdamW") and "decoupled_weight_decay" in groups[0]:
                return ("AdamW",) if groups[0]["decoupled_weight_decay"] else ("Adam",)
            return names
    return None


def mismatch(optimizer: torch.optim.Optimizer, state: Any) -> Optional[str]:
    """A sentence naming both types when `state` was saved by another torch optimizer than `optimizer`;
    None when they agree or either is not a torch optimizer triage knows."""
    names = saved_by(state)
    known = [n for names_, _, _ in _SIGNATURES for n in names_ if hasattr(torch.optim, n)]
    built = next((n for n in known if type(optimizer) is getattr(torch.optim, n)), None)
    if names is None or built is None or built in names:
        return None
    if set(names) == {"AdamW"} and built == "Adam" and optimizer.defaults.get("decoupled_weight_decay"):
        return None
    groups = state["param_groups"][0]
    shown = sorted(k for k in groups if k not in ("params", "lr", "weight_decay", "initial_lr"))[:6]
    return (f"the checkpoint's optimizer state was saved by {' or '.join(names)} (its parameter groups hold "
            f"{', '.join(shown)}), and setup() built {type(optimizer).__name__}")
