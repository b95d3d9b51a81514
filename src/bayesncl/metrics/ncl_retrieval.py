"""The NCL repository's own retrieval number, ``map`` (PKU-ML/non_neg ``main_eval.py``, ``retrieval``).

Not our mAP@10 (:mod:`bayesncl.metrics.retrieval`): the top-K columns of the once-normalised rows,
squared Euclidean ranking, same-label samples among ranks 1..10, in percent (docs/metrics.md,
"NCL's own retrieval number").
"""

from __future__ import annotations

from typing import Any

import torch

from ._numerics import CHUNK_BYTES, normalize_rows
from .inputs import EvalError, validate_features

__all__ = ["ncl_map", "normalized_top_columns"]

DEPTH = 10
CANDIDATES = 64  # nearest samples ranked exactly per query (more only where ties reach past them)
ROUND = 10  # distances (in [0, 4], float64) rounded to 1e-10: closer ones are ties, ranked by index
_NORM_BLOCK_BYTES = CHUNK_BYTES  # float64 normalised rows made at a time (64 MiB)


def ncl_map(features: Any, labels: Any, k: int, chunk_size: int = 256) -> float:
    """NCL's ``map`` (module doc) of ``features`` (N, D) with ``labels`` (N,) on the top ``k`` dims,
    in percent. Raises EvalError for bad input, K outside 1..D, or N <= 10.

    Memory: the input, the (N, K) float64 selected columns and one (chunk_size, N) distance block;
    the float64 normalised rows are made in blocks of at most 64 MiB (:func:`normalized_top_columns`).
    """
    f, y = validate_features(features, labels)
    n, d = f.shape
    if isinstance(k, bool) or not 0 < int(k) <= d:
        raise EvalError(f"NCL map: K={k} is out of range: need 0 < K <= D={d}")
    if n <= DEPTH:
        raise EvalError(f"NCL map needs more than {DEPTH} samples (ranks 1..{DEPTH}); got {n}")
    g = normalized_top_columns(f, int(k))
    sq = g.square().sum(1)
    y = y.to(torch.int64)
    correct = 0.0
    for lo in range(0, n, chunk_size):
        q = g[lo : lo + chunk_size]
        rows = torch.arange(lo, lo + len(q))
        dist = (sq[lo : lo + len(q), None] + sq[None, :] - 2 * q @ g.T).clamp_min(0)
        dist[torch.arange(len(q)), rows] = 0.0  # their (f1 - orig)**2 is exactly 0 for the query
        order = _first_ranks(dist, n)
        hit = (y[order] == y[rows, None]) & (order != rows[:, None])
        correct += float(hit.sum(1).to(torch.float64).div(DEPTH).sum())
    return 100.0 * correct / n


def _row_blocks(n: int, d: int, block_bytes: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of row blocks of an (n, d) float64 matrix of at most ``block_bytes`` each;
    a short remainder joins the block before it, so that no block is a handful of rows."""
    step = max(64, block_bytes // (8 * max(1, d)))
    bounds = list(range(0, n, step)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < 64:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def normalized_top_columns(f: torch.Tensor, k: int, block_bytes: int | None = None) -> torch.Tensor:
    """(N, k) float64: the ``k`` columns of largest sum of the row-normalised ``f`` (F.normalize in
    float64, eps 1e-12, overflow-safe), in decreasing order of that sum (stable: ties by index).

    NCL's ``main_eval.py`` normalises the whole matrix and sorts its column sums; here the float64
    normalised rows are made in blocks of ``block_bytes`` (two passes: the column sums, then the
    selected columns), so memory is O(N·k) instead of two float64 copies of F. A single block (N·D·8
    <= ``block_bytes``, default 64 MiB) performs exactly the whole-matrix operations.
    """
    n, d = f.shape
    blocks = _row_blocks(n, d, block_bytes or _NORM_BLOCK_BYTES)
    if len(blocks) == 1:
        full = normalize_rows(f.to(torch.float64))
        index = torch.sort(full.sum(0), descending=True, stable=True)[1]
        return full[:, index[:k]]
    colsum = torch.zeros(d, dtype=torch.float64)
    for lo, hi in blocks:
        colsum += normalize_rows(f[lo:hi].to(torch.float64)).sum(0)
    index = torch.sort(colsum, descending=True, stable=True)[1][:k]
    out = torch.empty(n, k, dtype=torch.float64)
    for lo, hi in blocks:
        out[lo:hi] = normalize_rows(f[lo:hi].to(torch.float64))[:, index]
    return out


def _ranked(dist: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """Ranks 1..10 of a stable sort of rows ``dist`` (B, M) over the sample indices ``idx``: the key is
    the distance in units of 1e-10 (float rounding never reorders a tie: scale invariance), then the index."""
    key = torch.round(dist * 10.0**ROUND).to(torch.int64) * n + idx
    pos = torch.topk(key, DEPTH + 1, dim=1, largest=False, sorted=True).indices[:, 1:]
    return torch.gather(idx.expand_as(dist), 1, pos)


def _first_ranks(dist: torch.Tensor, n: int) -> torch.Tensor:
    """(B, 10) sample indices at ranks 1..10 of each row of ``dist`` (B, N): ranked exactly among the
    ``CANDIDATES`` nearest; a row whose 11th distance ties past them is ranked over all N."""
    m = min(n, CANDIDATES)
    vals, cand = torch.topk(dist, m, dim=1, largest=False, sorted=True)
    out = _ranked(vals, cand, n)
    if m < n:
        units = torch.round(vals * 10.0**ROUND)
        unsure = torch.nonzero(units[:, -1] <= units[:, DEPTH]).flatten()
        if unsure.numel():
            out[unsure] = _ranked(dist[unsure], torch.arange(n).expand(len(unsure), n), n)
    return out
