"""overlap_check: validation examples copied from the training batches are counted."""

import torch

from tests._instrument_runs import classifier_setup, digits, run, session_of, trained_checkpoint
from triage.experiments.overlap import OVERLAP_CHECK
from triage.walk.playbook.conditions import parse_condition


def _outcome(train, val):
    return run(OVERLAP_CHECK, session_of(lambda: classifier_setup(batches=train, val_batches=val)))


def test_half_of_val_copied_from_train_is_half_duplicates():
    train = digits(8)
    fresh = digits(2, offset=8 * 64)  # digits holds no duplicate image: these are new examples
    val = [(torch.cat([fresh[0][0][:32], train[5][0][:32]]), torch.cat([fresh[0][1][:32], train[5][1][:32]])),
           (torch.cat([train[2][0][32:], fresh[1][0][32:]]), torch.cat([train[2][1][32:], fresh[1][1][32:]]))]
    out = _outcome(train, val)
    assert out.has_val and out.val_examples == 128 and out.train_examples == 512
    assert out.duplicates == 64 and out.duplicate_fraction == 0.5
    assert out.first_duplicates[:3] == [32, 33, 34]


def _half_copied(train):
    """Validation: 64 training examples and 64 new ones, with labels drawn as the training ones were."""
    fresh = digits(1, offset=8 * 64, shuffle_labels=True)[0]
    return [(torch.cat([train[1][0], fresh[0]]), torch.cat([train[1][1], fresh[1]]))]


def _judged(call, out):
    return parse_condition(call).value(lambda node, field: getattr(out, field))


def test_copies_a_model_memorised_score_better_than_the_rest_and_flatter_the_validation_figure():
    # Labels that carry no signal: the model can only memorise them, so its copies score far better than the
    # new examples, and the validation figure is as good as the overlap makes it.
    train = digits(2, shuffle_labels=True)
    factory = lambda: classifier_setup(batches=train, val_batches=_half_copied(train), lr=0.5)  # noqa: E731
    out = run(OVERLAP_CHECK, session_of(factory, trained_checkpoint(factory, 600)))
    assert out.duplicates == 64 and out.val_examples == 128
    assert out.duplicate_loss < 0.2 < 2.0 < out.other_loss
    assert _judged("duplicates_flatter(n)", out) is True and _judged("duplicates_score_alike(n)", out) is False


def test_copies_that_score_like_the_rest_do_not_show_the_overlap_flatters_anything():
    train = digits(2, shuffle_labels=True)
    factory = lambda: classifier_setup(batches=train, val_batches=_half_copied(train))  # noqa: E731
    out = run(OVERLAP_CHECK, session_of(factory))  # at setup()'s init: nothing learned, copies or not
    assert out.duplicates == 64 and abs(out.duplicate_loss - out.other_loss) < 0.2 * out.other_loss
    assert _judged("duplicates_flatter(n)", out) is False and _judged("duplicates_score_alike(n)", out) is True


def test_a_loss_written_for_whole_batches_leaves_the_copies_counted_but_not_scored_apart():
    train = digits(2, shuffle_labels=True)

    def whole_batches_only(model, batch):
        assert len(batch[0]) == 128, "this loss takes whole batches"
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])
    out = _outcome_with(train, _half_copied(train), loss_fn=whole_batches_only)
    assert out.duplicates == 64 and out.duplicate_loss is None and out.other_loss is None


def _outcome_with(train, val, **kwargs):
    return run(OVERLAP_CHECK, session_of(lambda: classifier_setup(batches=train, val_batches=val, **kwargs)))


def test_copies_that_differ_below_the_rounding_still_count():
    train = digits(4)
    val = [(train[0][0] + 1e-9, train[0][1])]
    assert _outcome(train, val).duplicate_fraction == 1.0


def test_disjoint_train_and_val_have_no_duplicates():
    out = _outcome(digits(8), digits(4, offset=8 * 64))
    assert out.duplicates == 0 and out.duplicate_fraction == 0.0 and out.val_examples == 256


def test_without_val_batches_there_is_nothing_to_check():
    out = run(OVERLAP_CHECK, session_of(lambda: classifier_setup()))
    assert not out.has_val and out.val_examples == 0


# --- whole examples: every tensor of a row, a graph's nodes as its masks select them -----------------------

