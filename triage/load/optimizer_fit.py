"""Does a saved optimizer state fit the optimizer setup() built? Compared by structure, not by class name.

A state_dict does not name its optimizer, and `load_state_dict` checks only group sizes: an Adam state
loaded into SGD "works" and fails at the first step, and param groups saved in another order put one
parameter's moments on another wherever the shapes allow it. So before loading, the saved state is set
against what setup()'s optimizer itself keeps:

- its settings: every hyper-parameter in the optimizer's defaults that is not an on/off flag (`foreach`,
  `fused`, `differentiable`, ...: flags newer torch versions add, filled on load) must be in every saved
  group. A state saved by another optimizer lacks some (SGD's `momentum`, Adam's `betas`).
- its per-parameter state: the keys and shapes one step of the same optimizer writes (measured on a tiny
  stand-in of each parameter, `_probe`), against the saved entries. Works for any `Optimizer` subclass
  whose step accepts a closure; where the probe cannot run, entries whose tensors share one shape must
  have their parameter's shape.
- its param groups: matched to setup()'s by those shapes (and by `param_names`, where both have them). A
  state whose groups fit setup()'s in another order is loaded in setup()'s order, and that is said; one
  that fits no order is refused, naming the parameter.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)

# Keys of a group that are not the optimizer's settings: its parameters, their names, and what schedulers add.
_NOT_SETTINGS = frozenset({"params", "param_names", "initial_lr"})


class OptimizerMismatch(ValueError):
    """The saved state does not fit setup()'s optimizer; the message names what differs."""


@dataclass(frozen=True)
class Fitted:
    """The state to load (its groups in setup()'s order) and what was done to make it fit, in words."""

    state: dict[str, Any]
    notes: tuple[str, ...] = ()


def fit_state(optimizer: torch.optim.Optimizer, state: Any) -> Fitted:
    """`state` made ready for `optimizer.load_state_dict`, or OptimizerMismatch naming what does not fit."""
    name = type(optimizer).__name__
    groups = state.get("param_groups") if isinstance(state, dict) else None
    per_param = state.get("state") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                               for g in groups) or not isinstance(per_param, dict):
        raise OptimizerMismatch(f"the checkpoint's optimizer entry is not an optimizer state_dict (expected "
                                f"'state' and 'param_groups', found {_keys(state)})")
    _check_settings(optimizer, groups, name)
    expected = _probe(optimizer, groups)
    built = optimizer.param_groups
    if len(groups) != len(built):
        raise OptimizerMismatch(f"the checkpoint's optimizer has {len(groups)} parameter group(s) of "
                                f"{_sizes(groups)} parameters, and setup()'s {name} has {len(built)} of "
                                f"{_sizes(built)}")
    fits = [[_group_misfit(saved, per_param, own, expected[j] if expected else None, j) for j, own
             in enumerate(built)] for saved in groups]
    if all(fits[i][i] is None for i in range(len(groups))):
        return Fitted(state)
    orders = _orders(fits)
    if len(orders) != 1:
        i = next(i for i in range(len(groups)) if fits[i][i] is not None)
        other = ("no other order of the groups fits either" if not orders else
                 f"{len(orders)} other orders of the groups fit their shapes, so which is which cannot be told")
        raise OptimizerMismatch(f"the checkpoint's optimizer state does not fit setup()'s {name}: group {i}, "
                                f"{fits[i][i]}; {other}")
    order = orders[0]
    reordered = dict(state, param_groups=[groups[i] for i in order])
    moved = ", ".join(f"saved group {i} -> group {j}" for j, i in enumerate(order) if i != j)
    return Fitted(reordered, (f"the checkpoint's optimizer parameter groups were saved in another order than "
                              f"setup() builds them; matched by parameter shape{'s and names' if _named(groups) else 's'} "
                              f"({moved}), so each parameter's optimizer state is loaded onto that parameter",))


def fill_flags(optimizer: torch.optim.Optimizer) -> None:
    """After loading: an on/off flag the saved groups lack (saved by an older torch, or a default added
    since, as `differentiable` for every optimizer) takes the optimizer's default, as torch's own
    `__setstate__` does for the flags it knows."""
    for group in optimizer.param_groups:
        for key, value in optimizer.defaults.items():
            if _is_flag(value):
                group.setdefault(key, value)


