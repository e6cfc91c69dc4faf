"""Evaluation measures of link prediction: ROC AUC and filtered ranking (hits@k, MRR).

Plain torch, vectorized; no scikit-learn in the serving environment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def roc_auc(positive: Tensor, negative: Tensor) -> float:
    """Area under the ROC curve of scores of positive and negative examples.

    The Mann-Whitney statistic: the probability that a random positive outscores a random
    negative, ties counted one half (average ranks), so constant scores give 0.5.
    """
    if positive.numel() == 0 or negative.numel() == 0:
        raise ValueError(
            f"AUC needs at least one positive and one negative score, got {positive.numel()} "
            f"and {negative.numel()}"
        )
    scores = torch.cat([positive, negative]).double()
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    # Average 1-based rank of each distinct value: the ranks it spans, averaged.
    ends = torch.cumsum(counts, 0).double()
    average_rank = ends - (counts.double() - 1.0) / 2.0
    ranks = average_rank[inverse]
    n_pos, n_neg = positive.numel(), negative.numel()
    rank_sum = float(ranks[:n_pos].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def pair_keys(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    """One int64 per ordered pair, ``src * num_nodes + dst``."""
    return src.to(torch.int64) * num_nodes + dst.to(torch.int64)


def filtered_ranks(
    score: Callable[[Tensor, Tensor], Tensor],
    src: Tensor,
    dst: Tensor,
    candidates: Tensor,
    known_keys: Tensor,
    num_nodes: int,
    chunk: int = 32,
) -> Tensor:
    """Rank (1 = best) of each true pair ``(src[i], dst[i])`` among ``(src[i], c)``, c in
    ``candidates``, in the filtered setting.

    ``score(a, b)`` gives the scores of node index tensors ``a`` and ``b`` broadcast together.
    Filtered: candidates that are known links of ``src[i]`` (``known_keys``, sorted pair keys,
    both directions listed), ``src[i]`` itself and ``dst[i]`` itself do not compete, so the rank
    counts only non-links that score strictly higher. This is how a top-k recommendation that
    excludes existing neighbours would rank the held-out link.
    """
    ranks = []
    known = known_keys.sort().values
    for start in range(0, src.numel(), chunk):
        s, d = src[start : start + chunk], dst[start : start + chunk]
        true_score = score(s, d)
        all_scores = score(s[:, None], candidates[None, :])
        keys = pair_keys(s[:, None], candidates[None, :], num_nodes)
        if known.numel():
            position = torch.searchsorted(known, keys).clamp(max=known.numel() - 1)
            excluded = known[position] == keys
        else:
            excluded = torch.zeros_like(keys, dtype=torch.bool)
        excluded |= candidates[None, :] == s[:, None]
        excluded |= candidates[None, :] == d[:, None]
        better = (all_scores > true_score[:, None]) & ~excluded
        ranks.append(1 + better.sum(dim=1))
    return torch.cat(ranks) if ranks else torch.empty(0, dtype=torch.int64)


def ranking_metrics(ranks: Tensor, ks: Sequence[int]) -> dict[str, float]:
    """``hits@k`` (share of ranks <= k) for each k, and ``mrr`` (mean reciprocal rank)."""
    if ranks.numel() == 0:
        raise ValueError("ranking metrics need at least one ranked pair")
    metrics = {f"hits@{k}": float((ranks <= k).double().mean()) for k in ks}
    metrics["mrr"] = float((1.0 / ranks.double()).mean())
    return metrics