class _Tabular(torch.nn.Module):
    """Three categorical columns through embeddings beside six continuous ones."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4, 3)
        self.head = torch.nn.Linear(3 * 3 + 6, 2)

    def forward(self, cat, cont):
        return self.head(torch.cat([self.emb(cat).flatten(1), cont], 1))


def _tabular_batches(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 4, (32, 3), generator=g), torch.randn(32, 6, generator=g),
             torch.randint(0, 2, (32,), generator=g)) for _ in range(n)]


def _tabular_outcome(train, val):
    def setup():
        return classifier_setup(batches=train, val_batches=val, model=_Tabular(),
                                loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0], b[1]), b[2]))
    return _outcome_of(setup)


def _outcome_of(setup):
    return run(OVERLAP_CHECK, session_of(setup))


def test_categorical_columns_that_repeat_across_splits_are_no_duplicate_rows():
    """The tabular run of issue 33: its first tensor (3 categorical ids of 4 values) repeats across the
    splits, its rows never do (the continuous columns differ). Read whole, nothing is duplicated."""
    out = _tabular_outcome(_tabular_batches(8, seed=0), _tabular_batches(2, seed=1))
    assert out.duplicates == 0 and out.duplicate_fraction == 0.0 and out.val_examples == 64


def test_a_tabular_row_copied_whole_into_validation_is_a_duplicate():
    train = _tabular_batches(8, seed=0)
    val = _tabular_batches(2, seed=1)
    val[1] = tuple(torch.cat([t[:16], s[:16]]) for t, s in zip(train[3], val[1]))  # 16 training rows, whole
    out = _tabular_outcome(train, val)
    assert out.duplicates == 16 and out.first_duplicates[:2] == [32, 33]


class _Gcn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(5, 3)

    def forward(self, x, edge_index):
        agg = torch.zeros_like(x).index_add_(0, edge_index[1], x[edge_index[0]])
        return self.lin(x + agg)


def _graph(train_nodes, val_nodes, n: int = 40):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)
    edge_index = torch.randint(0, n, (2, 120), generator=g)

    def batch(nodes):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[list(nodes)] = True
        return {"x": x, "edge_index": edge_index, "y": y, "mask": mask}

    def loss(model, b):
        return torch.nn.functional.cross_entropy(model(b["x"], b["edge_index"])[b["mask"]], b["y"][b["mask"]])
    return lambda: classifier_setup(batches=[batch(train_nodes)], val_batches=[batch(val_nodes)], model=_Gcn(),
                                    loss_fn=loss)


def test_a_full_batch_graph_compares_the_nodes_its_masks_select_not_the_shared_features():
    """One graph, the same x in the train and the validation batch; only the masks differ. Disjoint masks
    are no overlap; a validation node also in the training mask is one."""
    disjoint = _outcome_of(_graph(range(0, 30), range(30, 40)))
    assert disjoint.duplicates == 0 and disjoint.val_examples == 10 and disjoint.train_examples == 30
    leaky = _outcome_of(_graph(range(0, 35), range(30, 40)))  # train_mask = ~test_mask: val nodes 30-34 inside
    assert leaky.duplicates == 5 and leaky.duplicate_fraction == 0.5


def test_neighbour_sampled_batches_count_their_seed_nodes_only():
    """PyG's NeighborLoader: the first batch_size rows are the batch's examples, the rest their sampled
    neighbours, which may well be validation nodes."""
    g = torch.Generator().manual_seed(0)
    feats, labels = torch.randn(100, 5, generator=g), torch.randint(0, 3, (100,), generator=g)

    def batch(seeds, neighbours):
        n_id = torch.tensor(list(seeds) + list(neighbours))
        return {"x": feats[n_id], "edge_index": torch.zeros(2, 0, dtype=torch.long), "y": labels[n_id],
                "batch_size": len(seeds), "n_id": n_id}

    train = [batch(range(0, 10), range(80, 90)), batch(range(10, 20), range(85, 95))]  # val nodes as neighbours
    val = [batch(range(80, 90), range(0, 5))]

    def setup():
        return classifier_setup(batches=train, val_batches=val, model=torch.nn.Linear(5, 3),
                                loss_fn=lambda m, b: torch.nn.functional.cross_entropy(
                                    m(b["x"])[:b["batch_size"]], b["y"][:b["batch_size"]]))
    out = _outcome_of(setup)
    assert out.duplicates == 0 and out.val_examples == 10 and out.train_examples == 20


def test_a_batch_of_graphs_with_one_label_per_graph_is_not_measured_and_says_why():
    """Node rows are parts of molecules; a row repeating (the same atom type) says nothing of the examples,
    so the overlap is unknown (no branch taken), never 100%."""
    def graphs(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.eye(4)[torch.randint(0, 4, (30,), generator=g)]  # one-hot atom types: rows repeat
        return {"x": x, "edge_index": torch.randint(0, 30, (2, 60), generator=g),
                "batch": torch.arange(30) // 10, "y": torch.randint(0, 2, (3,), generator=g)}

    class Pool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def forward(self, b):
            return self.lin(torch.zeros(3, 4).index_add_(0, b["batch"], b["x"]))

    out = _outcome_of(lambda: classifier_setup(batches=[graphs(0)], val_batches=[graphs(1)], model=Pool(),
                                               loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b), b["y"])))
    assert out.has_val and out.duplicate_fraction is None
    assert "not one per input row" in out.not_measured


# --- Windows of one series, cut before the split (issue 33, class 4) ------------------------------------

LOOKBACK = 24


def series_windows(n=1200, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n, dtype=torch.float32)
    series = torch.sin(t / 20) + 0.3 * torch.sin(t / 7) + 0.1 * torch.randn(n, generator=g)
    x = torch.stack([series[i:i + LOOKBACK] for i in range(n - LOOKBACK)]).unsqueeze(-1)
    y = torch.stack([series[i + LOOKBACK] for i in range(n - LOOKBACK)]).unsqueeze(-1)
    return x, y


def window_split(shuffled_first: bool, batch_size=32):
    """The windows split 70/30: by time, or (the leak) shuffled before the split, as a random_split of the
    windows' dataset does."""
    x, y = series_windows()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1)) if shuffled_first \
        else torch.arange(len(x))
    cut = int(0.7 * len(x))

    def batches(idx):
        return [(x[idx[i:i + batch_size]], y[idx[i:i + batch_size]]) for i in range(0, len(idx), batch_size)]
    return batches(order[:cut]), batches(order[cut:])


