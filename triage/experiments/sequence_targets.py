"""Whether a sequence model's targets belong to its inputs: a translation, a summary, a transcript of token
ids is paired with its source. An example's target should resemble the target of the example whose input is
nearest to its own more than it resembles a random other example's; targets shuffled apart from their
inputs (sources sorted by length, the targets left in their order) resemble their neighbours' no more than
anyone's.

Both sides are read as bags of tokens (which tokens, how often: the order is lost, the content is not); the
targets' tokens are weighted by their rarity (tf-idf), so that an end-of-sequence token every target holds
does not make every pair alike.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from triage.batches import named_tensors

MIN_EXAMPLES = 20  # fewer distinct inputs say nothing about neighbours


def target_lift(batches: list[Any], target: Optional[str], classes: int, ignore_index: int,
                max_vocabulary: int, max_examples: int) -> tuple[Optional[float], int]:
    """(nearest - chance) / (1 - chance): the cosine similarity of each example's target to its input-space
    nearest neighbour's, against its mean similarity to every other example's; and the examples compared.
    None where the labels are not (B, T) token targets beside (B, S) integer inputs."""
    sources, targets = [], []
    for batch in batches:
        tensors = dict(named_tensors(batch))
        labels = tensors.get(target) if target else None
        tokens = _source_tokens(tensors, labels)
        if tokens is None or tokens.min() < 0 or tokens.max() >= max_vocabulary:
            return None, 0
        sources.append(token_bags(tokens, max_vocabulary))
        targets.append(token_bags(labels, classes, ignore_index))
        if sum(len(s) for s in sources) >= max_examples:
            break
    if not sources:
        return None, 0
    x, y = distinct_inputs(torch.cat(sources)[:max_examples], torch.cat(targets)[:max_examples])
    if len(x) < MIN_EXAMPLES:
        return None, len(x)
    y = y * torch.log(len(y) / (1 + (y > 0).sum(0).double()))[None, :].clamp_min(0)  # tf-idf
    y = y / y.norm(dim=1, keepdim=True).clamp_min(1e-12)
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    distances = torch.cdist(x, x)
    distances.fill_diagonal_(float("inf"))
    similar = y @ y.T
    nearest = float(similar[torch.arange(len(y)), distances.argmin(dim=1)].mean())
    n = len(y)
    chance = float((similar.sum() - similar.diagonal().sum()) / (n * (n - 1)))
    return ((nearest - chance) / (1 - chance) if chance < 1 else None), n


def _source_tokens(tensors: dict[str, torch.Tensor], labels: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The (B, S) token ids beside (B, T) labels: the first integer tensor of B rows that is not the labels
    and not a mask (a tensor of 0s and 1s)."""
    if labels is None or labels.dim() != 2 or labels.shape[1] < 2 or labels.is_floating_point():
        return None
    for tensor in tensors.values():
        if (tensor is not labels and tensor.dim() == 2 and tensor.shape[0] == labels.shape[0]
                and not tensor.is_floating_point() and tensor.dtype != torch.bool and tensor.numel()
                and int(tensor.max()) > 1):
            return tensor
    return None


def token_bags(tokens: torch.Tensor, vocabulary: int, ignore_index: Optional[int] = None) -> torch.Tensor:
    """(B, vocabulary) counts of each id per row, on the CPU; ids outside [0, vocabulary) (padding labels) left
    out."""
    tokens = tokens.long().cpu()
    kept = (tokens >= 0) & (tokens < vocabulary)
    if ignore_index is not None:
        kept &= tokens != ignore_index
    counts = torch.zeros(tokens.shape[0], vocabulary, dtype=torch.double)
    return counts.scatter_add_(1, tokens.clamp(0, vocabulary - 1), kept.double())


def distinct_inputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each distinct input once (its first label or target): a snapshot that spans epochs holds every example
    several times, and an example's own copy would be its nearest neighbour, alike whatever its label."""
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long).scatter_reduce(
        0, inverse, torch.arange(len(inverse)), reduce="amin")
    first = first.sort().values
    return x[first], y[first]
