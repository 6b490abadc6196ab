"""label_check: out-of-range, single-class, class-ordered and input-unrelated labels; real digits are quiet."""

import torch
from torch import nn

from tests._instrument_runs import classifier_setup, digits, run, session_of
from triage.experiments.labels import LABEL_CHECK


def _outcome(batches, **params):
    return run(LABEL_CHECK, session_of(lambda: classifier_setup(batches=batches)), **params)


def test_real_digits_are_quiet():
    out = _outcome(digits(8))
    assert out.is_classification and out.num_classes == 10
    assert out.label_min == 0 and out.label_max == 9 and out.out_of_range_count == 0
    assert out.distinct_labels == 10 and not out.single_class and not out.class_ordered
    assert out.majority_fraction < 0.2
    assert 0.9 < out.batch_class_ratio < 1.1
    assert out.knn_agreement > 0.9 and abs(out.chance_agreement - 0.1) < 0.02
    assert out.knn_examples == 512


def test_shuffled_labels_agree_with_neighbours_at_chance():
    out = _outcome(digits(8, shuffle_labels=True))
    assert out.knn_agreement < out.chance_agreement + 0.07  # 512 examples: chance +- ~0.013 (1 sd)
    assert out.out_of_range_count == 0


def test_labels_beyond_the_logits_are_counted():
    batches = [(x, torch.where(y == 9, torch.tensor(12), y)) for x, y in digits(4)]
    nines = sum(int((y == 9).sum()) for _, y in digits(4))
    out = _outcome(batches)  # cross_entropy itself would raise on these; the check must not
    assert out.num_classes == 10 and out.label_max == 12
    assert out.out_of_range_count == nines > 0
    assert out.out_of_range_read is True  # the run's cross_entropy raises on them: read as class indices