def _check_settings(optimizer: torch.optim.Optimizer, groups: list[dict], name: str) -> None:
    needs = sorted(k for k, v in optimizer.defaults.items() if k not in _NOT_SETTINGS and not _is_flag(v))
    saved = set().union(*(set(g) for g in groups)) - _NOT_SETTINGS if groups else set()
    lacking = sorted({k for g in groups for k in needs if k not in g})
    if lacking:
        own = set(optimizer.defaults) | set().union(*(set(g) for g in optimizer.param_groups))
        extra = sorted(k for k in saved if k not in own and not any(_is_flag(g.get(k)) for g in groups if k in g))
        holds = f", and hold {', '.join(extra[:6])}, which {name} has no setting for" if extra else ""
        raise OptimizerMismatch(f"the checkpoint's optimizer parameter groups lack {', '.join(lacking)} (settings "
                                f"setup()'s {name} needs){holds}: it was saved by another optimizer than setup() "
                                f"built ({name})")


def _is_flag(value: Any) -> bool:
    return value is None or isinstance(value, bool)


# ── what one step of this optimizer keeps per parameter ────────────────────────────────────────────

_PARAM_SHAPED = "param"  # a state tensor of its parameter's shape (a moment, a momentum buffer)


def _probe(optimizer: torch.optim.Optimizer, saved: list[dict]) -> Optional[list[list[dict[str, Any]]]]:
    """Per group, per parameter: the state keys one step writes, each `_PARAM_SHAPED`, or the state
    tensor's number of dimensions, or None (not a tensor). Measured on a copy of the optimizer over
    stand-ins of at most 2 elements a dimension (same dtype, device, requires_grad), so nothing of the
    run is touched; None when the copy cannot step (a constructor-bound subclass, a fused CUDA-only flag).
    The copy's groups take the `saved` groups' settings, as loading will (Adam's amsgrad, SGD's momentum
    decide which state a step keeps)."""
    if _wraps_another(optimizer):
        return None
    try:
        stand_ins = [[_stand_in(p) for p in group["params"]] for group in optimizer.param_groups]
        twin = copy.copy(optimizer)
        twin.__dict__ = _with_stand_ins(optimizer, stand_ins)
        settings = [{k: v for k, v in g.items() if k not in _NOT_SETTINGS} for g in saved] \
            if len(saved) == len(optimizer.param_groups) else [{} for _ in stand_ins]
        twin.param_groups = [{**group, **own, "params": params}
                             for group, own, params in zip(optimizer.param_groups, settings, stand_ins)]
        twin.state = defaultdict(dict)
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
            if hasattr(twin, hooks):
                setattr(twin, hooks, OrderedDict())
        flat = [p for params in stand_ins for p in params if p.requires_grad]
        _step(twin, flat)
        found = []
        for group, params in zip(optimizer.param_groups, stand_ins):
            found.append([{key: _kind(value, stand) for key, value in twin.state.get(stand, {}).items()}
                          for stand in params])
        return found
    except Exception as exc:  # noqa: BLE001  (any optimizer: the probe is a help, never a requirement)
        log.debug("optimizer probe of %s failed (%s: %s); comparing by shape alone", type(optimizer).__name__,
                  type(exc).__name__, exc)
        return None


def _wraps_another(optimizer: torch.optim.Optimizer) -> bool:
    """An optimizer that steps another one it holds (ZeroRedundancyOptimizer, Lookahead, a set of several), or
    that talks to other ranks when it steps: a copy of it would step the run's own tensors, or wait for
    ranks that are not probing. Not probed."""
    if type(optimizer).__module__.startswith("torch.distributed"):
        return True
    for value in vars(optimizer).values():
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, torch.optim.Optimizer) for v in inner):
            return True
    return False


def _with_stand_ins(optimizer: torch.optim.Optimizer, stand_ins: list[list[torch.Tensor]]) -> dict[str, Any]:
    """The optimizer's attributes, with every list of its parameters (LBFGS keeps `_params`) made a list of
    their stand-ins: the probe's step must never reach the run's own tensors."""
    real = [p for group in optimizer.param_groups for p in group["params"]]
    swap = {id(p): s for p, s in zip(real, (s for group in stand_ins for s in group))}
    # Methods set on the instance (an LR scheduler wraps `step` this way) would step the run's optimizer: the
    # copy takes its class's own.
    attributes = {k: v for k, v in optimizer.__dict__.items() if not callable(v) or isinstance(v, torch.Tensor)}
    for key, value in attributes.items():
        if isinstance(value, (list, tuple)) and value and all(id(v) in swap for v in value):
            attributes[key] = type(value)(swap[id(v)] for v in value)
    return attributes


