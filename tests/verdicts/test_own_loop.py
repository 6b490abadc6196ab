"""The run's own train_step drives the replays (issue 21): a loop with no optimizer object, two optimizers,
a closure optimizer, a per-epoch scheduler, fp16 + GradScaler with gradient accumulation, ReduceLROnPlateau
and SparseAdam. Each is a tiny stock-PyTorch run built here."""

import math

import pytest
import torch
from torch import nn

import triage
from tests._instrument_runs import classifier_setup, cross_entropy, digits, mlp, run, session_of
from tests.tiny import context
from triage.experiments.base import NotApplicable
from triage.experiments.loop_diff import LOOP_DIFF
from triage.experiments.replay import REPLAY, ReplayParams


def replay(factory, **params):
    return REPLAY.measure(context(factory), ReplayParams(**params))


# --- 1. a loop with no optimizer object: the manual SGD update of PyTorch's word-language-model example --

def manual_sgd_step(lr: float = 0.1, clip: float = 0.25):
    def step(model, optimizer, batch):  # `optimizer` is not used: the run has none
        model.train()
        model.zero_grad()
        loss = cross_entropy(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        return loss.item()
    return step


def manual_step_given_lr(model, lr, batch):  # what a run with no optimizer hands triage: its LR comes in
    model.train()
    model.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss.item()


def manual_setup(**extra) -> triage.Setup:
    model = mlp()
    return triage.Setup(model=model, manual_lr=0.1, train_step=manual_step_given_lr, loss_fn=cross_entropy,
                        batches=digits(), **extra)


def test_a_healthy_manual_update_loop_is_no_loop_bug(tmp_path):
    # As the user wrote it: an optimizer handed to Setup (it was required), never stepped by the loop.
    factory = lambda: classifier_setup(lr=0.1, train_step=manual_sgd_step())  # noqa: E731
    loop = run(LOOP_DIFF, session_of(factory))
    assert loop.optimizer_stepped and loop.optimizer_steps == 0 and loop.manual_updates == 20
    assert loop.params_never_changed == [] and not loop.grads_accumulate
    report, _ = triage.run(factory, None, out=tmp_path)
    assert report.root_cause != "loop_bug"


def test_a_loop_with_no_optimizer_declares_its_lr_and_lr_candidates_reach_it():
    base = replay(manual_setup, steps=12)
    lower = replay(manual_setup, steps=12, lr_scale=0.1)
    assert base.loop_used == "user" and base.lrs == [0.1] * 12
    assert lower.lrs == pytest.approx([0.01] * 12)
    assert base.update_ratio > 3 * lower.update_ratio  # a tenth of the LR moved the weights much less
    loop = run(LOOP_DIFF, session_of(manual_setup))
    assert loop.optimizer_stepped and loop.manual_updates == 20 and not loop.grads_accumulate


# lr_too_low at medium: the run gives no validation data and no log, and the higher LR's gain was measured on the
# training batches its replays looped (playbook node lr_gain_where).
@pytest.mark.parametrize("lr, cause, confidence", [(1e-4, "lr_too_low", "medium"), (30.0, "lr_too_high", "high")])
def test_a_loop_with_no_optimizer_gets_its_lr_verdict_from_a_model_only_checkpoint(tmp_path, lr, cause, confidence):
    """A hand-written update saves the model only (it has no optimizer state): triage restores that, hands
    the step its LR times each candidate's factor, and the LR fault is found (issue 21's suite loops)."""
    def factory():
        torch.manual_seed(0)
        return triage.Setup(model=mlp(), manual_lr=lr, train_step=manual_step_given_lr, loss_fn=cross_entropy,
                            batches=digits())

    setup = factory()
    for i in range(20):
        manual_step_given_lr(setup.model, lr, setup.batches[i % len(setup.batches)])
    path = triage.save_checkpoint(tmp_path / "model_only.pt", setup.model, None, step=20)
    assert "optimizer" not in torch.load(path, weights_only=True)
    report, _ = triage.run(factory, path, out=tmp_path / "report")
    # Where the LR had to move over 1000x from the run's own, a loop that scales the step is as likely: medium
    # at most. Here x1000 is enough (1e-4 -> 0.1) going up, x0.1 going down.
    winner = next(c for d in report.decisions for c in d.candidates if c.winner)
    assert report.experiment(winner.id).outcome["least_working_factor"] in (1e3, 1e-1)
    assert (report.root_cause, report.confidence, winner.cap_reason) == (cause, confidence, None)


def test_a_manual_loop_without_a_declared_lr_says_an_lr_candidate_cannot_reach_it():
    def factory():
        return triage.Setup(model=mlp(), train_step=manual_step_given_lr_or_fixed, loss_fn=cross_entropy,
                            batches=digits())

    with pytest.raises(NotApplicable, match="declares no manual_lr"):
        replay(factory, steps=6, lr_scale=0.1)
    assert replay(factory, steps=6).steps_run == 6  # the run as it was replays


def manual_step_given_lr_or_fixed(model, lr, batch):
    return manual_step_given_lr(model, 0.1 if lr is None else lr, batch)


def test_a_clip_candidate_replaces_the_loops_own_clip():
    tight = replay(manual_setup, steps=6, clip=1e-4)
    free = replay(manual_setup, steps=6, no_clip=True)
    assert tight.update_ratio < 0.01 * free.update_ratio  # clip 1e-4 instead of the loop's 0.25
    assert tight.median_grad_norm > 0.25  # the norm recorded is the one before any clipping


# --- 6. fp16 autocast + GradScaler + gradient accumulation over 4 calls ---------------------------------

def amp_accumulating_setup() -> triage.Setup:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    calls = {"n": 0}

    def step(model, optimizer, batch):
        model.train()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = cross_entropy(model, batch) / 4
        scaler.scale(loss).backward()
        calls["n"] += 1
        if calls["n"] % 4 == 0:  # an optimizer step, and zero_grad, every fourth call
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        return loss.detach() * 4

    return triage.Setup(model=model, optimizer=optimizer, scaler=scaler, precision="fp16", train_step=step,
                        loss_fn=cross_entropy, batches=digits())


def test_an_accumulating_loop_replays_as_many_optimizer_steps_as_asked():
    out = replay(amp_accumulating_setup, steps=5)
    assert out.optimizer_steps == 5 and out.steps_run == 20  # 4 calls of the run's step per update


def test_fp16_gradscaler_accumulation_is_no_loop_bug(tmp_path):
    loop = run(LOOP_DIFF, session_of(amp_accumulating_setup))
    assert loop.optimizer_stepped and not loop.grads_accumulate
    assert loop.optimizer_steps + loop.scaler_skipped_steps == 5 and loop.zero_grad_calls == 5
    assert 0.8 < loop.grad_growth < 1.25
    report, _ = triage.run(amp_accumulating_setup, None, out=tmp_path)
    assert report.root_cause != "loop_bug"


# --- 2. two optimizers: a GAN with a learning-rate typo in both -----------------------------------------

def test_a_gan_with_two_optimizers_replays_both_and_is_not_called_healthy(tmp_path):
    from tests._gan_tiny import gan_setup

    typo = lambda: gan_setup(lr=2.0)  # noqa: E731  (2e-4 meant)
    setup = typo()
    assert set(setup.optimizer.optimizers) == {"G", "D"}  # no pydantic "Input should be an instance of Optimizer"
    loop = run(LOOP_DIFF, session_of(typo))
    assert loop.optimizer_steps == 40 and loop.params_never_changed == []  # both networks stepped, each call
    report, _ = triage.run(typo, None, out=tmp_path)
    assert report.root_cause == "lr_too_high"
    assert report.experiment("baseline").outcome["loop_used"] == "user"


def test_the_verdict_names_the_optimizer_whose_lr_is_the_fault(tmp_path):
    """Issue 21: with several optimizers an LR candidate scaled them all together, and the fix could not say
    which to change. A typo in D's LR alone (G's is right): the search's factor on each LR alone names D."""
    from tests._gan_tiny import gan_setup

    report, _ = triage.run(lambda: gan_setup(lr=2e-4, lr_d=2.0), None, out=tmp_path)
    assert report.root_cause == "lr_too_high"
    proof = report.experiment(report.proof).outcome
    alone = {t["setting"].split("'")[1]: t["fix_works"] for t in proof["trials"] if t["setting"].endswith("alone")}
    assert proof["lr_owner"] == "D" and alone == {"G": False, "D": True}
    (change,) = report.fix_trial.changes
    assert change.setting == "learning rate of 'D'" and change.before == pytest.approx(2.0)


def test_a_flat_sum_of_several_optimizers_losses_is_said_to_be_no_plateau_by_itself(tmp_path):
    """A healthy GAN's summed loss stays flat at its equilibrium, and the report says why its flat curve is no
    evidence. Its loss has no level of learning nothing and no floor: no stall was measured, and no fix is
    judged by that sum (a fix that draws it toward 0 need not help either network: a WGAN-GP's critic at
    lr x0.001 did, and was called the cause at "high"). No fault found, with low confidence."""
    from tests._gan_tiny import gan_setup

    report, _ = triage.run(lambda: gan_setup(lr=2e-4), None, out=tmp_path)
    assert "several_objectives" in [f.id for f in report.findings]
    assert (report.root_cause, report.confidence, report.path[-1]) == ("healthy", "low", "healthy_several_objectives")
    assert "plateau" not in report.path and "2 optimizers" in report.fix


def two_optimizers_one_triplet_loss(lr: float = 1e-3) -> triage.Setup:
    """An embedding net trained on a triplet margin loss (no labels: neither a level of learning nothing nor a
    floor is measured for it), its body and its head each with an Adam of its own (as Muon beside AdamW), both
    stepped after one backward of one loss."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 16, generator=g) * 2
    batches = []
    for _ in range(16):
        a, n = torch.randint(0, 8, (64,), generator=g), torch.randint(0, 8, (64,), generator=g)
        noise = lambda: torch.randn(64, 16, generator=g) * 0.5  # noqa: E731
        batches.append((centres[a] + noise(), centres[a] + noise(), centres[n] + noise()))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizers = {"body": torch.optim.Adam(model[0].parameters(), lr=lr),
                  "head": torch.optim.Adam(model[2].parameters(), lr=lr)}

    def loss_fn(m, batch):
        anchor, positive, negative = (m(t) for t in batch)
        return nn.functional.triplet_margin_loss(anchor, positive, negative, margin=1.0)

    def step(m, opts, batch):
        opts["body"].zero_grad(); opts["head"].zero_grad()
        loss = loss_fn(m, batch)
        loss.backward()
        opts["body"].step(); opts["head"].step()
        return loss.detach()
    return triage.Setup(model=model, optimizers=optimizers, loss_fn=loss_fn, train_step=step, batches=batches)


def test_several_optimizers_are_several_objectives_only_where_each_steps_its_own_loss():
    """Each backward is read by the optimizers that step on it: some of them (a GAN's critic, then its generator,
    in one call, in turns, with n_critic critic steps per generator step, or accumulated) is several
    objectives; all of them after one backward (body and head on one loss) is one."""
    from tests._gan_tiny import gan_losses, gan_setup

    def in_turns(every: int, accumulate: int = 1):
        calls = [0]

        def step(model, optimizers, batch):
            calls[0] += 1
            d_loss, g_loss = gan_losses(model, batch[0])
            if accumulate > 1:  # both losses accumulated, each network stepped every `accumulate` calls
                (d_loss / accumulate).backward()
                if calls[0] % accumulate == 0:
                    optimizers["D"].step(); optimizers["D"].zero_grad()
                _, g_loss = gan_losses(model, batch[0])
                (g_loss / accumulate).backward()
                if calls[0] % accumulate == 0:
                    optimizers["G"].step(); optimizers["G"].zero_grad()
            elif calls[0] % every:
                optimizers["D"].zero_grad(); d_loss.backward(); optimizers["D"].step()
            else:
                optimizers["G"].zero_grad(); g_loss.backward(); optimizers["G"].step()
            return (d_loss + g_loss).detach()
        return lambda: gan_setup(lr=2e-4).model_copy(update={"train_step": step})

    assert run(LOOP_DIFF, session_of(lambda: gan_setup(lr=2e-4))).separate_objectives
    for turns in (in_turns(2), in_turns(5), in_turns(1, accumulate=4)):
        assert run(LOOP_DIFF, session_of(turns)).separate_objectives
    assert not run(LOOP_DIFF, session_of(two_optimizers_one_triplet_loss)).separate_objectives


def test_two_optimizers_on_one_levelless_loss_are_one_objective_a_fix_is_judged_by(tmp_path):
    """Was: healthy (low), "several optimizers, each on its own loss", with no fix tried: any run with two
    optimizers and a loss with no level went there. Body and head on one triplet loss, both at lr 1e-7 where
    1e-3 trains: the walk goes on to the plateau's fixes."""
    report, _ = triage.run(lambda: two_optimizers_one_triplet_loss(lr=1e-7), None, out=tmp_path)
    assert "healthy_several_objectives" not in report.path and "plateau" in report.path, report.path
    assert report.root_cause == "lr_too_low", (report.root_cause, report.path)
    assert "several_objectives" not in [f.id for f in report.findings]


def test_a_second_optimizer_setup_did_not_hand_triage_is_named_not_ignored(tmp_path):
    from tests._gan_tiny import gan_setup

    def only_d():  # the setup: optimizer=opt_d, while train_step also steps G's Adam
        setup = gan_setup(lr=2.0)
        both = setup.optimizer
        return setup.model_copy(update={"optimizer": both["D"],
                                        "train_step": lambda model, _, batch: setup.train_step(model, both, batch)})

    with pytest.raises(NotApplicable, match=r"stepped an optimizer setup\(\) did not hand triage \(Adam over"):
        replay(only_d, steps=2)
    assert "Setup(optimizers=" in run(LOOP_DIFF, session_of(only_d)).unknown_optimizers
    report, _ = triage.run(only_d, None, out=tmp_path)
    assert report.root_cause == "inconclusive" and "did not hand triage" in report.fix, report.fix
    assert "traceback" not in report.fix  # the reason is said, not hidden behind "read the traceback"


def test_one_optimizer_of_a_set_can_be_scaled_alone():
    from tests._gan_tiny import gan_setup

    both = replay(lambda: gan_setup(lr=2.0), steps=3, lr_scale=0.5)
    d_only = replay(lambda: gan_setup(lr=2.0), steps=3, lr_scale=0.5, lr_of="D")
    assert both.losses != d_only.losses
    assert both.lr_changed_in == ["G", "D"] and d_only.lr_changed_in == ["D"]
    with pytest.raises(ValueError, match="lr_of to name one of the run's optimizers"):
        replay(lambda: gan_setup(lr=2.0), steps=1, lr_scale=0.5, lr_of="critic")


def test_a_checkpoint_holds_each_optimizers_state_by_name():
    from tests._gan_tiny import gan_setup
    from triage.load.checkpoint import Checkpoint

    trained = gan_setup(lr=2e-3)
    for batch in trained.batches[:3]:
        trained.train_step(trained.model, trained.optimizer, batch)
    states = {name: o.state_dict() for name, o in trained.optimizer.items()}
    session = session_of(lambda: gan_setup(lr=2e-3),
                         Checkpoint(layout="dict", model_state=trained.model.state_dict(), optimizer_state=states))
    for name, optimizer in session.setup.optimizer.items():
        first = next(iter(optimizer.state.values()))
        saved = next(iter(trained.optimizer[name].state.values()))
        assert int(first["step"]) == 3 and torch.equal(first["exp_avg"], saved["exp_avg"])


# --- 3. a closure optimizer: LBFGS ------------------------------------------------------------------------

def lbfgs_setup(**extra) -> triage.Setup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(128, 3, generator=torch.Generator().manual_seed(0))
    batches = [(x, x.sin().sum(1, keepdim=True))]  # full-batch, as LBFGS runs (PyTorch's time-series example)
    return triage.Setup(model=model, optimizer=torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=5),
                        loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]), batches=batches, **extra)