class Forecaster(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(1, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def forecaster_setup(shuffled_first: bool):
    import triage

    torch.manual_seed(0)
    model = Forecaster()
    train, val = window_split(shuffled_first)
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=3e-3),
                        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
                        batches=train[:16], val_batches=val[:8])


def test_windows_shuffled_before_the_split_are_shifted_copies_and_a_split_by_time_is_not():
    leak = run(OVERLAP_CHECK, session_of(lambda: forecaster_setup(True)))
    fair = run(OVERLAP_CHECK, session_of(lambda: forecaster_setup(False)))
    assert leak.duplicates == 0 and leak.shifted_fraction > 0.9  # no row repeats, yet each window is a neighbour's
    assert fair.duplicates == 0 and fair.shifted_fraction == 0.0  # the split's boundary is past these batches


def test_images_and_tabular_rows_are_not_sequences_to_shift():
    out = run(OVERLAP_CHECK, session_of(lambda: classifier_setup(lr=0.1)))
    assert out.shifted_copies == 0 and out.shifted_fraction is None


def test_a_forecaster_validated_on_windows_cut_before_the_split_gets_the_overlap_verdict(tmp_path):
    import triage

    report, _ = triage.run(lambda: forecaster_setup(True), None, out=tmp_path / "leak")
    assert (report.root_cause, report.path[-1]) == ("train_val_overlap", "train_val_overlap_windows")
    assert "Split the series by time first" in report.fix
    report, _ = triage.run(lambda: forecaster_setup(False), None, out=tmp_path / "fair")
    assert report.root_cause != "train_val_overlap"