def test_grades_the_loss_turns_into_levels_are_not_out_of_range_for_it():
    """CORAL: grades 0..9 against 9 logits, each grade made into 9 binary levels (grade > j) for a BCE. Grade 9 is
    "out of range" for 9 logits, yet the loss runs on it: it does not read grades as class indices."""
    import torch.nn.functional as F

    def coral(model, batch):
        x, grade = batch
        levels = (grade[:, None] > torch.arange(9)[None, :]).float()
        return F.binary_cross_entropy_with_logits(model(x), levels)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 9))
    setup = classifier_setup(batches=digits(4))
    out = run(LABEL_CHECK, session_of(lambda: setup.model_copy(update={"model": model, "loss_fn": coral,
                                                                       "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})))
    assert out.is_classification and out.num_classes == 9 and out.out_of_range_count > 0
    assert out.out_of_range_read is False


def test_a_mask_saved_as_0_255_handed_to_a_binary_cross_entropy_is_read_out_of_range():
    """Binary labels saved as 0/255 and scored by BCE with logits: the loss runs on them, but a binary
    cross-entropy's target is a probability, and 255 is none."""
    import torch.nn.functional as F

    batches = [(x, (y % 2) * 255) for x, y in digits(4)]

    def bce(model, batch):
        x, y = batch
        return F.binary_cross_entropy_with_logits(model(x)[:, 1], y.float())
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))
    setup = classifier_setup(batches=batches)
    out = run(LABEL_CHECK, session_of(lambda: setup.model_copy(update={"model": model, "loss_fn": bce,
                                                                       "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})))
    assert out.is_classification and out.out_of_range_count > 0 and out.out_of_range_read is True


def test_an_example_id_the_loss_reads_is_not_a_label():
    """Multi-label targets (multi-hot floats) and each example's id, which the loss reads (a per-example weight
    table): the id is the only integer tensor the loss reads, it runs past the logits and the loss runs on it,
    nearly one value per example: an id, not class labels (was: label_bug, "out of range count 1784")."""
    import torch.nn.functional as F

    weights = torch.ones(2048)
    batches, start = [], 0
    for x, y in digits(4):
        batches.append({"x": x, "y": F.one_hot(y, 10).float(), "idx": torch.arange(start, start + len(y))})
        start += len(y)

    def weighted(model, batch):
        per = F.binary_cross_entropy_with_logits(model(batch["x"]), batch["y"], reduction="none").mean(dim=1)
        return (per * weights[batch["idx"]]).mean()
    setup = classifier_setup(batches=digits(4))
    out = run(LABEL_CHECK, session_of(lambda: setup.model_copy(update={"loss_fn": weighted, "batches": batches})))
    assert not out.is_classification and out.out_of_range_count == 0 and out.out_of_range_read is False



def test_a_class_nothing_reads_is_not_a_label():
    """SimSiam's batches carry the dataset's class beside two views, and its negative-cosine loss never reads it:
    the run has no labels (was: a 64-class classifier, its loss at -0.7 read as a classifier's NLL below zero)."""
    import torch.nn.functional as F

    batches = [((x, x + 0.1 * torch.randn_like(x)), y) for x, y in digits(4)]

    def negative_cosine(model, batch):
        (view1, view2), _ = batch
        return -F.cosine_similarity(model(view1), model(view2).detach(), dim=-1).mean()
    setup = classifier_setup(batches=digits(4))
    out = run(LABEL_CHECK, session_of(lambda: setup.model_copy(update={"loss_fn": negative_cosine, "batches": batches})))
    assert not out.is_classification and out.num_classes is None

def test_padding_labels_are_not_out_of_range():
    batches = [(x, torch.where(y == 9, torch.tensor(-100), y)) for x, y in digits(4)]
    out = _outcome(batches)
    assert out.out_of_range_count == 0 and out.label_max == 8


def test_a_single_class_is_flagged():
    batches = [(x, torch.zeros_like(y)) for x, y in digits(4)]
    out = _outcome(batches)
    assert out.single_class and out.distinct_labels == 1 and out.majority_fraction == 1.0
    assert not out.class_ordered  # one class in every batch, but the snapshot has no other


def test_batches_sorted_by_class_are_flagged():
    x = torch.cat([b[0] for b in digits(16, batch_size=32)])
    y = torch.cat([b[1] for b in digits(16, batch_size=32)])
    order = torch.argsort(y, stable=True)
    x, y = x[order], y[order]
    batches = [(x[i:i + 32], y[i:i + 32]) for i in range(0, 512, 32)]
    out = _outcome(batches)
    assert out.class_ordered and out.batch_class_ratio < 0.3 and out.distinct_labels == 10
    assert out.knn_agreement > 0.9  # the labels themselves are right


def test_regression_is_not_classification():
    batches = [(x, x[:, :1].clone()) for x, _ in digits(2)]
    setup = lambda: classifier_setup(batches=batches, model=nn.Linear(64, 1),  # noqa: E731
                                     loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
    out = run(LABEL_CHECK, session_of(setup))
    assert not out.is_classification and out.num_classes is None and out.knn_agreement is None


def test_two_classes_sorted_are_flagged_and_shuffled_are_not():
    x = torch.cat([b[0] for b in digits(16, batch_size=32)])
    y = (torch.cat([b[1] for b in digits(16, batch_size=32)]) >= 5).long()  # two balanced classes
    for order, ordered in ((torch.argsort(y, stable=True), True), (torch.arange(len(y)), False)):
        batches = [(x[order][i:i + 32], y[order][i:i + 32]) for i in range(0, 512, 32)]
        out = _outcome(batches)
        assert out.class_ordered is ordered, out.batch_class_ratio


def test_a_dict_batch_is_read_by_its_labels_key_not_its_last_integer_tensor():
    batches = [{"x": x, "labels": y, "mask": torch.ones_like(y)} for x, y in digits(4)]
    setup = lambda: classifier_setup(  # noqa: E731
        batches=batches, loss_fn=lambda m, b: nn.functional.cross_entropy(m(b["x"]), b["labels"]))
    out = run(LABEL_CHECK, session_of(setup))
    assert out.distinct_labels == 10 and out.knn_agreement > 0.9


def test_examples_with_nan_inputs_are_left_out_of_the_neighbour_agreement():
    batches = digits(8)
    batches[0][0][:5, 3] = float("nan")
    out = run(LABEL_CHECK, session_of(lambda: classifier_setup(batches=batches)))
    assert out.knn_examples == 512 - 5 and out.knn_agreement > 0.9


def test_token_inputs_are_compared_by_their_bag_of_tokens():
    import torch
    from torch import nn

    import triage
    from tests.tiny import context
    from triage.experiments.labels import LABEL_CHECK, LabelCheckParams

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 4, (256, 12), generator=g)
    majority = torch.stack([t.bincount(minlength=4).argmax() for t in tokens])  # the label: the most frequent token

    def sequences(labels):
        def factory():
            model = nn.Sequential(nn.Embedding(4, 8), nn.Flatten(), nn.Linear(96, 4))
            batches = [(tokens[i:i + 32], labels[i:i + 32]) for i in range(0, 256, 32)]
            return triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), batches=batches)
        return factory

    true = LABEL_CHECK.measure(context(sequences(majority)), LabelCheckParams())
    shuffled = LABEL_CHECK.measure(context(sequences(majority[torch.randperm(256, generator=g)])), LabelCheckParams())
    assert true.knn_agreement > true.chance_agreement + 0.3
    assert shuffled.knn_agreement < shuffled.chance_agreement + 0.1


def test_regression_targets_shuffled_apart_from_their_inputs_correlate_with_no_neighbour():
    import triage

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 6, generator=g)
    y = torch.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * torch.randn(512, generator=g)

    def regressor(targets):
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
        batches = [(x[i:i + 64], targets[i:i + 64]) for i in range(0, 512, 64)]
        return lambda: triage.Setup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                                    loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]).squeeze(-1), b[1]),
                                    batches=batches)

    true = run(LABEL_CHECK, session_of(regressor(y)))
    shuffled = run(LABEL_CHECK, session_of(regressor(y[torch.randperm(512, generator=g)])))
    assert not true.is_classification and true.knn_target_correlation > 0.5
    assert abs(shuffled.knn_target_correlation) < 0.1


