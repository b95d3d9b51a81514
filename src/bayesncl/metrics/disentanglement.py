"""Disentanglement against known generative factors: the Mutual Information Gap (MIG).

Chen et al. 2018 ("Isolating Sources of Disentanglement in VAEs", Eq. 6), computed as
disentanglement_lib does (``evaluation/metrics/mig.py``, ``utils.histogram_discretize``); the
protocol, step by step: docs/metrics.md, "MIG".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .inputs import EvalError

__all__ = ["NUM_BINS", "discrete_entropy", "discrete_mutual_info", "factor_metrics", "histogram_discretize",
           "mig"]

NUM_BINS = 20  # disentanglement_lib's default num_bins


def histogram_discretize(codes: Any, num_bins: int = NUM_BINS) -> np.ndarray:
    """(N, D) int64 bin ids in 0..num_bins-1: each column cut into ``num_bins`` equal-width bins
    over its own [min, max] (NumPy's histogram edges; the maximum falls in the last bin; a constant
    column is one bin)."""
    z = np.asarray(codes, dtype=np.float64)
    out = np.empty(z.shape, dtype=np.int64)
    for j in range(z.shape[1]):
        edges = np.histogram_bin_edges(z[:, j], bins=num_bins)
        out[:, j] = np.digitize(z[:, j], edges[:-1]) - 1
    return out


def _codes(values: np.ndarray) -> np.ndarray:
    return np.unique(values, return_inverse=True)[1].reshape(-1)


def discrete_entropy(values: Any) -> float:
    """H(v) in nats of the discrete values ``values`` (N,)."""
    p = np.bincount(_codes(np.asarray(values))) / len(values)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def discrete_mutual_info(a: Any, b: Any) -> float:
    """I(a; b) in nats of two discrete (N,) arrays, from their joint counts (sklearn's
    ``mutual_info_score`` on the same input)."""
    ca, cb = _codes(np.asarray(a)), _codes(np.asarray(b))
    nb = int(cb.max()) + 1
    joint = np.bincount(ca * nb + cb, minlength=(int(ca.max()) + 1) * nb).reshape(-1, nb) / len(ca)
    pa, pb = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log(joint[nz] / (pa @ pb)[nz])).sum())


def mig(
    codes: Any, factors: Any, names: Sequence[str] | None = None, num_bins: int = NUM_BINS
) -> dict[str, Any]:
    """MIG (module doc) of ``codes`` (N, D) against the integer ``factors`` (N, F).

    Returns ``{"mig": float in [0, 1], "mig_per_factor": {name: normalised gap}, "mig_bins": num_bins}``
    (+ ``mig_note`` when a constant factor was left out). ``names``: the factors' names (default
    ``factor_<k>``). Raises EvalError for ``factors`` None (features without factor labels), shapes
    that disagree, D < 2, or no factor with two values."""
    if factors is None:
        raise EvalError(
            "MIG needs factor labels: these features carry no 'factors' (extract a dataset with generative "
            "factors, e.g. data.name=dsprites)"
        )
    z = np.asarray(codes, dtype=np.float64)
    v = np.asarray(factors)
    v = v[:, None] if v.ndim == 1 else v
    if z.ndim != 2 or v.ndim != 2 or len(z) != len(v):
        raise EvalError(f"MIG: codes {z.shape} and factors {v.shape} must be (N, D) and (N, F) with one N")
    if z.shape[1] < 2:
        raise EvalError(f"MIG needs at least 2 code dimensions (the gap of the top two); got D={z.shape[1]}")
    names = list(names) if names is not None else [f"factor_{k}" for k in range(v.shape[1])]
    binned = histogram_discretize(z, num_bins)
    per: dict[str, float] = {}
    skipped = []
    for k, name in enumerate(names):
        h = discrete_entropy(v[:, k])
        if h <= 0:
            skipped.append(name)
            continue
        mi = np.sort([discrete_mutual_info(binned[:, j], v[:, k]) for j in range(z.shape[1])])[::-1]
        per[name] = float((mi[0] - mi[1]) / h)
    if not per:
        raise EvalError(f"MIG: every factor ({', '.join(names)}) has a single value: nothing to measure")
    out: dict[str, Any] = {"mig": float(np.mean(list(per.values()))), "mig_per_factor": per,
                           "mig_bins": num_bins}
    if skipped:
        out["mig_note"] = f"factor(s) with one value left out: {', '.join(skipped)}"
    return out


def factor_metrics(features: Any, factors: Any, names: Sequence[str] | None = None) -> dict[str, Any]:
    """The factor metrics of :data:`bayesncl.metrics.registry.FACTOR_METRICS` (today MIG) of the
    evaluation features (N, D) against ``factors`` (N, F); see :func:`mig`."""
    return mig(features, factors, names)