def test_rows_that_repeat_within_training_as_often_as_across_the_split_are_the_datas_own_repetition():
    """A recommender's (user, item) pairs drawn from a few popular ones repeat within training and across the
    split alike (held-back two_tower_retrieval: 54% and 57%, called train_val_overlap, high); a validation set
    cut from training rows that never repeat one another is copies."""
    g = torch.Generator().manual_seed(0)
    pairs = lambda n: torch.randint(0, 6, (n, 2), generator=g).float()  # 36 possible rows  # noqa: E731
    repeats = [(pairs(64), torch.zeros(64, dtype=torch.long)) for _ in range(4)]
    val = [(pairs(64), torch.zeros(64, dtype=torch.long))]
    out = _outcome(repeats, val)
    assert out.train_repeat_fraction > 0.9 and out.duplicate_fraction > 0.9
    assert _judged("repeats_like_training(overlap)", out) is True

    train = digits(4)
    copied = _outcome(train, [train[1]])
    assert copied.train_repeat_fraction == 0.0 and copied.duplicate_fraction == 1.0
    assert _judged("repeats_like_training(overlap)", copied) is False



def test_a_snapshot_that_ends_part_way_through_a_pass_repeats_nothing_of_its_own():
    """The eleventh round's FNO: 48 batches of 20 over 100 solutions, 9.6 passes (60 solutions drawn a tenth
    time) read as 62.5% of training repeating itself, which excused a validation tail that copies 60 of its 100
    solutions. A first pass over every example, then passes again, is one set's epochs; a first pass that
    repeats rows holds the data's own repetition."""
    images = torch.cat([b[0] for b in digits(2)])[:100]
    labels = torch.cat([b[1] for b in digits(2)])[:100]
    order = torch.cat([torch.randperm(100, generator=torch.Generator().manual_seed(e)) for e in range(10)])[:960]
    epochs = [(images[order[i:i + 20]], labels[order[i:i + 20]]) for i in range(0, 960, 20)]
    val = [(torch.cat([images[40:100], digits(1, offset=200)[0][0][:40]]),
            torch.cat([labels[40:100], digits(1, offset=200)[0][1][:40]]))]
    out = _outcome(epochs, val)
    assert out.train_repeat_fraction == 0.0 and out.duplicate_fraction == 0.6
    assert _judged("repeats_like_training(overlap)", out) is False

    twice = torch.cat([torch.arange(100), torch.arange(40)])[torch.randperm(140, generator=torch.Generator().manual_seed(0))]
    own = _outcome([(images[twice[i:i + 20]], labels[twice[i:i + 20]]) for i in range(0, 140, 20)], val)
    assert own.train_repeat_fraction == 80 / 140  # one pass over rows of which 40 appear twice

# --- near copies: nearer a training example than training examples are to one another ---------------------

def _noisy_copies(batches, noise: float = 0.3):
    """Each image a training one plus Gaussian noise of `noise` times a feature's spread (an augmented copy)."""
    g = torch.Generator().manual_seed(3)
    return [(x + noise * torch.randn(x.shape, generator=g), y) for x, y in batches]


def test_a_random_split_puts_few_validation_examples_near_a_training_one_and_that_is_no_leak():
    out = _outcome(digits(8), digits(4, offset=8 * 64))
    assert out.near_fraction < 0.05 and 0.8 < out.near_distance_ratio < 1.2
    assert _judged("near_copies_validation(overlap)", out) is False


def test_noise_added_to_training_examples_only_makes_no_near_copies():
    """Augmentation on training only pushes training examples apart from one another: a clean validation example
    then lies nearer them than they lie to each other, but not nearer them than to other validation examples."""
    train, val = digits(8), digits(4, offset=8 * 64)
    for noise in (0.3, 1.0):
        out = _outcome(_noisy_copies(train, noise), val)
        assert out.near_fraction < 0.05 and _judged("near_copies_validation(overlap)", out) is False


def test_a_training_snapshot_too_small_for_its_own_quantile_is_not_measured():
    out = _outcome(digits(1), digits(4, offset=8 * 64))  # 64 training examples
    assert out.near_fraction is None and out.near_copies == 0


def test_training_images_plus_noise_in_validation_are_near_copies_not_duplicates():
    train = digits(8)
    out = _outcome(train, _noisy_copies(train[:4]))
    assert out.duplicates == 0 and out.near_fraction > 0.3 and out.near_distance_ratio < 0.8
    assert _judged("near_copies_validation(overlap)", out) is True
    exact = _outcome(train, [train[1]])  # exact copies are the duplicates' count, never near copies
    assert exact.duplicates == 64 and exact.near_copies == 0


