"""Several optimizers of one run (a GAN's G and D, actor and critic, separate heads) as one optimizer.

`Setup(optimizers={"G": opt_g, "D": opt_d})` hands triage this object as `Setup.optimizer`: everything
that reaches an optimizer through its param groups (an LR candidate, weight decay, the snapshot and its
restore) reaches every one of them, and `set["G"]` is the one named G. Its state_dict is the usual
layout over the groups of all of them, in the order given; `load_state_dict` also takes a dict of the
named optimizers' own states (`{"G": opt_g.state_dict(), "D": opt_d.state_dict()}`), matched by name.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.hooks import RemovableHandle


class _MergedState(dict):
    """The per-parameter states of every optimizer of the set, read in place (the values are theirs)."""

    def __init__(self, owners: list[torch.optim.Optimizer]):
        super().__init__()
        self._owners = owners
        for optimizer in owners:
            self.update(optimizer.state)

    def clear(self) -> None:  # the session frees the run's moments while a fresh copy trains
        for optimizer in self._owners:
            optimizer.state.clear()
        super().clear()


class OptimizerSet(torch.optim.Optimizer):
    """Named optimizers stepped together: step() and zero_grad() call each one in turn."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]):  # no super().__init__: nothing of its own
        if not optimizers:
            raise ValueError("expected at least one named optimizer, found none")
        for name, optimizer in optimizers.items():
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise ValueError(f"expected optimizers[{name!r}] to be a torch.optim.Optimizer, "
                                 f"found {type(optimizer).__name__}")
        self.optimizers = dict(optimizers)
        self.defaults: dict[str, Any] = {}
        for hooks in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                      "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                      "_optimizer_load_state_dict_post_hooks"):
            setattr(self, hooks, {})  # torch's own state_dict() reads them

    def __getitem__(self, name: str) -> torch.optim.Optimizer:
        return self.optimizers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.optimizers)

    # Read as the dict the step was written for: optimizers["G"], .items(), .keys(), .values(), len().
    def items(self):
        return self.optimizers.items()

    def keys(self):
        return self.optimizers.keys()

    def values(self):
        return self.optimizers.values()

    def __len__(self) -> int:
        return len(self.optimizers)

    def __repr__(self) -> str:
        return "OptimizerSet(" + ", ".join(f"{n}={type(o).__name__}" for n, o in self.optimizers.items()) + ")"

    # The groups are the optimizers' own dicts: changing a group's lr here changes it there.
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [g for optimizer in self.optimizers.values() for g in optimizer.param_groups]

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        raise AttributeError("an OptimizerSet's param groups are its optimizers'; change theirs")

    @property
    def state(self) -> dict:  # type: ignore[override]
        return _MergedState(list(self.optimizers.values()))

    @state.setter
    def state(self, value: Any) -> None:
        raise AttributeError("an OptimizerSet's state is its optimizers'; load theirs")

    def group_owner(self) -> list[str]:
        """The name of the optimizer each of param_groups belongs to, in order."""
        return [name for name, optimizer in self.optimizers.items() for _ in optimizer.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        for optimizer in self.optimizers.values():
            loss = optimizer.step(closure) if closure is not None else optimizer.step()
        return loss

    def register_step_pre_hook(self, hook: Callable) -> RemovableHandle:
        return _Handles([o.register_step_pre_hook(hook) for o in self.optimizers.values()])

    def register_step_post_hook(self, hook: Callable) -> RemovableHandle:
        return _Handles([o.register_step_post_hook(hook) for o in self.optimizers.values()])

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) == set(self.optimizers):  # one state per optimizer, by name
            for name, optimizer in self.optimizers.items():
                optimizer.load_state_dict(state_dict[name])
            return
        if not {"state", "param_groups"} <= set(state_dict):
            raise ValueError(f"expected the states of the optimizers {sorted(self.optimizers)} by name (or "
                             f"one state over all their param groups), found keys {sorted(state_dict)[:8]}")
        groups, state = state_dict["param_groups"], state_dict["state"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"expected {len(self.param_groups)} param groups (those of "
                             f"{', '.join(self.optimizers)}), found {len(groups)}")
        start = 0
        for optimizer in self.optimizers.values():
            mine = groups[start:start + len(optimizer.param_groups)]
            start += len(optimizer.param_groups)
            indices = [i for g in mine for i in g["params"]]
            local = {index: n for n, index in enumerate(indices)}
            optimizer.load_state_dict({
                "state": {local[i]: copy.copy(s) for i, s in state.items() if i in local},
                "param_groups": [{**g, "params": [local[i] for i in g["params"]]} for g in mine],
            })


class _Handles:
    def __init__(self, handles: list[RemovableHandle]):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class ManualUpdate(torch.optim.SGD):
    """What triage holds as `Setup.optimizer` for a loop that updates the weights itself, with no optimizer
    object (`p.data.add_(p.grad, alpha=-lr)`): plain SGD at the LR the setup declares (`manual_lr`), which
    is that update. The reference loop steps it; the run's own train_step never sees it: it is handed the
    LR of each step instead. With no LR declared, its LR is 0 and `declared` is False."""

    def __init__(self, params: Any, lr: Optional[float]):
        super().__init__(params, lr=lr if lr is not None else 0.0)
        self.declared = lr is not None