def lbfgs_own_step(model, optimizer, batch):
    def closure():
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        return loss
    return optimizer.step(closure)


@pytest.mark.parametrize("own_step", [False, True])
def test_lbfgs_replays_with_a_closure_and_reaches_a_verdict(own_step, tmp_path):
    factory = (lambda: lbfgs_setup(train_step=lbfgs_own_step)) if own_step else lbfgs_setup
    out = replay(factory, steps=8)
    assert out.finite and out.steps_run == 8 and out.loss_ratio < 0.5
    report, _ = triage.run(factory, None, out=tmp_path)
    assert report.experiment("baseline").status == "ok"
    assert report.root_cause == "healthy"


def lbfgs_zero_grad_outside_the_closure(model, optimizer, batch):
    def closure():
        loss = nn.functional.mse_loss(model(batch[0]), batch[1])
        loss.backward()
        return loss
    optimizer.zero_grad()  # once a step, as in an Adam loop: the closure's evaluations are summed
    return optimizer.step(closure)


def test_an_lbfgs_closure_without_zero_grad_is_a_loop_bug_not_an_lr(tmp_path):
    # The summed gradients mislead the line search; a far higher LR makes up for part of it, which read alone
    # was lr_too_low with an LR x1000 fix (a PINN's L-BFGS phase).
    report, _ = triage.run(lambda: lbfgs_setup(train_step=lbfgs_zero_grad_outside_the_closure), None, out=tmp_path)
    assert report.root_cause == "loop_bug"
    assert "inside the closure" in report.fix
    assert report.experiment("loop").outcome["closure_sums_gradients"]