def test_near_copies_are_not_measured_where_the_rows_change_width_from_batch_to_batch():
    train = [(torch.randn(16, 8 + i), torch.zeros(16, dtype=torch.long)) for i in range(4)]
    out = _outcome(train, [(torch.randn(16, 8), torch.zeros(16, dtype=torch.long))])
    assert out.near_fraction is None and out.near_copies == 0


def _half_near_copies_run(tmp_path, leak: bool):
    """Digits trained 400 steps; validation half new images, half noisy copies of training ones (leak) or all
    new (a fair split)."""
    import triage

    train, fresh = digits(8), digits(4, offset=8 * 64)
    copies = _noisy_copies(train[:4])
    val = [(torch.cat([c[0][:32], f[0][:32]]), torch.cat([c[1][:32], f[1][:32]])) for c, f in zip(copies, fresh)] \
        if leak else fresh
    factory = lambda: classifier_setup(batches=train, val_batches=val, lr=0.1)  # noqa: E731
    torch.manual_seed(0)
    setup, losses = factory(), []
    for step in range(400):
        setup.optimizer.zero_grad()
        loss = setup.loss_fn(setup.model, train[step % 8])
        loss.backward()
        setup.optimizer.step()
        losses.append(loss.item())
    triage.save_checkpoint(tmp_path / "run.pt", setup.model, setup.optimizer, step=400, history=losses)
    report, _ = triage.run(factory, tmp_path / "run.pt", out=tmp_path / "report")
    return report


def test_a_validation_set_of_noisy_training_copies_gets_the_overlap_verdict_and_a_fair_split_does_not(tmp_path):
    report = _half_near_copies_run(tmp_path / "leak", leak=True)
    assert (report.root_cause, report.confidence, report.path[-1]) == \
        ("train_val_overlap", "medium", "train_val_overlap_near")
    overlap = next(e for e in report.experiments if e.node == "overlap").outcome
    assert overlap["near_loss"] < 0.8 * overlap["far_loss"] and "split by the original example" in report.fix
    fair = _half_near_copies_run(tmp_path / "fair", leak=False)
    assert fair.root_cause != "train_val_overlap"
    assert "train_val_overlap_near" not in [f.id for f in fair.findings]


def _crops_setup(split_by_recording: bool):
    """Log-mel crops (24 bins x 50 frames, channels first as a TDNN reads them) cut every 25 frames from 48
    recordings, the thirteenth round's speaker model: split at random, a validation crop shares half its
    frames with the training crops beside it; split by recording, none."""
    import triage

    g = torch.Generator().manual_seed(0)
    crops, owner = [], []
    for rec in range(48):
        frames = torch.randn(24, 300, generator=g)
        for t in range(0, 251, 25):
            crops.append(frames[:, t:t + 50])
            owner.append(rec)
    x, y = torch.stack(crops), torch.tensor(owner) % 8
    order = torch.randperm(len(x), generator=g)
    is_val = (torch.tensor(owner) >= 40) if split_by_recording else torch.zeros(len(x), dtype=torch.bool).index_fill(
        0, order[:80], True)
    train, val = (~is_val).nonzero().flatten(), is_val.nonzero().flatten()
    batches = [(x[i], y[i]) for i in train.split(32)]
    val_batches = [(x[i], y[i]) for i in val.split(32)]
    model = torch.nn.Sequential(torch.nn.Conv1d(24, 16, 5), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool1d(1),
                                torch.nn.Flatten(), torch.nn.Linear(16, 8))
    return triage.Setup(model=model, optimizer=torch.optim.Adam(model.parameters(), 1e-3),
                        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
                        batches=batches, val_batches=val_batches)


def test_channels_first_crops_half_shared_across_a_random_split_are_shifted_windows():
    """Crops moved by half their length along their last dim (frames), not their first (mel bins): was
    `healthy` (medium), its windows compared along the bins and by up to 16 steps."""
    leak = run(OVERLAP_CHECK, session_of(lambda: _crops_setup(False)))
    fair = run(OVERLAP_CHECK, session_of(lambda: _crops_setup(True)))
    assert leak.duplicates == 0 and leak.shifted_fraction > 0.9
    assert _judged("shifted_windows(overlap)", leak) is True
    assert fair.duplicates == 0 and fair.shifted_fraction == 0.0
