"""Weighted k-nearest-neighbour classifier on frozen features (InstDisc; solo-learn's kNN).

Train features are the memory bank, test features the queries; the k most cosine-similar bank
entries vote with weight exp(sim / T) (Wu et al., 2018; docs/metrics.md, "Weighted kNN").
Queries are processed in chunks, so memory is O(chunk · N_train).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._numerics import normalize_rows
from .inputs import class_indices, validate_train_test
from .retrieval import auto_chunk_size

__all__ = ["knn_accuracy"]


def knn_accuracy(
    train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, k: int = 200,
    temperature: float = 0.07, topk: Sequence[int] = (1, 5), chunk_size: int | None = None,
) -> dict[str, float]:
    """Weighted kNN accuracy in percent: ``{"acc1": .., "acc5": ..}`` (keys follow ``topk``).

    Features are (N, D), labels (N,). ``k`` (> 0) is capped at the bank size and each top-t at the
    number of classes; ``temperature`` > 0. A test label absent from the train labels always counts
    as an error. Raises EvalError for bad features or labels, or train and test of different D.
    """
    xtr, ytr, xte, yte = validate_train_test(train_features, train_labels, test_features, test_labels,
                                             "knn_accuracy")
    ytr_idx, yte_idx, num_classes = class_indices(ytr, yte)

    bank = normalize_rows(xtr).to(torch.float32)
    k_eff = min(int(k), bank.shape[0])
    tops = [min(int(t), num_classes) for t in topk]
    chunk_size = chunk_size or auto_chunk_size(bank.shape[0])
    correct = torch.zeros(len(tops), dtype=torch.float64)
    n_test = xte.shape[0]
    for start in range(0, n_test, chunk_size):
        q = normalize_rows(xte[start : start + chunk_size]).to(torch.float32)
        sims = torch.mm(q, bank.T)
        top_sim, top_idx = torch.topk(sims, k_eff, dim=1)
        del sims
        weights = (top_sim / temperature).exp()
        scores = torch.zeros(q.shape[0], num_classes, dtype=torch.float32)
        scores.scatter_add_(1, ytr_idx[top_idx], weights)
        pred = torch.topk(scores, max(tops), dim=1).indices
        truth = yte_idx[start : start + chunk_size, None]
        for i, t in enumerate(tops):
            correct[i] += (pred[:, :t] == truth).any(dim=1).sum()
    return {f"acc{t}": 100.0 * float(correct[i]) / n_test for i, t in enumerate(topk)}
