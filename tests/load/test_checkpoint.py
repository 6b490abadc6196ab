"""Checkpoint layouts: plain dict, bare state_dict, Lightning, Hugging Face Trainer folder."""

import json

import pytest
import torch

from tests.tiny import mlp_setup
from triage.errors import CheckpointError
from triage.load.checkpoint import read_checkpoint
from triage.load.session import open_session


def trained_state():
    torch.manual_seed(1)
    s = mlp_setup(optimizer="adam", lr=0.01)
    s.optimizer.zero_grad()
    s.loss_fn(s.model, s.batches[0]).backward()
    s.optimizer.step()
    return s


@pytest.fixture
def entry(tmp_path):
    (tmp_path / "entry.py").write_text("from tests.tiny import mlp_setup\n\ndef setup():\n"
                                       "    return mlp_setup(optimizer='adam', lr=0.01)\n")
    return f"{tmp_path / 'entry.py'}:setup"


def loaded_weights(entry, path):
    return open_session(entry, path).setup.model.state_dict()["0.weight"]


def test_plain_dict_with_history(tmp_path, entry):
    s = trained_state()
    torch.save({"model_state_dict": s.model.state_dict(), "optimizer_state_dict": s.optimizer.state_dict(),
                "step": 7, "history": [2.0, 1.5, float("nan")]}, tmp_path / "c.pt")
    ckpt = read_checkpoint(tmp_path / "c.pt")
    assert (ckpt.layout, ckpt.step) == ("dict", 7)
    assert [p.loss for p in ckpt.history][:2] == [2.0, 1.5]
    session = open_session(entry, tmp_path / "c.pt")
    assert torch.equal(session.setup.model.state_dict()["0.weight"], s.model.state_dict()["0.weight"])
    assert session.setup.optimizer.state_dict()["state"][0]["step"] == 1


def test_a_model_entry_of_another_name_is_its_one_entry_of_tensors(tmp_path, entry):
    """Deep-SVDD's trainer saves {'c', 'epoch', 'net_dict', 'optimizer'} (the ninth round's program): the model
    is the one entry whose every value is a tensor. Two such entries (a net and its autoencoder) are refused,
    naming the entries found."""
    s = trained_state()
    torch.save({"c": torch.zeros(4), "epoch": 20, "net_dict": s.model.state_dict(),
                "optimizer": s.optimizer.state_dict()}, tmp_path / "svdd.pt")
    assert read_checkpoint(tmp_path / "svdd.pt").layout == "dict"
    assert torch.equal(loaded_weights(entry, tmp_path / "svdd.pt"), s.model.state_dict()["0.weight"])
    torch.save({"net_dict": s.model.state_dict(), "ae_net_dict": s.model.state_dict()}, tmp_path / "two.pt")
    with pytest.raises(CheckpointError, match="ae_net_dict"):
        read_checkpoint(tmp_path / "two.pt")


def test_an_optimizer_entry_of_another_name_and_a_loss_log_under_a_usual_name_are_read(tmp_path, entry):
    """A hypernetwork's script saves {'iteration', 'hnet_state', 'optimizer_state', 'losses'} (the twelfth
    round's program): triage replayed it with fresh Adam moments, whose first steps spiked the loss, and called
    the healthy run lr_too_high with high confidence. The optimizer is the one entry shaped as
    Optimizer.state_dict() (two such, a GAN's, are not guessed between), the log is `losses`."""
    s = trained_state()
    torch.save({"iteration": 7, "hnet_state": s.model.state_dict(), "optimizer_state": s.optimizer.state_dict(),
                "losses": [2.0, 1.5, 1.2]}, tmp_path / "hnet.pt")
    ckpt = read_checkpoint(tmp_path / "hnet.pt")
    assert ckpt.step == 7 and [p.loss for p in ckpt.history] == [2.0, 1.5, 1.2]
    session = open_session(entry, tmp_path / "hnet.pt")
    assert session.setup.optimizer.state_dict()["state"][0]["step"] == 1
    torch.save({"net": s.model.state_dict(), "opt_g": s.optimizer.state_dict(), "opt_d": s.optimizer.state_dict()},
               tmp_path / "gan.pt")
    assert read_checkpoint(tmp_path / "gan.pt").optimizer_state is None


