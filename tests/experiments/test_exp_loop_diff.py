"""loop_diff: the user's train_step against the reference loop. Each classic loop bug fires its own
measurement; a correct step leaves them all quiet."""

import functools
import inspect

import pytest
import torch
from torch import nn

import triage
from tests._gan_tiny import gan_losses, gan_setup, gan_step
from tests._instrument_runs import classifier_setup, cross_entropy, run, session_of
from triage.experiments.loop_diff import LOOP_DIFF


def correct_step(model, optimizer, batch):
    model.train()
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def no_zero_grad(model, optimizer, batch):
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss


def no_optimizer_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    return loss


def eval_mode(model, optimizer, batch):
    model.eval()
    optimizer.zero_grad()
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    return loss


def detached_logits(model, optimizer, batch):
    x, y = batch
    optimizer.zero_grad()
    logits = model(x).detach().requires_grad_()  # the graph to the weights is cut here
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    optimizer.step()
    return loss


def _outcome(train_step):
    return run(LOOP_DIFF, session_of(lambda: classifier_setup(lr=0.1, train_step=train_step)))


def test_a_correct_step_is_quiet():
    out = _outcome(correct_step)
    assert out.has_train_step and out.steps_run == 20
    assert out.params_never_changed == [] and out.unchanged_fraction == 0.0
    assert not out.grads_accumulate and 0.9 < out.grad_growth < 1.1
    assert not out.left_in_eval and not out.eval_after_step
    assert out.optimizer_stepped and out.optimizer_steps == 20
    assert not out.loss_detached and not out.step_grads_zero
    assert out.user_loss_ratio < 0.8 and out.reference_loss_ratio < 0.8
    assert abs(out.user_loss_ratio - out.reference_loss_ratio) < 0.05  # the same loop, measured twice


def test_a_step_without_zero_grad_accumulates_gradients():
    out = _outcome(no_zero_grad)
    assert out.grads_accumulate and out.grad_growth > 2
    assert out.optimizer_stepped and not out.loss_detached and not out.left_in_eval


def test_a_step_that_never_steps_the_optimizer_changes_nothing():
    out = _outcome(no_optimizer_step)
    assert not out.optimizer_stepped and out.optimizer_steps == 0 and not out.step_grads_zero
    assert out.params_never_changed == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert out.unchanged_fraction == 1.0 and out.extra_unchanged_fraction == 1.0
    assert out.reference_never_changed == []
    assert out.reference_loss_ratio < 0.8 and out.user_loss_ratio > 0.9


def test_a_step_that_puts_the_model_in_eval_mode_is_caught():
    out = _outcome(eval_mode)
    assert out.left_in_eval and out.eval_forward_fraction == 1.0 and out.eval_after_step
    assert out.optimizer_stepped and not out.grads_accumulate


def test_a_loss_cut_from_the_weights_gives_no_parameter_a_gradient():
    out = _outcome(detached_logits)
    assert out.loss_detached
    assert out.returned_loss_has_grad  # the returned loss has a graph, just not one to the weights
    assert out.unchanged_fraction == 1.0


def test_without_a_train_step_there_is_nothing_to_compare():
    out = run(LOOP_DIFF, session_of(lambda: classifier_setup()))
    assert not out.has_train_step and out.steps_run == 0 and out.params_never_changed == []


@pytest.mark.parametrize("step", [correct_step, no_zero_grad, eval_mode])
def test_the_run_is_handed_back_as_it_was(step):
    session = session_of(lambda: classifier_setup(lr=0.1, train_step=step))
    before = [p.detach().clone() for p in session.setup.model.parameters()]
    run(LOOP_DIFF, session)
    assert all((a == b).all() for a, b in zip(before, session.setup.model.parameters()))
    assert session.setup.model.training
    assert "step" not in vars(session.setup.optimizer)  # the counting wrapper is gone


@pytest.mark.parametrize("step, accumulates", [(correct_step, False), (no_zero_grad, True)])
def test_dropout_and_batchnorm_noise_does_not_blur_accumulation(step, accumulates):
    # The fresh gradient sees another dropout mask than the user's step: the ratio is near 1, not exactly.
    model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))
    out = run(LOOP_DIFF, session_of(lambda: classifier_setup(lr=0.1, train_step=step, model=model)))
    assert out.grads_accumulate is accumulates


def zero_grad_between_backward_and_step(model, optimizer, batch):
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.zero_grad()  # the gradients are gone before step() uses them
    optimizer.step()
    return loss.detach()


