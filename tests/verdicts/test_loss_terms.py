"""A loss made of named terms (issue 33, classes 6 and 8): `loss_fn` returns {"task": ..., "balance": ...} and
`Setup.auxiliary_terms` names the terms that are not the task's objective.

Class 6: a mixture-of-experts router picks its expert by argmax and its probability never scales the output,
so the objective sends it no gradient; only the load-balancing term trains it, and the task stalls (it was
called lr_too_low, high: a higher LR helps the experts a little). Class 8: BPR with its L2 penalty summed over
the batch (weight decay written into the loss, 512x too strong): the embeddings collapse and the ranking loss
sits at ln 2 (it was called healthy, low). Each is told apart from the same program without the bug."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import triage
from triage.errors import SetupError

CLASSES, FEATURES, EXPERTS = 4, 8, 4


def clustered(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four clusters, each labelled by its own linear rule: one linear expert per cluster fits it, a mix does not."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(EXPERTS, FEATURES, generator=torch.Generator().manual_seed(100)) * 4
    rules = torch.randn(EXPERTS, FEATURES, CLASSES, generator=torch.Generator().manual_seed(101))
    cluster = torch.randint(0, EXPERTS, (n,), generator=g)
    x = centers[cluster] + torch.randn(n, FEATURES, generator=g)
    return x, torch.einsum("nd,ndk->nk", x - centers[cluster], rules[cluster]).argmax(1)


class TopOneMoE(nn.Module):
    """Switch-style top-1 routing with its load-balancing term; `gate_scales_output=False` is the bug."""

    def __init__(self, gate_scales_output: bool):
        super().__init__()
        self.gate_scales_output = gate_scales_output
        self.router = nn.Linear(FEATURES, EXPERTS)
        self.experts = nn.ModuleList(nn.Linear(FEATURES, CLASSES) for _ in range(EXPERTS))

    def forward(self, x):
        probs = self.router(x).softmax(-1)
        top, rows = probs.argmax(-1), torch.arange(len(x))
        out = torch.stack([expert(x) for expert in self.experts], 1)[rows, top]
        if self.gate_scales_output:
            out = out * probs[rows, top, None]
        routed = F.one_hot(top, EXPERTS).float().mean(0)
        self.balance = EXPERTS * (routed * probs.mean(0)).sum()
        return out


def moe_terms(model, batch):
    x, y = batch
    return {"task": F.cross_entropy(model(x), y), "balance": 0.01 * model.balance}


def moe_setup(bug: bool, loss_fn=moe_terms, auxiliary=("balance",)):
    def setup():
        torch.manual_seed(0)
        (x, y), (vx, vy) = clustered(0, 1024), clustered(1, 256)
        model = TopOneMoE(gate_scales_output=not bug)
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn=loss_fn,
                            auxiliary_terms=auxiliary,
                            batches=[(x[i:i + 64], y[i:i + 64]) for i in range(0, 1024, 64)],
                            val_batches=[(vx[i:i + 64], vy[i:i + 64]) for i in range(0, 256, 64)])
    return setup


def trained(make, steps: int, tmp_path):
    """The run's own loop: the sum of the terms, backward, step."""
    setup, losses = make(), []
    for step in range(steps):
        setup.optimizer.zero_grad()
        terms = setup.loss_fn(setup.model, setup.batches[step % len(setup.batches)])
        sum(terms.values()).backward()
        setup.optimizer.step()
        losses.append(float(next(iter(terms.values())).detach()))
    return triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, step=steps), losses


