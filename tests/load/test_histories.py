"""--history detects its format: TensorBoard event folders, Lightning's CSVLogger metrics.csv, CSV, JSON."""

import pytest

from triage.errors import CheckpointError
from triage.load.history import read_history_file


def test_a_tensorboard_run_folder_is_read_with_the_tensorboard_package(tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "runs" / "version_0"
    writer = SummaryWriter(str(run))
    for step in range(1, 6):
        writer.add_scalar("train/loss", 2.0 / step, step)
        writer.add_scalar("train/grad_norm", 1.0, step)
    writer.add_scalar("eval/loss", 1.5, 5)
    writer.close()
    for given in (tmp_path / "runs", run, next(run.glob("events.out.tfevents*"))):
        points = read_history_file(given)
        assert [p.step for p in points] == [1, 2, 3, 4, 5]
        assert points[1].loss == pytest.approx(1.0) and points[4].val_loss == pytest.approx(1.5)
    with pytest.raises(CheckpointError, match="--history-loss"):
        read_history_file(run, loss_key="nll", val_key="val_nll")


def test_lightnings_csv_logger_metrics_are_read_from_the_log_folder(tmp_path):
    lightning_tiny = pytest.importorskip("tests.lightning_tiny")
    from lightning.pytorch.loggers import CSVLogger

    module = lightning_tiny.LitMLP(jump=1.0)
    lightning_tiny.fit(module, tmp_path, max_steps=32, logger=CSVLogger(str(tmp_path / "logs")),
                       log_every_n_steps=4, limit_val_batches=2, val_check_interval=16)
    points = read_history_file(tmp_path / "logs")  # finds lightning_logs/version_0/metrics.csv
    train = [p for p in points if p.loss is not None]
    val = [p for p in points if p.val_loss is not None]
    assert [p.step for p in train][:3] == [3, 7, 11] and len(val) == 2
    assert train[-1].loss < train[0].loss


def test_other_column_names_are_named_on_the_command_line(tmp_path):
    (tmp_path / "log.csv").write_text("iteration,step,nll,heldout_nll\n0,0,2.0,\n1,1,1.5,1.7\n")
    with pytest.raises(CheckpointError, match="--history-loss"):
        read_history_file(tmp_path / "log.csv")
    points = read_history_file(tmp_path / "log.csv", loss_key="nll", val_key="heldout_nll")
    assert [(p.step, p.loss, p.val_loss) for p in points] == [(0, 2.0, None), (1, 1.5, 1.7)]