# --- sequence targets: a translation's token ids beside its source's (issue 33, classes 3 and 5) ------------

def translation_batches(shuffled: bool, n_batches=6, size=32, words=40, seed=0):
    """Sources of 2-5 words, each target the source translated word by word (ids 50+), EOS 1, padding 0 in
    the sources and -100 in the targets; `shuffled`: each batch's targets paired with other sources."""
    g = torch.Generator().manual_seed(seed)
    dictionary = torch.randperm(words, generator=torch.Generator().manual_seed(9)) + 50
    out = []
    for _ in range(n_batches):
        src = torch.zeros(size, 6, dtype=torch.long)
        tgt = torch.full((size, 6), -100)
        for i in range(size):
            n = int(torch.randint(2, 6, (1,), generator=g))
            words_i = torch.randint(0, words, (n,), generator=g)
            src[i, :n], src[i, n] = words_i + 2, 1
            tgt[i, :n], tgt[i, n] = dictionary[words_i], 1
        if shuffled:
            tgt = tgt[torch.randperm(size, generator=g)]
        out.append({"input_ids": src, "labels": tgt})
    return out


def test_a_translations_targets_resemble_their_neighbours_and_shuffled_ones_do_not():
    from triage.experiments.sequence_targets import target_lift

    paired, used = target_lift(translation_batches(False), "['labels']", 100, -100, 1024, 2000)
    shuffled, _ = target_lift(translation_batches(True), "['labels']", 100, -100, 1024, 2000)
    assert used >= 150 and paired > 0.3 and abs(shuffled) < 0.1
    # labels of one class per example, or tokens beside no integer input: not a sequence target
    assert target_lift(digits(2), "[1]", 10, -100, 1024, 2000) == (None, 0)
