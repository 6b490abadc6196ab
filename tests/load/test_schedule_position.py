"""A checkpoint that holds its step and not the scheduler's state (NeRF's `{global_step, network_fn_state_dict,
optimizer_state_dict}`, the twelfth round's Fourier-feature MLP): setup()'s scheduler stood at its step 0, so
the replays ran the schedule from its start (an LR decayed 1e12-fold by step 3000 replayed at its peak), and a
stalled run went to healthy. The scheduler is stepped to the checkpoint's step before anything replays."""

import torch

import triage
from tests._instrument_runs import cross_entropy, digits, mlp, session_of
from triage.load.checkpoint import read_checkpoint

STEPS = 600


def factory(decay_steps: int):
    """NeRF's decay, lr x 0.1 every `decay_steps` steps, as a LambdaLR: a function of the step (no chained LR to
    carry the decay over in the optimizer's saved state)."""
    def setup() -> triage.Setup:
        torch.manual_seed(0)
        model = mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return triage.Setup(model=model, optimizer=optimizer, loss_fn=cross_entropy, batches=digits(16, 64),
                            scheduler=torch.optim.lr_scheduler.LambdaLR(
                                optimizer, lambda step: 0.1 ** (step / decay_steps)))
    return setup


def trained(tmp_path, decay_steps: int, steps: int = STEPS):
    run = factory(decay_steps)()
    for step in range(steps):
        run.optimizer.zero_grad()
        run.loss_fn(run.model, run.batches[step % len(run.batches)]).backward()
        run.optimizer.step()
        run.scheduler.step()
    path = tmp_path / "ckpt.tar"
    torch.save({"global_step": steps, "network_fn_state_dict": run.model.state_dict(),
                "optimizer_state_dict": run.optimizer.state_dict()}, path)
    return run, path


def test_the_scheduler_continues_from_the_checkpoints_step(tmp_path):
    run, path = trained(tmp_path, decay_steps=100, steps=50)
    session = session_of(factory(100), read_checkpoint(path))
    assert session.setup.scheduler.last_epoch == 50
    session.setup.optimizer.step()
    session.setup.scheduler.step()
    run.scheduler.step()
    assert session.setup.optimizer.param_groups[0]["lr"] == run.optimizer.param_groups[0]["lr"]  # not 0.01 * 0.1 ** (1 / 100)
    assert ("scheduler_placed" in [fid for fid, _ in session.load_notes])


def test_a_schedule_that_decayed_before_the_checkpoint_is_found_where_the_checkpoint_says_only_its_step(tmp_path):
    _, path = trained(tmp_path, decay_steps=50)  # in thousands of steps, meant: the LR 1e-12 of its peak by 600
    report = triage.run(factory(50), path, out=tmp_path / "report")[0]
    assert report.root_cause == "lr_schedule_decayed", report.path
    assert "scheduler_placed" in [f.id for f in report.findings]


def test_a_step_that_counts_micro_batches_is_not_where_the_schedule_says(tmp_path):
    """Under gradient accumulation a loop's `enumerate(loader)` step counts micro-batches: stepped that many
    times, the schedule lands past where the run stood (here past its end: LR 0). The LR the checkpoint's
    optimizer saved says so, and the scheduler is left unplaced."""
    run, path = trained(tmp_path, decay_steps=100, steps=50)
    saved = torch.load(path, weights_only=False)
    saved["global_step"] = 200  # 4 micro-batches an optimizer step
    torch.save(saved, path)
    session = session_of(factory(100), read_checkpoint(path))
    assert session.setup.scheduler.last_epoch == 0
    assert "scheduler_not_placed" in [fid for fid, _ in session.load_notes]


def test_a_scheduler_whose_step_wants_arguments_is_left_unplaced(tmp_path):
    class EpochScheduler:  # timm's: step(epoch, metric=None), moved by step_update in the run's own step
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self, epoch, metric=None):
            pass

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    def setup() -> triage.Setup:
        made = factory(100)()
        return made.model_copy(update={"scheduler": EpochScheduler(made.optimizer)})

    _, path = trained(tmp_path, decay_steps=100, steps=50)
    session = session_of(setup, read_checkpoint(path))
    assert "scheduler_not_placed" in [fid for fid, _ in session.load_notes]