def test_bare_state_dict(tmp_path, entry):
    s = trained_state()
    torch.save(s.model.state_dict(), tmp_path / "w.pt")
    assert read_checkpoint(tmp_path / "w.pt").layout == "state_dict"
    assert torch.equal(loaded_weights(entry, tmp_path / "w.pt"), s.model.state_dict()["0.weight"])


def test_lightning_checkpoint_with_prefixed_keys(tmp_path, entry):
    s = trained_state()
    state = {f"model.{k}": v for k, v in s.model.state_dict().items()}
    torch.save({"state_dict": state, "optimizer_states": [s.optimizer.state_dict()], "lr_schedulers": [],
                "global_step": 12, "pytorch-lightning_version": "2.4.0"}, tmp_path / "l.ckpt")
    ckpt = read_checkpoint(tmp_path / "l.ckpt")
    assert (ckpt.layout, ckpt.step) == ("lightning", 12)
    assert torch.equal(loaded_weights(entry, tmp_path / "l.ckpt"), s.model.state_dict()["0.weight"])


def test_hugging_face_trainer_folder(tmp_path, entry):
    s = trained_state()
    folder = tmp_path / "checkpoint-30"
    folder.mkdir()
    torch.save(s.model.state_dict(), folder / "pytorch_model.bin")
    torch.save(s.optimizer.state_dict(), folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": 30, "log_history": [{"loss": 2.1, "step": 10}, {"loss": 1.7, "step": 20},
                                            {"eval_loss": 1.9, "step": 20}]}))
    ckpt = read_checkpoint(folder)
    assert (ckpt.layout, ckpt.step) == ("huggingface", 30)
    assert [(p.step, p.loss, p.val_loss) for p in ckpt.history] == [(10, 2.1, None), (20, 1.7, None),
                                                                   (20, None, 1.9)]
    assert torch.equal(loaded_weights(entry, folder), s.model.state_dict()["0.weight"])


def test_pickled_objects_need_trust(tmp_path):
    torch.save({"model": {}, "args": torch.nn.ReLU()}, tmp_path / "o.pt")
    with pytest.raises(CheckpointError, match="--trust-checkpoint"):
        read_checkpoint(tmp_path / "o.pt")
    assert read_checkpoint(tmp_path / "o.pt", trusted=True).layout == "dict"


def test_a_dict_without_model_weights_says_which_keys_it_found(tmp_path):
    torch.save({"epoch": 3, "weights": [1, 2]}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match=r"found the entries \['epoch', 'weights'\]"):
        read_checkpoint(tmp_path / "x.pt")


def test_history_in_any_of_the_saved_shapes():
    from triage.load.history import history_from_value

    as_columns = history_from_value({"step": [0, 5], "loss": [2.0, 1.0], "val_loss": [2.1, 1.4]})
    assert [(p.step, p.loss, p.val_loss) for p in as_columns] == [(0, 2.0, 2.1), (5, 1.0, 1.4)]
    assert [p.loss for p in history_from_value([3.0, "oops", 2.0])] == [3.0, 2.0]
    assert history_from_value([{"loss": "n/a", "step": 1}]) == []


def test_an_unreadable_history_file_is_a_clear_error(tmp_path):
    from triage.load.history import read_history_file

    (tmp_path / "h.jsonl").write_text('{"loss": 1.0}\n{not json\n')
    with pytest.raises(CheckpointError, match="unreadable"):
        read_history_file(tmp_path / "h.jsonl")
    (tmp_path / "h.csv").write_text("step,loss\n0,2.5\n1,2.0\n")
    assert [p.loss for p in read_history_file(tmp_path / "h.csv")] == [2.5, 2.0]


