"""Tied weights: a key a checkpoint leaves out because it is tied to a present key is not missing."""

import pytest
import torch
from torch import nn

from tests import hf_tiny
from tests.tiny import blobs, cross_entropy
import triage
from triage.load.checkpoint import load_model_state, read_checkpoint
from triage.errors import CheckpointError
from triage.load.session import open_session


@pytest.mark.parametrize("build, tied", [
    (hf_tiny.gpt2, ["lm_head.weight"]),
    (hf_tiny.t5, ["lm_head.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]),
    (hf_tiny.llama, ["lm_head.weight"]),
], ids=["gpt2", "t5", "llama"])
def test_a_trainer_checkpoint_of_a_tied_model_loads(tmp_path, build, tied):
    trained = build(seed=1)
    folder = hf_tiny.train_and_save(trained, tmp_path)
    saved = read_checkpoint(folder).model_state
    assert not set(tied) & set(saved), "the Trainer should have left the tied keys out"
    model = build(seed=2)
    load_model_state(model, saved, folder)
    loaded = model.state_dict()
    for key in tied:  # the tied copy holds the trained embedding, not the fresh init
        assert torch.equal(loaded[key], trained.state_dict()[key])
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in loaded.items())


def test_a_genuinely_missing_key_is_still_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = hf_tiny.train_and_save(hf_tiny.gpt2(seed=1), tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    del state["transformer.h.0.mlp.c_fc.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 missing keys \['transformer.h.0.mlp.c_fc.weight'\]"):
        load_model_state(hf_tiny.gpt2(), read_checkpoint(folder).model_state, folder)


def test_an_untied_head_left_out_is_missing(tmp_path):
    model = hf_tiny.gpt2(tie=False)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"missing keys \['lm_head.weight'\]"):
        load_model_state(hf_tiny.gpt2(tie=False), state, tmp_path / "c.pt")


class SharedEncoder(nn.Module):
    """Two layers that are one tensor after construction (weight sharing without transformers)."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 8)
        self.second.weight = self.first.weight
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.relu(self.second(torch.relu(self.first(x)))))


def test_plain_torch_shared_parameters_load_through_either_name(tmp_path):
    torch.manual_seed(3)
    trained = SharedEncoder()
    state = {k: v for k, v in trained.state_dict().items() if k != "first.weight"}
    torch.save(state, tmp_path / "w.pt")

    def setup():
        model = SharedEncoder()
        return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                            loss_fn=cross_entropy, batches=blobs())

    model = open_session(setup, tmp_path / "w.pt").setup.model
    assert torch.equal(model.first.weight, trained.first.weight)
    assert model.first.weight is model.second.weight
