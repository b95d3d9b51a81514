"""Retrieval with feature selection (PAPER-NOTES §3; NCL's and BayesNCL's Table 2 protocol).

The K dims of largest expected activation, cosine nearest neighbours (the query excluded *by
index*), P@k and mAP@10 in percent (docs/metrics.md, "Retrieval with feature selection"). The
similarity matrix is computed in row chunks of ``chunk_size`` queries: memory O(chunk_size · N).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from ._numerics import normalize_rows, row_norms
from .inputs import EvalError, needs_labels, validate_features

__all__ = [
    "auto_chunk_size", "average_precision_at_k", "check_dims", "expected_activation",
    "rank_dims", "retrieval_metrics", "select_top_dims",
]

# Elements of one similarity block when chunk_size is not given (32 Mi floats = 128 MiB).
_BLOCK_ELEMENTS = 1 << 25
_RANK_CHUNK_BYTES = 64 << 20


def auto_chunk_size(num_keys: int) -> int:
    """Queries per block so that one (chunk, num_keys) float32 block stays within 128 MiB."""
    return max(1, min(num_keys, _BLOCK_ELEMENTS // max(1, num_keys)))


def check_dims(dims: int | Iterable[int], d: int) -> list[int]:
    """Validate retrieval dims: one integer K (read as ``[K]``) or a sequence of them, each with
    0 < K <= D (Python or NumPy integers; bools are not). Returns them as a list of ``int``.
    Raises :class:`EvalError`."""
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        dims = [int(dims)]
    elif isinstance(dims, (str, bytes)) or not isinstance(dims, Iterable):
        raise EvalError(f"retrieval dims must be a positive integer K or a sequence of them; got {dims!r}")
    out = []
    for k in dims:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise EvalError(f"retrieval dim must be an integer; got {k!r}")
        if k <= 0 or k > d:
            raise EvalError(f"retrieval dim K={k} is out of range: need 0 < K <= D={d}")
        out.append(int(k))
    if not out:
        raise EvalError("retrieval dims is empty; give at least one K")
    return out


def expected_activation(features: Any) -> torch.Tensor:
    """Σ_n normalize(F)_nk for every dim k (float64, length D), accumulated in row chunks."""
    f, _ = validate_features(features, None)
    n, d = f.shape
    score = torch.zeros(d, dtype=torch.float64)
    step = max(1, _RANK_CHUNK_BYTES // (8 * d))
    for i in range(0, n, step):
        block = f[i : i + step].to(torch.float64)
        inv = 1.0 / row_norms(block).flatten().clamp_min(1e-12)
        score += inv @ block
    return score


def rank_dims(features: Any) -> torch.Tensor:
    """All dims ordered by decreasing expected activation (stable: ties keep the lower index)."""
    score = expected_activation(features)
    return torch.sort(score, descending=True, stable=True).indices


def select_top_dims(features: Any, k: int) -> torch.Tensor:
    """Indices of the ``k`` dims with the largest expected activation."""
    f, _ = validate_features(features, None)
    (k,) = check_dims([k], f.shape[1])
    return rank_dims(f)[:k]


def _neighbour_blocks(x: torch.Tensor, depth: int, chunk_size: int) -> Iterable[tuple[int, torch.Tensor]]:
    """Yield ``(start, idx)`` per chunk of queries: ``idx`` (chunk, depth) are the indices of the
    ``depth`` most cosine-similar other rows of the row-normalised ``x``, most similar first."""
    n = x.shape[0]
    keys_t = x.T  # BLAS reads the transpose in place; no copy
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        sims = torch.mm(x[start:stop], keys_t)
        rows = torch.arange(stop - start)
        sims[rows, rows + start] = -float("inf")  # exclude the query itself, by index
        idx = torch.topk(sims, depth, dim=1, largest=True, sorted=True).indices
        del sims
        yield start, idx


def average_precision_at_k(relevant: torch.Tensor, k: int = 10) -> torch.Tensor:
    """AP@k per row of a (Q, >=k) relevance matrix (most similar first), as a fraction:
    (1 / R_k) Σ_{j<=k} rel_j · P@j with R_k the relevant items among the first k; 0 if R_k = 0."""
    r = relevant[:, :k].to(torch.float64)
    ranks = torch.arange(1, r.shape[1] + 1, dtype=torch.float64)
    prec = r.cumsum(dim=1) / ranks
    return (prec * r).sum(dim=1) / r.sum(dim=1).clamp_min(1)


def retrieval_metrics(
    features: Any, labels: Any, dims: int | Sequence[int] = (64,), topk: Sequence[int] = (1, 3, 5, 10),
    chunk_size: int | None = None, map_depth: int = 10,
) -> dict[str, dict[str, float]]:
    """Retrieval precision with feature selection, in percent.

    ``dims``: the numbers K of top dims to retrieve with, a sequence of integers or one integer
    (``dims=64`` is ``dims=[64]``). Returns ``{"<K>": {"P@1": .., "P@3": .., "P@5": .., "P@10":
    .., "mAP@10": ..}}`` for every K in ``dims``. ``topk`` and ``map_depth`` are positive, ``chunk_size``
    (queries per similarity block) too. Raises :class:`EvalError` for K <= 0, K > D, a ``dims`` that
    is neither, fewer than ``max(topk, map_depth) + 1`` samples, or bad features/labels.
    """
    needs_labels(labels, "retrieval_metrics")
    f, y = validate_features(features, labels)
    n, d = f.shape
    dims = check_dims(dims, d)
    topk = [int(k) for k in topk]
    depth = max(max(topk), int(map_depth))
    if n - 1 < depth:
        raise EvalError(f"retrieval needs at least {depth + 1} samples for depth {depth}; got N={n}")
    chunk_size = chunk_size or auto_chunk_size(n)

    order = rank_dims(f)
    out: dict[str, dict[str, float]] = {}
    for k in dims:
        x = normalize_rows(f[:, order[:k]]).to(torch.float32)
        hits = torch.zeros(len(topk), dtype=torch.float64)
        ap_sum = 0.0
        for start, idx in _neighbour_blocks(x, depth, chunk_size):
            rel = y[idx] == y[start : start + idx.shape[0], None]  # type: ignore[index]
            for i, t in enumerate(topk):
                hits[i] += rel[:, :t].sum()
            ap_sum += float(average_precision_at_k(rel, map_depth).sum())
        row = {f"P@{t}": 100.0 * float(hits[i]) / (n * t) for i, t in enumerate(topk)}
        row[f"mAP@{map_depth}"] = 100.0 * ap_sum / n
        out[str(k)] = row
        del x
    return out
