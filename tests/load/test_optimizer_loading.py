"""Loading a checkpoint's optimizer state into the optimizer setup() built (issue 22 item 2, loading):
every torch.optim optimizer and a user's own subclass load what they saved; a state saved by another
optimizer, or with its param groups in another order, is matched or refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import triage
from triage.errors import CheckpointError
from triage.load.session import session_from_factory
from triage.load.checkpoint import Checkpoint


class Scaled(torch.optim.Optimizer):
    """A user's own optimizer: its own setting (`scale`) and its own state key (`trace`)."""

    def __init__(self, params, lr=0.1, scale=0.5):
        super().__init__(params, {"lr": lr, "scale": scale})

    def step(self, closure=None):
        with torch.enable_grad():
            loss = closure() if closure is not None else None
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    trace = self.state[p].setdefault("trace", torch.zeros_like(p))
                    trace.mul_(group["scale"]).add_(p.grad)
                    p.add_(trace, alpha=-group["lr"])
        return loss


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(8, 3))


def _sparse_model() -> nn.Module:  # a recommender's embedding table: sparse gradients only
    torch.manual_seed(0)
    return nn.Sequential(nn.EmbeddingBag(10, 3, sparse=True))


OPTIMIZERS = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=1e-2),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=1e-2),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=1e-2),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "Adadelta": lambda p: torch.optim.Adadelta(p),
    "Adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=1e-2),
    "RMSprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
    "Rprop": lambda p: torch.optim.Rprop(p, lr=1e-2),
    "LBFGS": lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=3),
    "SparseAdam": lambda p: torch.optim.SparseAdam(list(p), lr=1e-2),
    "Muon": lambda p: torch.optim.Muon([q for q in p if q.dim() == 2], lr=1e-2),
    "user subclass": lambda p: Scaled(p),
}


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 10, (16, 2), generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(3)]


def _loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def _factory(name: str, groups=None, sparse: bool = False):
    def setup():
        model = _sparse_model() if sparse or name == "SparseAdam" else _model()
        params = groups(model) if groups else model.parameters()
        return triage.Setup(model=model, optimizer=OPTIMIZERS[name](params), loss_fn=_loss, batches=_batches())
    return setup


def _trained(factory, steps: int = 3):
    """The run as it was saved: a few real steps, so every optimizer holds its per-parameter state."""
    s = factory()
    for batch in _batches()[:steps]:
        def closure():
            s.optimizer.zero_grad()
            loss = _loss(s.model, batch)
            loss.backward()
            return loss
        s.optimizer.step(closure)
    return s


def _checkpoint(s) -> Checkpoint:
    return Checkpoint(layout="dict", model_state=s.model.state_dict(), optimizer_state=s.optimizer.state_dict())


def _same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), key
        elif isinstance(x, list):  # LBFGS's history
            assert len(x) == len(y) and all(u is v is None or torch.equal(u, v) for u, v in zip(x, y)), key
        else:
            assert x == y, key


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_optimizer_loads_the_state_it_saved(name):
    saved = _trained(_factory(name))
    session = session_from_factory(_factory(name), checkpoint=_checkpoint(saved))
    loaded = session.setup.optimizer
    assert type(loaded) is type(saved.optimizer)
    by_name = dict(saved.model.named_parameters())
    for pname, p in session.setup.model.named_parameters():  # each parameter's state is its own
        _same_state(saved.optimizer.state[by_name[pname]], loaded.state[p])
    for key, value in saved.optimizer.defaults.items():
        assert all(key in g for g in loaded.param_groups), key
    assert session.load_notes == []


def test_every_torch_optimizer_class_is_covered():
    classes = {n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
               and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and n != "Optimizer"}
    assert classes <= set(OPTIMIZERS)


@pytest.mark.parametrize("saved_by, built", [("SGD", "Adam"), ("Adam", "SGD"), ("SparseAdam", "RAdam"),
                                             ("Adamax", "Adam"), ("user subclass", "SGD")])
def test_a_state_saved_by_another_optimizer_is_refused_naming_what_it_lacks(saved_by, built):
    sparse = "SparseAdam" in (saved_by, built)
    saved = _trained(_factory(saved_by, sparse=sparse))
    with pytest.raises(CheckpointError) as refused:
        session_from_factory(_factory(built, sparse=sparse), checkpoint=_checkpoint(saved))
    text = str(refused.value)
    assert f"setup() built ({built if built != 'user subclass' else 'Scaled'})" in text
    assert "lack" in text or "without" in text
    assert "save the checkpoint without its optimizer state" in text


def _decay_groups(model):
    return [{"params": [model[2].weight], "weight_decay": 0.1},
            {"params": [model[0].weight, model[2].bias], "weight_decay": 0.0}]


def _swapped_groups(model):
    return list(reversed(_decay_groups(model)))