def zero_grad_after_step(model, optimizer, batch):
    loss = cross_entropy(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()  # a correct order too: the next step starts clean
    return loss.detach()


def test_gradients_wiped_before_the_step_are_seen_as_zero_by_the_optimizer():
    out = _outcome(zero_grad_between_backward_and_step)
    assert out.step_grads_zero and out.grad_growth == 0.0
    assert out.optimizer_stepped and not out.loss_detached  # the gradients existed, then were wiped
    assert out.unchanged_fraction == 1.0 and out.reference_never_changed == []


def test_zeroing_after_the_step_is_quiet():
    out = _outcome(zero_grad_after_step)
    assert not out.step_grads_zero and not out.grads_accumulate and 0.9 < out.grad_growth < 1.1
    assert out.params_never_changed == []


def test_a_schedulers_own_wrapper_of_optimizer_step_is_put_back():
    def factory():
        setup = classifier_setup(lr=0.1, train_step=correct_step)
        return setup.model_copy(update={"scheduler": torch.optim.lr_scheduler.StepLR(setup.optimizer, 5)})

    session = session_of(factory)
    wrapped = vars(session.setup.optimizer)["step"]  # torch's LRScheduler patches step on the instance
    out = run(LOOP_DIFF, session)
    assert out.optimizer_steps == 20
    assert vars(session.setup.optimizer)["step"] is wrapped


class CallableStep:
    def __call__(self, model, optimizer, batch):
        return correct_step(model, optimizer, batch)


@pytest.mark.parametrize("step", [correct_step, functools.partial(correct_step), CallableStep()])
def test_the_outcome_says_where_train_step_is_defined(step):
    out = _outcome(step)
    function = correct_step if not isinstance(step, CallableStep) else CallableStep.__call__
    line = inspect.getsourcelines(function)[1]
    assert out.train_step_source.endswith(f"test_exp_loop_diff.py:{line}")


def no_grad_reaches_the_weights(model, optimizer, batch):
    optimizer.zero_grad()
    loss = torch.tensor(cross_entropy(model, batch).item(), requires_grad=True)  # rebuilt from a float
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.parametrize("step, bug, leaf", [
    (no_zero_grad, "Call optimizer.zero_grad() every step", "loop_bug_accumulate"),
    (no_optimizer_step, "Call optimizer.step() after loss.backward()", "loop_bug_no_step"),
    (eval_mode, "Call model.train()", "loop_bug_eval"),
    (no_grad_reaches_the_weights, "Call backward() on the loss as the model computed it", "loop_bug_detached"),
    (zero_grad_between_backward_and_step, "its step only ever sees zeroed gradients", "loop_bug_zeroed"),
])
def test_the_loop_bug_verdict_names_the_bug_measured_and_where_train_step_is(step, bug, leaf, tmp_path):
    report, _ = triage.run(lambda: classifier_setup(lr=0.1, train_step=step), None, out=tmp_path)
    where = f"test_exp_loop_diff.py:{inspect.getsourcelines(step)[1]}"
    assert report.root_cause == "loop_bug" and report.path[-1] == leaf
    assert bug in report.fix and where in report.fix
    assert report.location.source.endswith(where)


def test_the_accumulation_fix_quotes_the_growth_measured(tmp_path):
    report, _ = triage.run(lambda: classifier_setup(lr=0.1, train_step=no_zero_grad), None, out=tmp_path)
    growth = report.experiment("loop").outcome["grad_growth"]
    assert f"each step applied {growth:.4g}x a fresh gradient" in report.fix


def dcgan_step(reset_d: bool):
    """The DCGAN loop, each network reset through its module (netD.zero_grad(), as the example does), or with
    netD.zero_grad() dropped: D's step then sums every earlier D gradient, G's pass through D included."""
    def step(model, optimizers, batch):
        model.train()
        (real,) = batch
        if reset_d:
            model["D"].zero_grad()
        d_loss, _ = gan_losses(model, real)
        d_loss.backward()
        optimizers["D"].step()
        _, g_loss = gan_losses(model, real)
        model["G"].zero_grad()
        g_loss.backward()
        optimizers["G"].step()
        return d_loss.detach() + g_loss.detach()
    return step


gan_step_d_never_reset = dcgan_step(reset_d=False)
gan_step_module_zero_grad = dcgan_step(reset_d=True)


@pytest.mark.parametrize("step, share", [(gan_step, 0.0), (gan_step_module_zero_grad, 0.0),
                                         (gan_step_d_never_reset, 1.0)])
def test_an_optimizer_of_a_set_stepping_on_gradients_never_reset_is_caught(step, share):
    # Two optimizers on their own losses: no fresh gradient of loss_fn is a counterpart (grad_growth
    # stays unmeasured), but whether a step's gradient still holds the previous step's is exact.
    out = run(LOOP_DIFF, session_of(lambda: gan_setup(lr=2e-4).model_copy(update={"train_step": step})))
    assert out.grad_growth is None
    assert out.stale_gradient_share == share
    if share:
        assert out.stale_optimizer == "D"


def test_a_gan_loop_that_never_resets_d_is_called_a_loop_bug_naming_d(tmp_path):
    report, _ = triage.run(lambda: gan_setup(lr=2e-4).model_copy(update={"train_step": gan_step_d_never_reset}),
                           None, out=tmp_path)
    assert report.root_cause == "loop_bug" and report.path[-1] == "loop_bug_stale"
    loop = report.experiment("loop").outcome
    assert "Reset the gradients of 'D'" in report.fix
    assert f"On {loop['stale_compared']} of its {loop['stale_compared']} steps compared" in report.fix


def critic_through_the_fake(g_reset_first: bool):
    """PyTorch-GAN's WGAN loop: the critic's loss takes the generator's output without .detach() (harmless,
    its maintainers say, "since we later zero out the gradients" of G before G's step). With G's zero_grad
    moved to the top of the iteration, G steps on the critic's gradient plus its own."""
    def step(model, optimizers, batch):
        model.train()
        (real,) = batch
        if g_reset_first:
            optimizers["G"].zero_grad()
        fake = model["G"](torch.randn(real.shape[0], 4))
        d_real, d_fake = model["D"](real), model["D"](fake)  # the fake not detached
        d_loss = nn.functional.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
            nn.functional.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
        optimizers["D"].zero_grad()
        d_loss.backward()
        optimizers["D"].step()
        _, g_loss = gan_losses(model, real)
        if not g_reset_first:
            optimizers["G"].zero_grad()
        g_loss.backward()
        optimizers["G"].step()
        return d_loss.detach() + g_loss.detach()
    return step


@pytest.mark.parametrize("step, share", [(gan_step, 0.0), (gan_step_d_never_reset, 0.0),
                                         (critic_through_the_fake(g_reset_first=False), 0.0),
                                         (critic_through_the_fake(g_reset_first=True), 1.0)])
def test_an_optimizer_of_a_set_stepping_on_another_objectives_gradient_is_caught(step, share):
    out = run(LOOP_DIFF, session_of(lambda: gan_setup(lr=2e-4).model_copy(update={"train_step": step})))
    assert out.foreign_gradient_share == share
    if share:
        assert (out.foreign_optimizer, out.foreign_others) == ("G", "'D'")
        assert out.stale_gradient_share == 0.0  # G's gradients were reset each step, only too early


def test_a_gan_loop_whose_generator_steps_on_the_critics_gradient_is_a_loop_bug(tmp_path):
    """Was: unexplained (low) on the second round's WGAN-GP with optimizer_G.zero_grad() moved up."""
    step = critic_through_the_fake(g_reset_first=True)
    report, _ = triage.run(lambda: gan_setup(lr=2e-4).model_copy(update={"train_step": step}), None, out=tmp_path)
    assert report.root_cause == "loop_bug" and report.path[-1] == "loop_bug_foreign"
    loop = report.experiment("loop").outcome
    assert "Reset the gradients of 'G' right before its own backward" in report.fix
    assert f"on {loop['foreign_steps']} of its {loop['foreign_compared']} steps compared" in report.fix


def test_a_graph_cut_in_the_loss_itself_is_no_loop_bug(tmp_path):
    """Was: loop_bug (medium), "backward() reaches no weight": a MAML whose inner loop detaches its fast weights
    cuts the graph in its loss, and the reference loop, on the same loss_fn, reaches no weight either. The loop
    is sound; the gradient does not flow."""
    def cut_inside(model, batch):
        x, y = batch
        fast = [w.detach().requires_grad_() for w in model.parameters()]  # adapted weights, cut from the model's
        hidden = torch.relu(x @ fast[0].T + fast[1])
        return nn.functional.cross_entropy(hidden @ fast[2].T + fast[3], y)

    def step(model, optimizer, batch):
        optimizer.zero_grad()
        loss = cut_inside(model, batch)
        loss.backward()
        optimizer.step()
        return loss.detach()
    setup = lambda: classifier_setup(loss_fn=cut_inside, train_step=step)  # noqa: E731
    assert not run(LOOP_DIFF, session_of(setup)).loss_detached
    report, _ = triage.run(setup, None, out=tmp_path)
    assert report.root_cause == "no_gradient_flow", report.path


def _lbfgs_setup(zero_in_closure: bool) -> triage.Setup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    x = torch.randn(128, 3, generator=torch.Generator().manual_seed(0))
    batch = (x, x.sin().sum(1, keepdim=True))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=5, line_search_fn="strong_wolfe")

    def train_step(model, optimizer, batch):
        def closure():
            if zero_in_closure:
                optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(batch[0]), batch[1])
            loss.backward()
            return loss
        if not zero_in_closure:
            optimizer.zero_grad()  # once a step, as in an Adam loop: the closure's evaluations add up
        return optimizer.step(closure)

    return triage.Setup(model=model, optimizer=optimizer, batches=[batch], train_step=train_step,
                        loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))