# --- 4. a scheduler stepped once per epoch (StepLR in PyTorch's MNIST example) ---------------------------

def per_epoch_setup(**extra) -> triage.Setup:
    model = mlp()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits(),
                        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7), **extra)


def test_a_per_epoch_scheduler_steps_once_an_epoch():
    out = replay(lambda: per_epoch_setup(scheduler_interval="epoch", steps_per_epoch=8), steps=12)
    assert out.lrs == pytest.approx([1.0] * 8 + [0.7] * 4) and out.scheduler_steps == 1
    per_step = replay(per_epoch_setup, steps=12)
    assert per_step.lrs[-1] == pytest.approx(0.7 ** 11)  # as the run declares: once a step


def test_the_first_epoch_boundary_is_where_the_runs_was():
    from tests._instrument_runs import trained_checkpoint

    factory = lambda: per_epoch_setup(scheduler_interval="epoch", steps_per_epoch=8)  # noqa: E731
    checkpoint = trained_checkpoint(lambda: per_epoch_setup(), 0)
    checkpoint = type(checkpoint)(layout="dict", model_state=checkpoint.model_state, step=13)  # 5 into epoch 1
    session = session_of(factory, checkpoint)
    session.restore()
    from triage.experiments.base import Context

    out = REPLAY.measure(Context(session=session, budget_s=60), ReplayParams(steps=6))
    # The checkpoint holds its step and no optimizer state to check a placed schedule's LR against: the scheduler
    # stays where setup() built it, and steps at the epoch's end, 3 steps in
    assert out.lrs == pytest.approx([1.0] * 3 + [0.7] * 3)


