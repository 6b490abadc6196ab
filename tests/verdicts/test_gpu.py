"""On a CUDA machine: the session moves everything to the device and fp16 replays use a GradScaler."""

import pytest
import torch

from tests.tiny import context, mlp_setup
from triage.experiments.replay import REPLAY, ReplayParams
from triage.experiments.training import grad_scaler

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def on_cuda():
    return mlp_setup(device="cuda")


def test_replay_runs_on_the_setups_device_with_a_grad_scaler_under_fp16():
    ctx = context(on_cuda)
    assert all(x.is_cuda for x, _ in ctx.session.batches)
    assert grad_scaler(ctx.session.setup, "fp16", ctx.session.device) is not None
    out = REPLAY.measure(ctx, ReplayParams(steps=20, precision="fp16"))
    assert out.finite and out.loss_ratio < 1.0


def test_bf16_and_fp32_replays_agree_on_cuda():
    fp32 = REPLAY.measure(context(on_cuda), ReplayParams(steps=20))
    bf16 = REPLAY.measure(context(on_cuda), ReplayParams(steps=20, precision="bf16"))
    assert fp32.finite and bf16.finite
    assert abs(fp32.loss_end - bf16.loss_end) < 0.5 * fp32.loss_start
