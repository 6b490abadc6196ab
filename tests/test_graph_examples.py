"""Examples of graph batches, read as the model reads them (issue 33, class 5): the first examples of a
full-batch graph are nodes its mask selects (the graph kept whole), of a batch of graphs its first graphs
(their nodes, edges and labels); labels of a batch of graphs are compared over pooled graph features, each
distinct graph once."""

import torch

from triage.experiments.fingerprint import first_examples
from triage.experiments.labels import LabelCheckParams, _knn_agreement


def graph_batch(graphs=6, seed=0, labels=None):
    """PyG's collation: nodes contiguous per graph, a membership vector, an edge_index into the nodes."""
    g = torch.Generator().manual_seed(seed)
    xs, edges, member, offset, ys = [], [], [], 0, []
    for i in range(graphs):
        label = i % 2 if labels is None else labels[i]
        n = 4 + i % 3
        x = torch.zeros(n, 3)
        x[:, label] = 1.0  # the node types say the class
        x[:, 2] = torch.rand(n, generator=g)
        xs.append(x)
        chain = torch.stack([torch.arange(n - 1), torch.arange(1, n)]) + offset
        edges.append(torch.cat([chain, chain.flip(0)], 1))
        member.append(torch.full((n,), i))
        offset += n
        ys.append(label)
    return {"x": torch.cat(xs), "edge_index": torch.cat(edges, 1), "batch": torch.cat(member),
            "y": torch.tensor(ys), "num_graphs": graphs}


def test_the_first_graphs_keep_their_nodes_edges_and_labels():
    batch = graph_batch()
    two = first_examples(batch, 2)
    assert two["num_graphs"] == 2 and two["y"].tolist() == batch["y"][:2].tolist()
    assert two["x"].shape[0] == 4 + 5 and set(two["batch"].tolist()) == {0, 1}
    assert int(two["edge_index"].max()) < two["x"].shape[0]
    assert two["edge_index"].shape[1] == 2 * (3 + 4)  # both chains, both directions


def test_a_full_batch_graph_keeps_every_node_and_selects_n_of_its_mask():
    x = torch.randn(10, 4)
    batch = {"x": x, "edge_index": torch.tensor([[0, 1, 2], [1, 2, 3]]), "y": torch.arange(10) % 3,
             "train_mask": torch.tensor([False, True, True, False, True] + [True] * 5)}
    two = first_examples(batch, 2)
    assert two["x"] is x and two["edge_index"] is batch["edge_index"]
    assert two["train_mask"].nonzero().flatten().tolist() == [1, 2]


def test_plain_rows_are_cut_as_before():
    batch = (torch.randn(8, 3), torch.arange(8))
    x, y = first_examples(batch, 3)
    assert x.shape == (3, 3) and y.tolist() == [0, 1, 2]


def test_graph_labels_agree_with_pooled_features_and_shuffled_ones_do_not():
    p = LabelCheckParams()
    # the same graphs seen over three epochs: each graph's copy must not count as its own neighbour
    fair = [graph_batch(graphs=40, seed=s % 2) for s in range(6)]
    shuffled_labels = torch.randperm(40, generator=torch.Generator().manual_seed(3)) % 2
    unfair = [{**b, "y": shuffled_labels} for b in fair]
    agree, used = _knn_agreement(fair, p)
    chance, _ = _knn_agreement(unfair, p)
    assert used == 80 and agree > 0.9
    assert chance < 0.7