def test_a_router_the_objective_reads_but_never_trains_is_no_gradient_flow(tmp_path):
    checkpoint, losses = trained(moe_setup(bug=True), 600, tmp_path)
    assert sum(losses[-50:]) / 50 > 0.95  # stalled: ln 4 = 1.39; the same MoE with its gate reaches 0.4
    report, _ = triage.run(moe_setup(bug=True), checkpoint, out=tmp_path / "report")
    assert (report.root_cause, report.confidence) == ("no_gradient_flow", "medium")
    assert report.path[-2:] == ["flow", "no_gradient_flow_objective"]
    flow = report.experiment("flow").outcome
    assert flow["objective_missed"] == ["router.weight", "router.bias"] and flow["auxiliary_terms"] == ["balance"]
    assert flow["objective_shift"] > 1e-3  # moving the router moves the task's loss: it reads the router
    assert "router.weight" in report.fix


def test_the_same_router_scaling_its_expert_is_not_called_a_fault(tmp_path):
    checkpoint, _ = trained(moe_setup(bug=False), 600, tmp_path)
    report, _ = triage.run(moe_setup(bug=False), checkpoint, out=tmp_path / "report")
    assert report.root_cause == "healthy"
    assert report.experiment("flow").outcome["objective_missed"] == []


def test_weights_only_an_auxiliary_term_reads_are_no_fault(tmp_path):
    """A learnable prior trained by its own term (a KL to it) gets no gradient from the task, and the task
    does not read it: the objective does not move when it moves, and no gradient fault is claimed."""

    class WithPrior(nn.Module):
        def __init__(self):
            super().__init__()
            self.net, self.prior = nn.Linear(FEATURES, CLASSES), nn.Parameter(torch.zeros(CLASSES))

        def forward(self, x):
            return self.net(x)

    def terms(model, batch):
        x, y = batch
        out = model(x)
        prior = F.kl_div(model.prior.log_softmax(-1), out.softmax(-1).detach().mean(0), reduction="sum")
        return {"task": F.cross_entropy(out, y), "prior": prior}

    def setup():
        torch.manual_seed(0)
        x, y = clustered(0, 512)
        model = WithPrior()
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn=terms,
                            auxiliary_terms=("prior",), batches=[(x[i:i + 64], y[i:i + 64]) for i in range(0, 512, 64)])

    from tests._instrument_runs import run, session_of
    from triage.experiments.gradient_flow import GRADIENT_FLOW

    flow = run(GRADIENT_FLOW, session_of(setup))
    assert flow.objective_missed == ["prior"] and flow.objective_shift == 0.0


# ── Class 8: a regulariser written into the loss ─────────────────────────────────────────────────────
USERS, ITEMS, DIM = 200, 300, 16


def preference_triples(seed: int, n: int):
    """(user, preferred item, other item) from a rank-4 taste model."""
    g = torch.Generator().manual_seed(seed)
    score = torch.randn(USERS, 4, generator=torch.Generator().manual_seed(7)) \
        @ torch.randn(ITEMS, 4, generator=torch.Generator().manual_seed(8)).T
    u = torch.randint(0, USERS, (n,), generator=g)
    a, b = torch.randint(0, ITEMS, (n,), generator=g), torch.randint(0, ITEMS, (n,), generator=g)
    better = score[u, a] > score[u, b]
    return u, torch.where(better, a, b), torch.where(better, b, a)


class Factorisation(nn.Module):
    def __init__(self):
        super().__init__()
        self.users, self.items = nn.Embedding(USERS, DIM), nn.Embedding(ITEMS, DIM)
        nn.init.normal_(self.users.weight, std=0.1)
        nn.init.normal_(self.items.weight, std=0.1)

    def forward(self, u, i):
        return (self.users(u) * self.items(i)).sum(-1)


def bpr_setup(penalty_summed: bool, lam: float = 1e-3):
    def loss_fn(model, batch):
        u, pos, neg = batch
        squares = (model.users(u).pow(2).sum(-1) + model.items(pos).pow(2).sum(-1)
                   + model.items(neg).pow(2).sum(-1))
        return {"bpr": -F.logsigmoid(model(u, pos) - model(u, neg)).mean(),
                "l2": lam * (squares.sum() if penalty_summed else squares.mean())}

    def setup():
        torch.manual_seed(0)
        (u, p, n), (vu, vp, vn) = preference_triples(0, 8192), preference_triples(1, 1024)
        model = Factorisation()
        return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn=loss_fn,
                            auxiliary_terms=("l2",),
                            batches=[(u[i:i + 512], p[i:i + 512], n[i:i + 512]) for i in range(0, 8192, 512)],
                            val_batches=[(vu[i:i + 512], vp[i:i + 512], vn[i:i + 512]) for i in range(0, 1024, 512)])
    return setup


