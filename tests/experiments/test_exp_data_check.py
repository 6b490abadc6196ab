import math

import torch


from tests.tiny import blobs, context, mlp_setup
from triage.experiments.data_check import DATA_CHECK, DataCheckParams


def check(factory):
    return DATA_CHECK.measure(context(factory), DataCheckParams())


def test_clean_data_has_no_findings():
    out = check(mlp_setup)
    assert out.nonfinite_count == 0 and out.first_bad_batch is None
    assert out.batches_checked == 6 and out.tensors_checked == 12


def test_nan_and_inf_are_named_by_batch_and_key_in_nested_batches():
    def nested():
        s = mlp_setup()
        batches = [{"inputs": (x.clone(),), "labels": y} for x, y in s.batches]
        batches[4]["inputs"][0][1, 2] = float("inf")
        batches[3]["inputs"][0][0, :3] = float("nan")
        return s.model_copy(update={"batches": batches, "loss_fn": lambda m, b: m(b["inputs"][0]).sum()})

    out = check(nested)
    assert out.nonfinite_count == 2 and out.train_nonfinite_count == 2 and out.first_bad_batch == 3
    first = out.nonfinite[0]
    assert (first.split, first.batch, first.key, first.nan, first.inf) == ("train", 3, "['inputs'][0]", 3, 0)
    assert (out.nonfinite[1].batch, out.nonfinite[1].inf) == (4, 1)


def test_validation_batches_are_checked_too():
    val = blobs(n_batches=1)
    val[0][0][0, 0] = float("nan")
    out = check(lambda: mlp_setup(val_batches=val))
    assert [(f.split, f.batch) for f in out.nonfinite] == [("val", 0)]
    assert out.first_bad_batch is None and out.train_nonfinite_count == 0  # no train batch is bad


def test_the_first_nonfinite_value_is_named_with_its_place_and_the_example_s_dataset_index():
    def indexed():
        s = mlp_setup()
        batches = [{"x": x.clone(), "y": y, "index": torch.arange(100 * i, 100 * i + len(y))}
                   for i, (x, y) in enumerate(s.batches)]
        batches[2]["x"][5, 1] = float("-inf")
        batches[2]["x"][7, 0] = float("nan")
        return s.model_copy(update={"batches": batches, "loss_fn": lambda m, b: m(b["x"]).sum()})

    (found,) = check(indexed).nonfinite
    assert (found.batch, found.key, found.first_index) == (2, "['x']", [5, 1])  # row-major: example 5 first
    assert found.first_value == float("-inf") and found.sample_id == 205


def test_without_indices_in_the_batch_no_dataset_index_is_claimed():
    def plain():
        s = mlp_setup()
        s.batches[1][0][3, 0] = float("nan")
        return s

    (found,) = check(plain).nonfinite
    assert found.first_index == [3, 0] and math.isnan(found.first_value) and found.sample_id is None
