"""Semantic consistency and the semantic entropies (PAPER-NOTES §3).

Every public function takes (N, D) features (``torch.Tensor`` or ``np.ndarray``) and (N,) integer
labels. SC and the three entropies all come from one class-aggregation product
(:class:`SemanticStats`); definitions, precision and the agreement with the authors' loops:
docs/metrics.md, "Semantic consistency" and "Semantic entropies".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._numerics import CHUNK_BYTES, EPS, NORM_EPS, downscale_exponent, magnitudes, row_norms, scaled
from .inputs import needs_labels, validate_features, warn_degenerate

__all__ = [
    "SemanticStats", "cluster_entropy", "semantic_consistency", "semantic_consistency_per_dim",
    "semantic_entropy_freq", "semantic_entropy_mean", "semantic_entropy_sum", "semantic_metrics",
    "undefined_note",
]

# A one-hot matrix larger than this (elements) is replaced by a scatter-add in float64.
_MAX_ONEHOT_ELEMENTS = 1 << 26


def _aggregate(inverse: torch.Tensor, num_classes: int, mats: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``[Y @ M for M in mats]`` as float64 (C, D), with ``Y`` the one-hot of ``inverse``."""
    n = inverse.shape[0]
    if num_classes * n <= _MAX_ONEHOT_ELEMENTS:
        dtype = mats[0].dtype
        onehot = torch.zeros(num_classes, n, dtype=dtype)
        onehot[inverse, torch.arange(n)] = 1
        return [torch.mm(onehot, m).to(torch.float64) for m in mats]
    out = []
    for m in mats:
        acc = torch.zeros(num_classes, m.shape[1], dtype=torch.float64)
        step = max(1, CHUNK_BYTES // (8 * m.shape[1]))
        for i in range(0, n, step):
            acc.index_add_(0, inverse[i : i + step], m[i : i + step].to(torch.float64))
        out.append(acc)
    return out


def _entropy_columns(weights: np.ndarray) -> np.ndarray:
    """Entropy (nats) of every column of non-negative ``weights`` normalised to sum 1, ignoring
    probabilities <= 1e-5 (the authors' ``p[p > eps]``)."""
    total = weights.sum(axis=0)
    p = weights / np.where(total > 0, total, 1.0)
    safe = np.where(p > EPS, p, 1.0)  # log(1) = 0 drops the ignored terms
    return -(safe * np.log(safe)).sum(axis=0)


@dataclass
class SemanticStats:
    """Per-dimension class statistics behind SC and the semantic entropies.

    All tensors are float64 on CPU. ``act_sum``, ``fire_count`` and ``sc_count`` are (C, D);
    ``class_sizes`` is (C,).
    """

    classes: torch.Tensor
    class_sizes: torch.Tensor
    act_sum: torch.Tensor  # S[c, k] = sum_{n in c} |F_nk|
    fire_count: torch.Tensor  # K[c, k] = #{n in c : |F_nk| > 1e-5}
    sc_count: torch.Tensor  # K_sc[c, k] = #{n in c : |F_nk| / ||F_n|| > 1e-5}
    num_samples: int
    dim: int
    positive: torch.Tensor | None = None  # (D,) bool: the dims with an entry F_nk > 0 (cluster entropy)

    @classmethod
    def from_features(cls, f: torch.Tensor, y: torch.Tensor) -> SemanticStats:
        classes, inverse, sizes = torch.unique(y, return_inverse=True, return_counts=True)
        a = magnitudes(f)
        # SC thresholds the row-normalised features (F.normalize: x / max(||x||, 1e-12)); for
        # unit rows both indicators agree and one count product serves both.
        thresholds = _sc_thresholds(f)
        same = torch.equal(a > EPS, a > thresholds)
        # Indicators are written straight into float tensors (a bool->float cast is ~5x slower).
        fire = torch.empty_like(a)
        torch.gt(a, EPS, out=fire)
        mats = [a, fire]
        if not same:
            sc = torch.empty_like(a)
            torch.gt(a, thresholds, out=sc)
            mats.append(sc)
        out = _aggregate(inverse, classes.numel(), mats)
        act_sum, fire_count = out[0], out[1]
        if not bool(torch.isfinite(act_sum).all()):
            # class sums of huge activations overflowed the input's dtype: sum a power-of-two
            # rescaled copy (exact) and scale the float64 result back
            e = downscale_exponent(float(a.max()), f.shape[0], a.dtype)
            act_sum = torch.ldexp(_aggregate(inverse, classes.numel(), [scaled(a, e)])[0], torch.tensor(e))
        sc_count = fire_count if same else out[2]
        return cls(
            classes=classes, class_sizes=sizes.to(torch.float64), act_sum=act_sum, fire_count=fire_count,
            sc_count=sc_count, num_samples=int(f.shape[0]), dim=int(f.shape[1]),
            positive=(f > 0).any(dim=0).cpu(),
        )

    # -- per-dimension values (NaN where a dimension does not enter the mean) -----------------
    # The (C, D) post-processing runs in NumPy: it is small, and single-threaded NumPy avoids
    # the thread-pool synchronisation that dominates tiny parallel torch ops.

    def sc_per_dim(self) -> np.ndarray:
        """SC_k in [0, 1]; NaN for dims with no sample above the threshold."""
        counts = self.sc_count.numpy()
        total = counts.sum(axis=0)
        top = counts.max(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, top / np.maximum(total, 1.0), np.nan)

    def entropies_per_dim(self) -> dict[str, np.ndarray]:
        """H_sum, H_mean, H_freq per dim (nats); NaN where the dim is skipped."""
        act = self.act_sum.numpy()
        fire = self.fire_count.numpy()
        col = act.sum(axis=0)
        active = col > EPS  # the authors' ``features.abs().sum(0) > eps``
        mean_act = act / self.class_sizes.numpy()[:, None]
        eligible = {
            "sum": active, "mean": active & (mean_act.sum(axis=0) >= EPS),
            "freq": active & (fire.sum(axis=0) >= EPS),
        }
        values = {
            "sum": _entropy_columns(act), "mean": _entropy_columns(mean_act), "freq": _entropy_columns(fire),
        }
        return {k: np.where(eligible[k], values[k], np.nan) for k in values}

    def cluster_entropy_per_dim(self) -> np.ndarray:
        """NCL's per-dimension cluster entropy (nats): over S_k = {n : |F̂_nk| > 1e-5} (SC's set),
        p_c = #{n in S_k of class c} / |S_k| and H_k = −Σ_c p_c ln(p_c + 1e-5); NaN for a dim with no
        entry > 0 (their ``features[:, F.relu(features).sum(0) > 0]``) or an empty S_k."""
        counts = self.sc_count.numpy()
        total = counts.sum(axis=0)
        p = counts / np.maximum(total, 1.0)
        ent = -(p * np.log(p + EPS)).sum(axis=0)
        positive = np.ones(self.dim, bool) if self.positive is None else self.positive.numpy()
        return np.where(positive & (total > 0), ent, np.nan)

    # -- summaries -----------------------------------------------------------------------------

    def summary(self) -> tuple[dict[str, float], list[str]]:
        """``(values, undefined)``: SC (percent) and the three entropies (nats), and the keys
        whose mean has no eligible dimension (those are reported as 0.0)."""
        ent = self.entropies_per_dim()
        per_dim = {"semantic_consistency": self.sc_per_dim(),
                   **{f"semantic_entropy_{kind}": ent[kind] for kind in ("sum", "mean", "freq")}}
        values, undefined = {}, []
        for key, vals in per_dim.items():
            kept = vals[~np.isnan(vals)]
            values[key] = float(kept.mean()) if kept.size else 0.0
            if not kept.size:
                undefined.append(key)
        values["semantic_consistency"] *= 100.0
        return values, undefined

    def firing_entries(self) -> int:
        """Number of entries with |F_nk| > 1e-5 (exact: counts are integers)."""
        return int(round(float(self.fire_count.sum())))


def _sc_thresholds(f: torch.Tensor) -> torch.Tensor:
    """(N, 1) thresholds ``max(‖F_n‖, 1e-12) · 1e-5`` in F's dtype: |F_nk| above it ⇔ |F̂_nk| > 1e-5.

    A row whose norm overflows the dtype (e.g. float32 entries ~1e38) gets its norm from
    :func:`row_norms` (max-abs rescaled, float64), so SC does not depend on the scale of F.
    """
    thresholds = torch.linalg.vector_norm(f, dim=1, keepdim=True).clamp_min(NORM_EPS) * EPS
    bad = ~torch.isfinite(thresholds).flatten()
    if bool(bad.any()):
        thresholds[bad] = (row_norms(f[bad]) * EPS).to(f.dtype)
    return thresholds


def _stats(features: Any, labels: Any, metric: str) -> SemanticStats:
    needs_labels(labels, metric)
    f, y = validate_features(features, labels)
    return SemanticStats.from_features(f, y)  # type: ignore[arg-type]


def undefined_note(undefined: Sequence[str]) -> str:
    """The note for metric keys whose mean has no eligible dimension (they are reported as 0.0)."""
    return f"no dimension qualifies for {', '.join(undefined)}; reported as 0.0"


def _semantic(features: Any, labels: Any, metric: str, key: str | None = None) -> dict[str, float]:
    """The four semantic values; warns for those without a dimension (only ``key``'s if given)."""
    values, undefined = _stats(features, labels, metric).summary()
    undefined = [k for k in undefined if key in (None, k)]
    if undefined:
        warn_degenerate(f"{metric}: {undefined_note(undefined)}")
    return values


def _semantic_one(features: Any, labels: Any, key: str) -> float:
    return _semantic(features, labels, key, key)[key]


def semantic_metrics(features: Any, labels: Any) -> dict[str, float]:
    """SC (percent) and H_sum, H_mean, H_freq (nats) from one class-aggregation product."""
    return _semantic(features, labels, "semantic_metrics")


def semantic_consistency(features: Any, labels: Any) -> float:
    """Semantic consistency in percent (0-100).

    Rows are L2-normalised; for every dim k, the samples with |F̂_nk| > 1e-5 are taken and
    SC_k = (count of their majority class) / (their number). SC = 100 · mean_k SC_k over the dims
    that have such samples. Returns 0.0 (with an :class:`EvalWarning`) when no dim has one.
    """
    return _semantic_one(features, labels, "semantic_consistency")


def cluster_entropy(features: Any, labels: Any) -> float:
    """NCL's cluster entropy (nats): the mean over dims of :meth:`SemanticStats.cluster_entropy_per_dim`,
    the number PKU-ML/non_neg ``main_eval.py`` prints as ``[cluster ent] mean`` beside its cluster
    accuracy (our SC). Returns 0.0 (with an :class:`EvalWarning`) when no dim qualifies."""
    vals = _stats(features, labels, "cluster_entropy").cluster_entropy_per_dim()
    kept = vals[~np.isnan(vals)]
    if not kept.size:
        warn_degenerate(f"cluster_entropy: {undefined_note(['cluster_entropy'])}")
        return 0.0
    return float(kept.mean())


def semantic_consistency_per_dim(features: Any, labels: Any) -> np.ndarray:
    """SC_k in [0, 1] for every dim (float64, length D); NaN where no sample exceeds 1e-5."""
    return _stats(features, labels, "semantic_consistency_per_dim").sc_per_dim()


def semantic_entropy_sum(features: Any, labels: Any) -> float:
    """H_sum (nats): mean over dims of the entropy of p_c ∝ Σ_{n∈c} |F_nk|."""
    return _semantic_one(features, labels, "semantic_entropy_sum")


def semantic_entropy_mean(features: Any, labels: Any) -> float:
    """H_mean (nats): mean over dims of the entropy of p_c ∝ (Σ_{n∈c} |F_nk|) / |c|."""
    return _semantic_one(features, labels, "semantic_entropy_mean")


def semantic_entropy_freq(features: Any, labels: Any) -> float:
    """H_freq (nats): mean over dims of the entropy of p_c ∝ #{n ∈ c : |F_nk| > 1e-5}."""
    return _semantic_one(features, labels, "semantic_entropy_freq")