def test_an_l2_penalty_summed_over_the_batch_is_weight_decay_too_high(tmp_path):
    checkpoint, losses = trained(bpr_setup(penalty_summed=True), 600, tmp_path)
    assert abs(sum(losses[-50:]) / 50 - math.log(2)) < 1e-3  # collapsed: every pair scored alike
    report, _ = triage.run(bpr_setup(penalty_summed=True), checkpoint, out=tmp_path / "report")
    assert (report.root_cause, report.confidence) == ("weight_decay_too_high", "high")
    assert report.path[-1] in ("auxiliary_term_too_strong", "auxiliary_term_too_strong_restart")
    proof = report.experiment(report.path[-1].replace("auxiliary_term_too_strong", "without_auxiliary")).outcome
    assert proof["loss_end"] < 0.5  # judged by the ranking loss, the objective both runs share


def test_the_same_penalty_as_a_mean_is_not_called_a_fault(tmp_path):
    checkpoint, _ = trained(bpr_setup(penalty_summed=False), 600, tmp_path)
    report, _ = triage.run(bpr_setup(penalty_summed=False), checkpoint, out=tmp_path / "report")
    assert report.root_cause == "healthy"


# ── The contract ──────────────────────────────────────────────────────────────────────────────────
def test_the_loss_read_is_the_objective_and_the_gradient_the_whole_loss():
    from triage.load.loss_terms import TermsLoss

    w = nn.Parameter(torch.tensor([2.0]))
    loss = TermsLoss(lambda model, batch: {"task": (w * batch).sum(), "l2": 0.5 * w.pow(2).sum()}, ("l2",))
    value = loss(None, torch.tensor([3.0]))
    value.backward()
    assert float(value) == 6.0 and float(w.grad) == 3.0 + 2.0
    w.grad = None
    loss.aux_scale = 0.0
    loss(None, torch.tensor([3.0])).backward()
    assert float(w.grad) == 3.0


@pytest.mark.parametrize("returned, auxiliary, said", [
    (lambda m, b: {"task": b.sum()}, ("l2",), "found terms ['task'] for auxiliary_terms ['l2']"),
    (lambda m, b: b.sum(), ("l2",), "found a single tensor"),
    (lambda m, b: {"l2": b.sum()}, ("l2",), "at least one term of the objective"),
    (lambda m, b: {"task": b}, (), "loss term 'task' to be a scalar tensor, found a tensor of shape (4,)"),
])
def test_terms_that_do_not_fit_auxiliary_terms_are_refused_with_what_to_do(returned, auxiliary, said, tmp_path):
    def setup():
        model = nn.Linear(4, 1)
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=returned,
                            auxiliary_terms=auxiliary, batches=[torch.ones(4)])

    with pytest.raises(SetupError, match="Expected") as raised:
        triage.run(setup, None, out=tmp_path)
    assert said in str(raised.value)


def test_without_its_auxiliary_terms_a_non_finite_one_reaches_neither_the_value_nor_the_gradient():
    from triage.load.loss_terms import TermsLoss

    w = nn.Parameter(torch.zeros(3))
    loss = TermsLoss(lambda model, batch: {"task": (w - 1).pow(2).sum(), "aux": w.abs().sqrt().sum() + torch.log(
        torch.tensor(0.0))}, ("aux",))
    loss.aux_scale = 0.0
    value = loss(None, None)
    value.backward()
    assert float(value) == 3.0 and torch.isfinite(w.grad).all()