def test_an_optimizer_state_not_saved_is_rebuilt_at_lr_0_before_any_replay(tmp_path, entry):
    """voxceleb_trainer saves `model.state_dict()` alone (the thirteenth round's speaker model): replayed with
    fresh Adam moments, each weight's first step was about the LR whatever its gradient, the healthy run's loss
    rose from 0.064 to 0.15 and clipping "fixed" it (exploding_gradients, high). The moments are rebuilt from
    steps at LR 0 at the checkpoint's weights, which stay as saved: the first step is nearer the size the run's
    own moments give than a fresh Adam's."""
    torch.manual_seed(1)
    s = mlp_setup(optimizer="adam", lr=0.01)
    for k in range(150):
        s.optimizer.zero_grad()
        s.loss_fn(s.model, s.batches[k % len(s.batches)]).backward()
        s.optimizer.step()
    torch.save(s.model.state_dict(), tmp_path / "weights.pt")
    torch.save({"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict()}, tmp_path / "full.pt")

    def first_step_size(path, fresh=False):
        session = open_session(entry, path)
        model, optimizer = session.setup.model, session.setup.optimizer
        if fresh:
            optimizer.state.clear()
        before = model[0].weight.detach().clone()
        optimizer.zero_grad()
        session.setup.loss_fn(model, session.batches[0]).backward()
        optimizer.step()
        return session, (model[0].weight.detach() - before).abs().mean().item()

    rebuilt_session, rebuilt = first_step_size(tmp_path / "weights.pt")
    _, own = first_step_size(tmp_path / "full.pt")
    _, fresh = first_step_size(tmp_path / "weights.pt", fresh=True)
    assert [fid for fid, _ in rebuilt_session.load_notes] == ["optimizer_state_rebuilt"]
    assert int(rebuilt_session.setup.optimizer.state_dict()["state"][0]["step"]) == 11
    rebuilt_session.restore()
    assert torch.equal(rebuilt_session.setup.model.state_dict()["0.weight"], s.model.state_dict()["0.weight"])
    assert abs(rebuilt - own) < 0.5 * abs(fresh - own)


def test_the_rebuilt_state_is_filled_with_gradients_clipped_as_the_run_clips_them(tmp_path):
    """A regression run whose raw gradient norm is ~850, clipped at 1.0 every step (helper-34's review): filled
    with unclipped gradients, a rebuilt momentum buffer made the first replay step ~700x the run's, and the
    healthy run read `lr_too_high` (high). Clipped as the run clips, the buffer is at most 1/(1-0.9) clips.
    A checkpoint at step 0 keeps fresh moments: the run began with them."""
    (tmp_path / "clipped.py").write_text(
        "import torch\nimport triage\n\n"
        "def setup():\n"
        "    torch.manual_seed(0)\n"
        "    x = torch.randn(640, 20)\n"
        "    y = x @ torch.randn(20, 1) * 50 + 200\n"
        "    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))\n"
        "    return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),\n"
        "                        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), grad_clip=1.0,\n"
        "                        batches=[(x[i:i + 64], y[i:i + 64]) for i in range(0, 640, 64)])\n")
    entry = f"{tmp_path / 'clipped.py'}:setup"
    torch.save({"model": open_session(entry, None).setup.model.state_dict(), "step": 200}, tmp_path / "w.pt")
    session = open_session(entry, tmp_path / "w.pt")
    buffers = [s["momentum_buffer"] for s in session.setup.optimizer.state.values()]
    assert buffers and torch.stack([b.norm() for b in buffers]).norm() <= 10.0 + 1e-4
    torch.save({"model": session.setup.model.state_dict(), "step": 0}, tmp_path / "start.pt")
    assert not open_session(entry, tmp_path / "start.pt").setup.optimizer.state