@pytest.mark.parametrize("zero_in_closure", [True, False])
def test_a_closure_that_keeps_its_earlier_evaluations_gradients_is_caught(zero_in_closure):
    out = run(LOOP_DIFF, session_of(lambda: _lbfgs_setup(zero_in_closure)))
    assert out.closure_reevaluations >= 20  # LBFGS evaluated the closure again inside its steps
    assert out.closure_sums_gradients is not zero_in_closure
    assert out.closure_kept == 0 if zero_in_closure else out.closure_kept > out.closure_reevaluations / 2


def test_a_closure_that_resets_once_then_backpropagates_in_chunks_is_quiet():
    setup = _lbfgs_setup(zero_in_closure=True)

    def chunked(model, optimizer, batch):
        def closure():
            optimizer.zero_grad()
            total = 0.0
            for x, y in zip(batch[0].chunk(2), batch[1].chunk(2)):  # two backwards, one evaluation
                loss = nn.functional.mse_loss(model(x), y) / 2
                loss.backward()
                total = total + loss.detach()
            return total
        return optimizer.step(closure)
    out = run(LOOP_DIFF, session_of(lambda: setup.model_copy(update={"train_step": chunked})))
    assert out.closure_reevaluations >= 20 and out.closure_kept == 0 and not out.closure_sums_gradients