def _stand_in(p: torch.Tensor) -> torch.Tensor:
    shape = tuple(min(d, 2) for d in p.shape)
    return torch.full(shape, 0.5, dtype=p.dtype, device=p.device).requires_grad_(p.requires_grad)


def _step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """One step with a closure (LBFGS needs one; every torch optimizer accepts one); sparse gradients when
    the optimizer refuses dense ones (SparseAdam)."""
    def closure(sparse: bool = False):
        for i, p in enumerate(params):
            grad = torch.full_like(p, 0.1 * (i + 1))
            p.grad = grad.to_sparse() if sparse and p.dim() > 0 else grad
        return torch.tensor(1.0)

    with torch.no_grad():
        try:
            optimizer.step(closure)
        except RuntimeError as exc:
            if "sparse" not in str(exc).lower():
                raise
            optimizer.state.clear()
            optimizer.step(lambda: closure(sparse=True))


def _kind(value: Any, param: torch.Tensor) -> Any:
    if not isinstance(value, torch.Tensor):
        return None
    if value.dim() > 0 and tuple(value.shape) == tuple(param.shape):
        return _PARAM_SHAPED
    return value.dim()


# ── matching groups ────────────────────────────────────────────────────────────────────────────────

def _group_misfit(saved: dict, per_param: dict, own: dict, expected: Optional[list[dict]], index: int) -> Optional[str]:
    """Why the saved group does not fit setup()'s group `own` (None when it does)."""
    ids, params = saved["params"], own["params"]
    if len(ids) != len(params):
        return f"the checkpoint's group holds {len(ids)} parameters, setup()'s {len(params)}"
    names, own_names = saved.get("param_names"), own.get("param_names")
    for k, (pid, param) in enumerate(zip(ids, params)):
        where = f"parameter {k}" + (f" ('{own_names[k]}')" if own_names and k < len(own_names) else "")
        if names and own_names and k < min(len(names), len(own_names)) and names[k] != own_names[k]:
            return f"{where} is saved as '{names[k]}'"
        entry = per_param.get(pid, per_param.get(str(pid)))
        if not isinstance(entry, dict) or not entry:
            continue
        why = _entry_misfit(entry, param, expected[k] if expected else None)
        if why:
            return f"{where} of shape {tuple(param.shape)}: {why}"
    return None


def _entry_misfit(entry: dict, param: torch.Tensor, expected: Optional[dict[str, Any]]) -> Optional[str]:
    tensors = {k: v for k, v in entry.items() if isinstance(v, torch.Tensor)}
    if expected is not None and expected:
        lacking = sorted(k for k in expected if k not in entry)
        if lacking:
            return (f"its saved state holds {', '.join(sorted(map(str, entry)))}, without {', '.join(lacking)}, "
                    "which this optimizer keeps (was it saved by another optimizer?)")
        for key, kind in expected.items():
            if kind == _PARAM_SHAPED and key in tensors and tuple(tensors[key].shape) != tuple(param.shape):
                return f"its saved {key} has shape {tuple(tensors[key].shape)}"
        return None
    shapes = {tuple(v.shape) for v in tensors.values() if v.dim() > 0}
    if len(shapes) == 1 and param.dim() > 0 and shapes != {tuple(param.shape)}:
        key = next(k for k, v in tensors.items() if v.dim() > 0)
        return f"its saved {key} has shape {tuple(tensors[key].shape)}"
    return None


def _orders(fits: list[list[Optional[str]]]) -> list[list[int]]:
    """Orders of the saved groups that fit setup()'s groups (order[j] = the saved group for group j), at most
    two (two already mean the shapes cannot tell). Up to 8 groups every order is tried; past that a group
    is placed only where it alone fits."""
    n = len(fits)
    found: list[list[int]] = []
    if n <= 8:
        for perm in itertools.permutations(range(n)):
            if all(fits[perm[j]][j] is None for j in range(n)):
                found.append(list(perm))
                if len(found) > 1:
                    break
        return found
    options = [[i for i in range(n) if fits[i][j] is None] for j in range(n)]
    if all(len(o) == 1 for o in options) and len({o[0] for o in options}) == n:
        found.append([o[0] for o in options])
    return found


def _named(groups: list[dict]) -> bool:
    return all(g.get("param_names") for g in groups)


def _sizes(groups: list[dict]) -> str:
    return "/".join(str(len(g["params"])) for g in groups)


def _keys(value: Any) -> str:
    return str(sorted(map(str, value))[:8]) if isinstance(value, dict) else type(value).__name__
