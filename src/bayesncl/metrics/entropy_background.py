"""Appendix J of the BayesNCL paper, measured: do NCL's high-entropy dimensions encode the background?

Per active dimension k: its semantic entropy H_k (H_sum, nats) and its background share
b_k = r_place(k) / (r_class(k) + r_place(k)) in [0, 1] from the lifts of
:func:`bayesncl.metrics.background.group_lift`; Spearman's ρ(H, b) and b per :data:`BINS` bins of H
(docs/metrics.md, "Appendix J relation").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .background import BackgroundShared
from .semantic import SemanticStats

__all__ = ["BINS", "entropy_background"]

BINS = 4  # quartiles of the dims' semantic entropy


def entropy_background(features: Any, labels: Any, places: Any, bins: int = BINS) -> dict[str, float]:
    """The Appendix J relation (module doc) of (N, D) ``features``, (N,) ``labels`` and ``places``.

    Returns ``{"spearman": ρ(H, b), "dims": count, "q<i>.entropy", "q<i>.bg_share", "q<i>.bg_dims"}``
    for bins i = 1..``bins`` (NaN where a bin is empty or ρ undefined). Raises EvalError for bad input."""
    from scipy.stats import spearmanr

    s = BackgroundShared.from_arrays(features, labels, places)
    h = SemanticStats.from_features(s.f, s.y).entropies_per_dim()["sum"]
    r_class, r_place = s.lifts
    with np.errstate(invalid="ignore", divide="ignore"):
        share = r_place / (r_class + r_place)
    keep = np.isfinite(h) & np.isfinite(share)
    out: dict[str, float] = {"dims": float(keep.sum()), "spearman": float("nan")}
    hk, bk, kinds = h[keep], share[keep], s.kinds[keep]
    if keep.sum() > 2 and np.ptp(hk) > 0 and np.ptp(bk) > 0:
        out["spearman"] = float(spearmanr(hk, bk).statistic)
    order = np.argsort(hk, kind="stable")
    for i, part in enumerate(np.array_split(order, bins), start=1):
        empty = part.size == 0
        out[f"q{i}.entropy"] = float("nan") if empty else float(hk[part].mean())
        out[f"q{i}.bg_share"] = float("nan") if empty else float(bk[part].mean())
        out[f"q{i}.bg_dims"] = float("nan") if empty else float((kinds[part] == 1).mean())
    return out