def test_an_optimizer_that_evaluates_its_closure_once_is_not_read():
    def sgd_closure_step(model, optimizer, batch):
        def closure():
            optimizer.zero_grad()
            loss = cross_entropy(model, batch)
            loss.backward()
            return loss
        return optimizer.step(closure)

    out = _outcome(sgd_closure_step)
    assert out.closure_reevaluations == 0 and not out.closure_sums_gradients


def test_a_shared_trunk_stepped_after_each_tasks_head_takes_no_foreign_gradient():
    """Multi-task: each head's optimizer steps after its own task's backward, the trunk's after both; the first
    task's gradient in the trunk is no other objective's push against it (cosine near 0, not -1)."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g),
                torch.randn(64, generator=g)) for _ in range(8)]
    torch.manual_seed(0)
    model = nn.ModuleDict({"trunk": nn.Sequential(nn.Linear(8, 32), nn.ReLU()), "cls": nn.Linear(32, 3),
                           "reg": nn.Linear(32, 1)})
    optimizers = {name: torch.optim.SGD(model[name].parameters(), lr=0.05) for name in ("trunk", "cls", "reg")}

    def losses(m, batch):
        h = m["trunk"](batch[0])
        return nn.functional.cross_entropy(m["cls"](h), batch[1]), nn.functional.mse_loss(m["reg"](h).squeeze(1), batch[2])

    def step(m, opts, batch):
        for o in opts.values():
            o.zero_grad()
        cls_loss, reg_loss = losses(m, batch)
        cls_loss.backward(retain_graph=True)
        opts["cls"].step()
        reg_loss.backward()
        opts["reg"].step()
        opts["trunk"].step()
        return (cls_loss + reg_loss).detach()
    setup = lambda: triage.Setup(model=model, optimizers=optimizers, batches=batches, train_step=step,  # noqa: E731
                                 loss_fn=lambda m, b: sum(losses(m, b)))
    out = run(LOOP_DIFF, session_of(setup))
    assert out.foreign_gradient_share == 0.0 and out.foreign_others is None