def test_per_epoch_needs_the_epochs_length():
    with pytest.raises(Exception, match="steps_per_epoch"):
        per_epoch_setup(scheduler_interval="epoch")


# --- ReduceLROnPlateau gets the loss; SparseAdam's sparse gradients clip ----------------------------------

@pytest.mark.parametrize("own_step", [False, True])
def test_reduce_lr_on_plateau_is_handed_the_loss(own_step):
    def factory():
        setup = classifier_setup(lr=0.1, train_step=_plain_step if own_step else None)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(setup.optimizer, patience=0, factor=0.5, threshold=10.0)
        return setup.model_copy(update={"scheduler": plateau})

    out = replay(factory, steps=6)
    assert out.finite and out.scheduler_steps == 6
    assert out.lrs[0] == 0.1 and out.lrs[-1] < 0.1  # a 1000% threshold: no step counts as better


def _plain_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def sparse_setup(**extra) -> triage.Setup:
    torch.manual_seed(0)

    class Recommender(nn.Module):
        def __init__(self):
            super().__init__()
            self.users, self.items = nn.Embedding(50, 8, sparse=True), nn.Embedding(40, 8, sparse=True)

        def forward(self, u, i):
            return (self.users(u) * self.items(i)).sum(-1)

    model = Recommender()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 50, (64,), generator=g), torch.randint(0, 40, (64,), generator=g),
                torch.rand(64, generator=g)) for _ in range(4)]
    return triage.Setup(model=model, optimizer=torch.optim.SparseAdam(list(model.parameters()), lr=0.05),
                        loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0], b[1]), b[2]), batches=batches, **extra)


