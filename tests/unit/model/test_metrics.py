"""AUC and filtered ranking against brute-force definitions."""

from __future__ import annotations

import itertools

import pytest
import torch

from model.metrics import filtered_ranks, pair_keys, ranking_metrics, roc_auc


def brute_auc(positive, negative) -> float:
    wins = [
        1.0 if p > n else 0.5 if p == n else 0.0
        for p, n in itertools.product(positive.tolist(), negative.tolist())
    ]
    return sum(wins) / len(wins)


@pytest.mark.parametrize("seed", range(5))
def test_auc_equals_the_pairwise_definition_ties_included(seed):
    generator = torch.Generator().manual_seed(seed)
    positive = torch.randint(0, 6, (15,), generator=generator).float()
    negative = torch.randint(0, 6, (11,), generator=generator).float()
    assert roc_auc(positive, negative) == pytest.approx(brute_auc(positive, negative))


def test_auc_extremes_and_empty_input():
    assert roc_auc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert roc_auc(torch.tensor([1.0]), torch.tensor([1.0])) == 0.5
    with pytest.raises(ValueError, match="at least one"):
        roc_auc(torch.tensor([]), torch.tensor([1.0]))


def test_filtered_ranks_skip_known_links_and_the_query_nodes():
    n = 5

    # Scores: node b is as good as its index; a pair scores the index of its second node.
    def score(a, b):
        return torch.broadcast_tensors(a, b)[1].float()

    known = pair_keys(torch.tensor([0, 4]), torch.tensor([4, 0]), n)  # 0 - 4 linked
    ranks = filtered_ranks(
        score, torch.tensor([0, 0]), torch.tensor([2, 3]), torch.arange(n), known, n
    )
    # (0, 2): 3 scores higher, 4 is a known link of 0 and is filtered -> rank 2.
    # (0, 3): 4 is filtered -> rank 1.
    assert ranks.tolist() == [2, 1]
    metrics = ranking_metrics(ranks, (1, 2))
    assert metrics == {"hits@1": 0.5, "hits@2": 1.0, "mrr": 0.75}
