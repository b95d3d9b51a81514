"""The NCL repository's own retrieval number, ``map`` (PKU-ML/non_neg ``main_eval.py``, ``retrieval``).

Not our mAP@10 (:mod:`bayesncl.metrics.retrieval`): the rows of F are L2-normalised once over all
D dims, the dims ranked by the column sums of that matrix (descending), and the K top columns kept
*without* normalising the rows again; for each query i the other samples are ranked by squared
Euclidean distance on those K columns (a stable sort, the query's own zero distance first), and
``map`` is the mean over queries of (same-label samples among ranks 1..10) / 10, where a rank that
holds the query itself (a tie ahead of it) counts as a miss, as in their loop. Reported in percent
(their script prints the fraction; the NCL paper's 10.9 → 14.2 are percent).
"""

from __future__ import annotations

from typing import Any

import torch

from .inputs import EvalError, validate_features

__all__ = ["ncl_map", "ncl_map_at"]

DEPTH = 10


def ncl_map(features: Any, labels: Any, k: int, chunk_size: int = 256) -> float:
    """NCL's ``map`` (module doc) of ``features`` (N, D) with ``labels`` (N,) on the top ``k`` dims,
    in percent. Raises EvalError for bad input, K outside 1..D, or N <= 10."""
    f, y = validate_features(features, labels)
    n, d = f.shape
    if isinstance(k, bool) or not 0 < int(k) <= d:
        raise EvalError(f"NCL map: K={k} is out of range: need 0 < K <= D={d}")
    if n <= DEPTH:
        raise EvalError(f"NCL map needs more than {DEPTH} samples (ranks 1..{DEPTH}); got {n}")
    f = f.to(torch.float64)
    f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)  # F.normalize(val_features), eps 1e-12
    index = torch.sort(f.sum(0), descending=True, stable=True)[1]
    g = f[:, index[: int(k)]]
    sq = g.square().sum(1)
    y = y.to(torch.int64)
    correct = 0.0
    for lo in range(0, n, chunk_size):
        q = g[lo : lo + chunk_size]
        rows = torch.arange(lo, lo + len(q))
        dist = (sq[lo : lo + len(q), None] + sq[None, :] - 2 * q @ g.T).clamp_min(0)
        dist[torch.arange(len(q)), rows] = 0.0  # their (f1 - orig)**2 is exactly 0 for the query
        order = torch.sort(dist, dim=1, stable=True)[1][:, 1 : DEPTH + 1]
        hit = (y[order] == y[rows, None]) & (order != rows[:, None])
        correct += float(hit.sum(1).to(torch.float64).div(DEPTH).sum())
    return 100.0 * correct / n


def ncl_map_at(features: Any, labels: Any, dims: list[int]) -> dict[str, float]:
    """``{"<K>": ncl_map(features, labels, K)}`` for every K in ``dims`` (percent)."""
    return {str(int(k)): ncl_map(features, labels, int(k)) for k in dims}