@pytest.mark.parametrize("params", [{}, {"clip": 1e-3}, {"clip_scale": 0.1}])
def test_sparse_adam_replays_and_clips_sparse_gradients(params):
    out = replay(lambda: sparse_setup(grad_clip=1.0), steps=5, **params)
    assert out.finite and out.steps_run == 5 and all(math.isfinite(n) and n > 0 for n in out.grad_norms)
    if params.get("clip"):
        assert out.clipped_fraction == 1.0


def test_the_lr_trace_of_a_per_epoch_scheduler_holds_each_epoch():
    from triage.experiments.lr_trace import LR_TRACE

    out = run(LR_TRACE, session_of(lambda: per_epoch_setup(scheduler_interval="epoch", steps_per_epoch=8,
                                                           total_steps=24)))
    by_step = dict(zip(out.steps, out.lrs))
    assert by_step[0] == by_step[7] == 1.0
    assert by_step[8] == pytest.approx(0.7) and by_step[23] == pytest.approx(0.49)
    assert out.lr_end == pytest.approx(0.343)


def test_locate_steps_lbfgs_with_its_closure():
    from triage.experiments.locate import LOCATE_NONFINITE as LOCATE

    out = run(LOCATE, session_of(lbfgs_setup), steps=3)
    assert not out.found and out.steps_run == 3