def test_param_groups_saved_in_another_order_load_onto_their_own_parameters():
    saved = _trained(_factory("Adam", _decay_groups))
    session = session_from_factory(_factory("Adam", _swapped_groups), checkpoint=_checkpoint(saved))
    loaded, model = session.setup.optimizer, session.setup.model
    by_name = dict(saved.model.named_parameters())
    for pname, p in model.named_parameters():
        _same_state(saved.optimizer.state[by_name[pname]], loaded.state[p])
    assert loaded.param_groups[0]["params"][0] is model[0].weight
    assert loaded.param_groups[0]["weight_decay"] == 0.0  # the group's own settings came with it
    assert [fid for fid, _ in session.load_notes] == ["optimizer_groups_reordered"]
    assert "saved group 1 -> group 0" in session.load_notes[0][1]


def test_param_groups_that_fit_no_order_are_refused_naming_the_parameter():
    saved = _trained(_factory("Adam", _decay_groups))

    def other_split(model):
        return [{"params": [model[0].weight]}, {"params": [model[2].weight, model[2].bias]}]

    with pytest.raises(CheckpointError) as refused:
        session_from_factory(_factory("Adam", other_split), checkpoint=_checkpoint(saved))
    text = str(refused.value)
    assert "group 0, parameter 0 of shape (10, 4): its saved exp_avg has shape (3, 8)" in text
    assert "no other order of the groups fits either" in text


class Lookahead(torch.optim.Optimizer):
    """A wrapper that steps the optimizer it holds: probing a copy of it would step the run's own weights."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__([p for g in inner.param_groups for p in g["params"]], {"lr": inner.defaults["lr"]})

    def step(self, closure=None):
        return self.inner.step(closure)


def test_an_optimizer_that_wraps_another_is_loaded_without_stepping_the_run_s_weights():
    def setup():
        model = _model()
        for p in model.parameters():  # a setup() that ran a backward (a warm-up, an LR finder) leaves gradients
            p.grad = torch.ones_like(p)
        return triage.Setup(model=model, optimizer=Lookahead(torch.optim.SGD(model.parameters(), lr=0.1)),
                            loss_fn=_loss, batches=_batches())

    saved = setup()
    with torch.no_grad():
        for p in saved.model.parameters():
            p.add_(1.0)  # the checkpoint's weights differ from a fresh setup()'s
    session = session_from_factory(setup, checkpoint=_checkpoint(saved))
    for key, value in session.setup.model.state_dict().items():
        assert torch.equal(value, saved.model.state_dict()[key]), key


def test_a_scheduler_s_wrapped_step_does_not_hide_the_optimizer_s_state():
    """A scheduler wraps step() on the optimizer instance; the probe must still measure Adam's own state (and
    so refuse Adamax's, which lacks exp_avg_sq)."""
    saved = _trained(_factory("Adamax"))

    def with_schedule():
        s = _factory("Adam")()
        scheduler = torch.optim.lr_scheduler.StepLR(s.optimizer, step_size=1)
        return triage.Setup(model=s.model, optimizer=s.optimizer, scheduler=scheduler, loss_fn=_loss,
                            batches=s.batches)

    with pytest.raises(CheckpointError, match="without exp_avg_sq, which this optimizer keeps"):
        session_from_factory(with_schedule, checkpoint=_checkpoint(saved))


@pytest.mark.parametrize("saved_with, built_with", [
    (lambda p: torch.optim.Adam(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True)),
    (lambda p: torch.optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
])
def test_a_state_saved_with_other_flags_of_the_same_optimizer_loads_as_torch_loads_it(saved_with, built_with):
    """The saved groups' settings apply once loaded (the disagreement is reported elsewhere): the state they
    kept (no max_exp_avg_sq without amsgrad, no momentum buffer without momentum) fits."""
    def factory(make):
        def setup():
            model = _model()
            return triage.Setup(model=model, optimizer=make(model.parameters()), loss_fn=_loss, batches=_batches())
        return setup

    saved = _trained(factory(saved_with))
    session = session_from_factory(factory(built_with), checkpoint=_checkpoint(saved))
    assert session.setup.optimizer.param_groups[0]["lr"] == saved.optimizer.param_groups[0]["lr"]


def _two_optimizers(d_optimizer="SGD"):
    def setup():
        model = _model()
        g = torch.optim.Adam(model[0].parameters(), lr=1e-2)
        d = OPTIMIZERS[d_optimizer](model[2].parameters())
        return triage.Setup(model=model, optimizers={"G": g, "D": d}, loss_fn=_loss, batches=_batches())
    return setup


def test_several_optimizers_saved_by_name_are_each_fitted_and_a_misfit_is_named():
    saved = _trained(_two_optimizers())
    state = {"model": saved.model.state_dict(),
             "optimizer": {name: saved.optimizer[name].state_dict() for name in ("G", "D")}}
    session = session_from_factory(_two_optimizers(),
                                   checkpoint=Checkpoint(layout="dict", model_state=state["model"],
                                                         optimizer_state=state["optimizer"]))
    by_name = dict(saved.model.named_parameters())
    for pname, p in session.setup.model.named_parameters():
        _same_state(saved.optimizer.state[by_name[pname]], session.setup.optimizer.state[p])
    with pytest.raises(CheckpointError, match="checkpoint's optimizer 'D' state to fit the optimizer setup\\(\\) "
                                              "built \\(Adam\\)"):
        session_from_factory(_two_optimizers("Adam"),
                             checkpoint=Checkpoint(layout="dict", model_state=state["model"],
                                                   optimizer_state=state["optimizer"]))