# --- what reaches the run's own step, and what it says when something cannot -------------------------------

def test_a_precision_candidate_is_not_applicable_under_the_loops_own_autocast():
    with pytest.raises(NotApplicable, match=r"16 of 16 forwards of train_step ran under its own autocast"):
        replay(amp_accumulating_setup, steps=4, precision="bf16")
    plain = replay(lambda: classifier_setup(train_step=_plain_step), steps=4, precision="bf16")
    assert plain.loop_used == "user" and plain.finite


def test_an_lr_the_loop_sets_by_hand_each_iteration_is_scaled_too():
    def sets_its_own_lr(model, optimizer, batch):  # nanoGPT: for g in optimizer.param_groups: g["lr"] = lr
        for group in optimizer.param_groups:
            group["lr"] = 0.1
        return _plain_step(model, optimizer, batch)

    factory = lambda: classifier_setup(lr=0.5, train_step=sets_its_own_lr)  # noqa: E731  (setup's 0.5 unused)
    out = replay(factory, steps=3, lr_scale=0.01)
    assert out.lrs == pytest.approx([0.001] * 3)  # the loop's own 0.1, times the candidate's 0.01
    assert out.update_ratio < 0.05 * replay(factory, steps=3).update_ratio


def test_a_replay_on_another_loss_runs_the_reference_loop_and_says_so():
    from tests.tiny import context as tiny_context
    from triage.experiments.replay import measure

    ctx = tiny_context(lambda: classifier_setup(train_step=_plain_step))
    out = measure(ctx, ReplayParams(steps=3), loss_fn=cross_entropy)
    assert out.loop_used == "reference" and "another loss" in out.loop_note


def test_reduce_lr_on_plateau_stepped_per_batch_down_to_nothing_is_found_in_its_lr(tmp_path):
    """An epoch-level ReduceLROnPlateau stepped on every batch's loss with patience 0: ten reductions in a
    dozen batches take the LR from 0.1 to 1e-8 (its eps stops it there), and the run stalls far from
    trained. The plateau scheduler has no trace to replay, but an LR under its start was reduced from it:
    past its peak."""
    def factory():
        setup = classifier_setup(lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(setup.optimizer, patience=0, factor=0.1,
                                                             threshold=10.0)
        return setup.model_copy(update={"scheduler": plateau})

    setup = factory()
    for i in range(12):
        setup.optimizer.zero_grad()
        loss = cross_entropy(setup.model, setup.batches[i % len(setup.batches)])
        loss.backward()
        setup.optimizer.step()
        setup.scheduler.step(loss.item())
    assert setup.optimizer.param_groups[0]["lr"] < 1.1e-8
    path = triage.save_checkpoint(tmp_path / "ckpt.pt", setup.model, setup.optimizer, scheduler=setup.scheduler,
                                  step=12)
    report, _ = triage.run(factory, path, out=tmp_path / "report")
    schedule = report.experiment("schedule").outcome
    assert schedule["metric_driven"] and schedule["past_peak"] and schedule["lr_now_ratio"] < 1e-6
    assert report.root_cause == "lr_schedule_decayed"
