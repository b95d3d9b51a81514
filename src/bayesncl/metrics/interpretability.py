"""Interpretability metrics of evaluation features (PAPER-NOTES §3, docs/metrics.md).

Every public function takes an (N, D) ``torch.Tensor`` or ``np.ndarray`` of features and, where a
metric needs them, (N,) integer labels, and returns a Python ``float`` (``active_dims``: ``int``).

Semantic consistency and the three semantic entropies all come from one class-aggregation
product: with ``Y`` the (C, N) one-hot matrix of the classes present in the labels,

* ``S = Y @ |F|``                  summed activation per (class, dim),
* ``K = Y @ 1[|F| > 1e-5]``        number of firing samples per (class, dim),
* ``K_sc = Y @ 1[|F̂| > 1e-5]``     the same on row-normalised features F̂ (SC's threshold); it is
  the same matrix as ``K`` (and is not recomputed) when both indicators agree, which is the case
  for the L2-normalised evaluation features the pipeline writes.

The products run in the input's precision (float32 for float32 features: counts are exact below
2**24 rows, and the activation sums carry float32 BLAS accumulation, relative error ~1e-6);
everything after them is float64.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._numerics import NORM_EPS, downscale_exponent, row_norms, scaled
from .inputs import EvalError, EvalWarning, validate_features

__all__ = [
    "EPS",
    "METRIC_KEYS",
    "SemanticStats",
    "activation_ratio",
    "active_dims",
    "compute_all",
    "effective_rank",
    "format_metrics_table",
    "orthogonality",
    "semantic_consistency",
    "semantic_consistency_per_dim",
    "semantic_entropy_freq",
    "semantic_entropy_mean",
    "semantic_entropy_sum",
    "semantic_metrics",
    "sepin_at_k",
    "sepin_scores",
    "sparsity",
    "spectral_entropy",
]

#: The activation threshold of PAPER-NOTES §3 (and of the authors' evaluation code).
EPS = 1e-5

#: The keys of :func:`compute_all`, in order (``retrieval`` and ``note`` are added when present).
METRIC_KEYS = (
    "semantic_consistency",
    "semantic_entropy_sum",
    "semantic_entropy_mean",
    "semantic_entropy_freq",
    "active_dims",
    "activation_ratio",
    "sparsity",
    "effective_rank",
    "orthogonality",
)

NO_ACTIVE_NOTE = "no active dimensions"

# A one-hot matrix larger than this (elements) is replaced by a scatter-add in float64.
_MAX_ONEHOT_ELEMENTS = 1 << 26
# Row chunk for float64 Gram accumulation (keeps the float64 copy at ~64 MiB).
_GRAM_CHUNK_BYTES = 64 << 20


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _needs_labels(labels: Any, metric: str) -> None:
    if labels is None:
        raise EvalError(f"{metric} needs labels; got labels=None")


def _abs(f: torch.Tensor) -> torch.Tensor:
    """|F| without a copy when F is already non-negative (the NCL/BayesNCL case)."""
    return f if bool(f.min() >= 0) else f.abs()


def _warn(msg: str) -> None:
    warnings.warn(msg, EvalWarning, stacklevel=3)


def _class_index(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Classes present in ``y``, the class index of every row, and the class sizes."""
    classes, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    return classes, inverse, counts


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
        step = max(1, _GRAM_CHUNK_BYTES // (8 * m.shape[1]))
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

    @classmethod
    def from_features(cls, f: torch.Tensor, y: torch.Tensor) -> SemanticStats:
        classes, inverse, sizes = _class_index(y)
        a = _abs(f)
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
            classes=classes,
            class_sizes=sizes.to(torch.float64),
            act_sum=act_sum,
            fire_count=fire_count,
            sc_count=sc_count,
            num_samples=int(f.shape[0]),
            dim=int(f.shape[1]),
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
            "sum": active,
            "mean": active & (mean_act.sum(axis=0) >= EPS),
            "freq": active & (fire.sum(axis=0) >= EPS),
        }
        values = {
            "sum": _entropy_columns(act),
            "mean": _entropy_columns(mean_act),
            "freq": _entropy_columns(fire),
        }
        return {k: np.where(eligible[k], values[k], np.nan) for k in values}

    # -- summaries -----------------------------------------------------------------------------

    def summary(self) -> tuple[dict[str, float], list[str]]:
        """``(values, undefined)``: SC (percent) and the three entropies (nats), and the keys
        whose mean has no eligible dimension (those are reported as 0.0)."""
        per_dim = {"semantic_consistency": self.sc_per_dim()}
        ent = self.entropies_per_dim()
        for kind in ("sum", "mean", "freq"):
            per_dim[f"semantic_entropy_{kind}"] = ent[kind]
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
    _needs_labels(labels, metric)
    f, y = validate_features(features, labels)
    return SemanticStats.from_features(f, y)  # type: ignore[arg-type]


def _undefined_note(undefined: Sequence[str]) -> str:
    return f"no dimension qualifies for {', '.join(undefined)}; reported as 0.0"


def _semantic(features: Any, labels: Any, metric: str, keys: Sequence[str] | None = None) -> dict[str, float]:
    values, undefined = _stats(features, labels, metric).summary()
    undefined = [k for k in undefined if keys is None or k in keys]
    if undefined:
        _warn(f"{metric}: {_undefined_note(undefined)}")
    return values


def _semantic_one(features: Any, labels: Any, key: str) -> float:
    return _semantic(features, labels, key, [key])[key]


# --------------------------------------------------------------------------------------------
# semantic consistency and entropies
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# activity, sparsity
# --------------------------------------------------------------------------------------------


def _active_mask(f: torch.Tensor) -> torch.Tensor:
    # A sum of non-negative floats is 0 only if every term is 0, so float32 accumulation is exact
    # for this test.
    return _abs(f).sum(dim=0) > 0


def active_dims(features: Any, labels: Any = None) -> int:
    """Number of dims with mean_n |F_nk| > 0."""
    f, _ = validate_features(features, None)
    return int(_active_mask(f).sum())


def activation_ratio(features: Any, labels: Any = None) -> float:
    """Active dims / D ("Act." in the BayesNCL paper's Table 1)."""
    f, _ = validate_features(features, None)
    return int(_active_mask(f).sum()) / f.shape[1]


def sparsity(features: Any, labels: Any = None) -> float:
    """1 − mean(|F| > 1e-5): the fraction of entries at or below the threshold."""
    f, _ = validate_features(features, None)
    fired = int((_abs(f) > EPS).sum())
    return 1.0 - fired / f.numel()


# --------------------------------------------------------------------------------------------
# spectrum and orthogonality (both from the float64 Gram matrix of the active columns)
#
# With D_a active columns and N rows, the D_a x D_a Gram FᵀF is built only when D_a <= N. For
# D_a > N (a wide projector, e.g. model.proj_dim = 100000 on a 10000-image test split) memory
# stays O(min(N, D_a)^2) plus fixed 64 MiB blocks:
# * the spectrum comes from the N x N Gram FFᵀ, whose eigenvalues are the nonzero eigenvalues of
#   FᵀF (the squared singular values of F) plus zeros, which the entropy ignores;
# * the orthogonality error, a sum of |cosines| over all D_a^2 column pairs, has no N x N form: it
#   is accumulated over blocks of rows of FᵀF (upper triangle), never holding more than one block.
# --------------------------------------------------------------------------------------------


def _gram_active(f: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """FᵀF over the active columns in float64, accumulated in row chunks.

    When the entries are so large that FᵀF would overflow float64 (only possible for float64
    input), F is divided by a power of two first: the spectral entropy and the orthogonality
    error only see ratios, so they are unchanged.
    """
    idx = torch.nonzero(active).flatten()
    d = idx.numel()
    gram = torch.zeros(d, d, dtype=torch.float64)
    if d == 0:
        return gram
    e = 0
    if f.dtype == torch.float64:
        e = downscale_exponent(float(f.abs().max()), f.shape[0], torch.float64, power=2)
    all_active = d == f.shape[1]
    step = max(1, _GRAM_CHUNK_BYTES // (8 * d))
    for i in range(0, f.shape[0], step):
        block = f[i : i + step]
        block = scaled((block if all_active else block[:, idx]).to(torch.float64), e)
        gram.addmm_(block.T, block)
    return gram


def _float64_exponent(f: torch.Tensor, terms: int) -> int:
    """The power of two to divide float64 ``f`` by so that sums of ``terms`` squares cannot
    overflow (0 for other dtypes: their float64 squares cannot)."""
    if f.dtype != torch.float64:
        return 0
    return downscale_exponent(float(f.abs().max()), terms, torch.float64, power=2)


def _gram_rows(f: torch.Tensor) -> torch.Tensor:
    """FFᵀ (N x N, float64), accumulated over blocks of columns. Its eigenvalues are the nonzero
    eigenvalues of FᵀF plus zeros (all-zero columns add nothing, so it needs no active mask)."""
    n, d = f.shape
    gram = torch.zeros(n, n, dtype=torch.float64)
    e = _float64_exponent(f, d)
    step = max(1, _GRAM_CHUNK_BYTES // (8 * n))
    for j in range(0, d, step):
        block = scaled(f[:, j : j + step].to(torch.float64), e)
        gram.addmm_(block, block.T)
    return gram


def _spectral_gram(f: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The smaller of FᵀF over the active columns and FFᵀ: the same nonzero spectrum."""
    return _gram_rows(f) if int(active.sum()) > f.shape[0] else _gram_active(f, active)


def _orthogonality_blocked(f: torch.Tensor, active: torch.Tensor) -> float:
    """:func:`_orthogonality_from_gram` of FᵀF over the active columns, without building FᵀF:
    blocks of rows of the column-normalised Gram, upper triangle only (it is symmetric)."""
    idx = torch.nonzero(active).flatten()
    d = idx.numel()
    if d < 2:
        return 0.0
    n = f.shape[0]
    e = _float64_exponent(f, n)
    step = max(1, _GRAM_CHUNK_BYTES // (8 * d))
    norms = torch.zeros(d, dtype=torch.float64)
    for i in range(0, n, step):
        block = scaled(f[i : i + step, idx].to(torch.float64), e)
        norms += (block * block).sum(dim=0)
    norms = norms.sqrt()
    off = torch.zeros((), dtype=torch.float64)
    for s in range(0, d, step):
        t = min(d, s + step)
        cols = idx[s:]
        part = torch.zeros(t - s, d - s, dtype=torch.float64)  # rows s..t of FᵀF, columns s..d
        rows = max(1, _GRAM_CHUNK_BYTES // (8 * (d - s)))
        for i in range(0, n, rows):
            block = scaled(f[i : i + rows, cols].to(torch.float64), e)
            part.addmm_(block[:, : t - s].T, block)
        corr = part / norms[s:t, None] / norms[None, s:]
        square = corr[:, : t - s].abs()  # both halves of the diagonal block
        off += square.sum() - square.diagonal().sum() + 2.0 * corr[:, t - s :].abs().sum()
    return float(off / (d * (d - 1)))


def _orthogonality(f: torch.Tensor, active: torch.Tensor) -> float:
    """Orthogonality error from FᵀF when D_a <= N, else blockwise (no D_a x D_a matrix)."""
    if int(active.sum()) > f.shape[0]:
        return _orthogonality_blocked(f, active)
    return _orthogonality_from_gram(_gram_active(f, active))


def _spectral_entropy_from_gram(gram: torch.Tensor) -> float:
    """Entropy of the normalised singular values, from the eigenvalues of a Gram matrix.

    Eigenvalues at or below the round-off level ``size · ε · λ_max`` count as 0: for the exact
    zeros of a rank-deficient Gram (FᵀF with D > N) ``eigvalsh`` returns values of order
    ``1e-16 · λ_max`` of either sign, whose square roots would add ~1e-7 nats each. This also
    makes FᵀF and FFᵀ, which share their nonzero eigenvalues, give the same entropy.
    """
    if gram.numel() == 0:
        return 0.0
    eig = torch.linalg.eigvalsh(gram)
    tol = gram.shape[0] * torch.finfo(eig.dtype).eps * eig.max()
    eig = torch.where(eig > tol, eig, torch.zeros_like(eig))
    s = eig.sqrt()
    total = s.sum()
    if not bool(total > 0):
        return 0.0
    p = s / total
    return float(-torch.special.xlogy(p, p).sum())


def _orthogonality_from_gram(gram: torch.Tensor) -> float:
    d = gram.shape[0]
    if d < 2:
        return 0.0
    norms = gram.diagonal().sqrt()
    corr = gram / norms[:, None] / norms[None, :]
    off = corr.abs().sum() - corr.diagonal().abs().sum()
    return float(off / (d * (d - 1)))


def spectral_entropy(features: Any, labels: Any = None) -> float:
    """The authors' logged quantity −Σ s̄ log s̄ (nats), s̄ = singular values of F / their sum.

    ``effective_rank = exp(spectral_entropy)``. 0.0 for all-zero features. Memory is
    O(min(N, D)²): the eigenvalues come from FᵀF (active columns) or from FFᵀ, whichever is smaller.
    """
    f, _ = validate_features(features, None)
    return _spectral_entropy_from_gram(_spectral_gram(f, _active_mask(f)))


def effective_rank(features: Any, labels: Any = None) -> float:
    """Effective rank exp(−Σ s̄ log s̄) (Roy & Vetterli 2007), in [1, rank F]; 0.0 for F = 0.

    This is what the ``effective_rank`` key reports; the entropy itself is :func:`spectral_entropy`.
    Memory is O(min(N, D)²), as for :func:`spectral_entropy`.
    """
    f, _ = validate_features(features, None)
    active = _active_mask(f)
    if not bool(active.any()):
        return 0.0
    return math.exp(_spectral_entropy_from_gram(_spectral_gram(f, active)))


def orthogonality(features: Any, labels: Any = None) -> float:
    """Orthogonality error: on active dims, normalise each column and return the mean of
    |F̂ᵀF̂ − I| over the off-diagonal entries (0 = orthogonal dims). 0.0 for fewer than 2 dims.

    With more active dims D_a than rows N, F̂ᵀF̂ is summed block by block (64 MiB blocks) instead
    of being built: memory O(D_a) plus the blocks, time O(N·D_a²) as before."""
    f, _ = validate_features(features, None)
    return _orthogonality(f, _active_mask(f))


# --------------------------------------------------------------------------------------------
# SEPIN@k (label-based Gaussian estimate; docs/metrics.md, "SEPIN@k")
# --------------------------------------------------------------------------------------------

_SEPIN_RIDGE = 1e-6


def _inverse_diagonal(chol: torch.Tensor) -> torch.Tensor:
    """diag(Σ⁻¹) from the Cholesky factor L of Σ: Σ⁻¹ = L⁻ᵀL⁻¹, so (Σ⁻¹)_ii = Σ_k (L⁻¹)_ki².
    (A triangular solve; ``torch.cholesky_inverse`` is ~20x slower on CPU.)"""
    eye = torch.eye(chol.shape[0], dtype=chol.dtype)
    inv_l = torch.linalg.solve_triangular(chol, eye, upper=False)
    return (inv_l * inv_l).sum(dim=0)


def sepin_scores(features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-dim informativeness INFO_i = I(y; z_i) and separated informativeness
    SEP_i = I(y; z_i | z_≠i) = I(y; z) − I(y; z_≠i), both in nats, under the Gaussian
    (shared-covariance) model of docs/metrics.md:

    * INFO_i = ½ log(Σ_T[i,i] / Σ_W[i,i]),
    * SEP_i  = ½ log((Σ_W⁻¹)[i,i] / (Σ_T⁻¹)[i,i]),

    with Σ_T the total and Σ_W the pooled within-class covariance (both 1/N), each plus the
    ridge 1e-6 · mean(diag Σ_T) · I. Dims with zero variance get INFO = SEP = 0.
    """
    _needs_labels(labels, "sepin_scores")
    f, y = validate_features(features, labels)
    n, d = f.shape
    if f.dtype == torch.float64:  # the ratios below do not depend on a common scale of F
        f = scaled(f, downscale_exponent(float(f.abs().max()), 4 * n, torch.float64, power=2))
    _, inverse, sizes = _class_index(y)  # type: ignore[arg-type]
    weights = sizes.to(torch.float64) / n
    # float64 moments accumulated in row chunks (no full float64 copy of F), about a shift close
    # to the mean so that the second moment minus the squared mean does not cancel badly
    shift = f[: min(n, 1024)].to(torch.float64).mean(dim=0)
    second = torch.zeros(d, d, dtype=torch.float64)
    class_sums = torch.zeros(sizes.numel(), d, dtype=torch.float64)
    step = max(1, _GRAM_CHUNK_BYTES // (8 * d))
    for i in range(0, n, step):
        block = f[i : i + step].to(torch.float64) - shift
        second.addmm_(block.T, block)
        class_sums.index_add_(0, inverse[i : i + step], block)
    mean = class_sums.sum(dim=0) / n
    sigma_t = second / n - torch.outer(mean, mean)
    var = sigma_t.diagonal().clamp_min(0)
    info = np.zeros(d)
    sep = np.zeros(d)
    if not bool(var.max() > 0):
        return info, sep
    keep = var > 1e-12 * float(var.max())
    idx = torch.nonzero(keep).flatten()
    sigma_t = sigma_t[idx][:, idx]
    centred = class_sums[:, idx] / sizes.to(torch.float64)[:, None] - mean[idx]
    sigma_b = (centred.T * weights) @ centred
    sigma_w = sigma_t - sigma_b
    ridge = _SEPIN_RIDGE * float(sigma_t.diagonal().mean())
    eye = torch.eye(idx.numel(), dtype=torch.float64)
    sigma_t = sigma_t + ridge * eye
    sigma_w = sigma_w + ridge * eye
    sigma_w = (sigma_w + sigma_w.T) / 2
    info_k = 0.5 * torch.log(sigma_t.diagonal() / sigma_w.diagonal().clamp_min(ridge))
    w_chol, err = torch.linalg.cholesky_ex(sigma_w)
    if int(err) != 0:  # Σ_W lost definiteness to round-off: project onto the PSD cone
        evals, evecs = torch.linalg.eigh(sigma_w)
        sigma_w = (evecs * evals.clamp_min(ridge)) @ evecs.T
        w_chol = torch.linalg.cholesky(sigma_w)
    sep_k = 0.5 * torch.log(_inverse_diagonal(w_chol) / _inverse_diagonal(torch.linalg.cholesky(sigma_t)))
    keep_np = keep.numpy()
    info[keep_np] = info_k.clamp_min(0).numpy()
    sep[keep_np] = sep_k.clamp_min(0).numpy()
    return info, sep


def sepin_at_k(features: Any, labels: Any, k: int | str | None = None) -> float:
    """SEPIN@k (nats): mean of SEP_i over the k dims with the largest INFO_i (ties: lower index).

    ``k=None`` or ``"all"`` averages over all D dims (SEPIN@all). See :func:`sepin_scores` and
    docs/metrics.md for the definition, its source (Do & Tran, 2020; used by Wang et al., 2024)
    and how this label-based estimate differs from the NCL paper's.
    """
    f, _ = validate_features(features, None)
    d = f.shape[1]
    if k is None or k == "all":
        k = d
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise EvalError(f"SEPIN k must be a positive integer or 'all'; got {k!r}")
    if not 0 < int(k) <= d:
        raise EvalError(f"SEPIN k must be in 1..{d} (the feature dimension); got {k}")
    info, sep = sepin_scores(f, labels)
    order = np.argsort(-info, kind="stable")[: int(k)]
    return float(sep[order].mean())


# --------------------------------------------------------------------------------------------
# all metrics, CLI helpers
# --------------------------------------------------------------------------------------------


def compute_all(
    features: Any, labels: Any, retrieval_dims: int | Iterable[int] | None = None
) -> dict[str, Any]:
    """Every metric of PAPER-NOTES §3 as a JSON-ready dict.

    Keys: the nine :data:`METRIC_KEYS`; ``retrieval`` (``{"<K>": {"P@1", "P@3", "P@5", "P@10",
    "mAP@10"}}``, percent) when ``retrieval_dims`` (one K or a sequence) is given; ``note`` only
    for degenerate input: ``"no active dimensions"`` (all-zero features: SC, entropies, effective
    rank and orthogonality are 0.0) or ``"no dimension qualifies for <keys>; reported as 0.0"``
    (e.g. every entry is <= 1e-5, so H_freq has no dimension to average), instead of undefined
    values.
    """
    _needs_labels(labels, "compute_all")
    f, y = validate_features(features, labels)
    if retrieval_dims is not None:
        from .retrieval import check_dims

        retrieval_dims = check_dims(retrieval_dims, f.shape[1])

    stats = SemanticStats.from_features(f, y)  # type: ignore[arg-type]
    active = _active_mask(f)
    n_active = int(active.sum())
    if n_active > stats.num_samples:  # wide features: no D_a x D_a Gram (see the spectrum section)
        h_spec = _spectral_entropy_from_gram(_gram_rows(f))
        ortho = _orthogonality_blocked(f, active)
    else:
        gram = _gram_active(f, active)
        h_spec, ortho = _spectral_entropy_from_gram(gram), _orthogonality_from_gram(gram)
    values, undefined = stats.summary()
    out: dict[str, Any] = dict(values)
    out.update(
        active_dims=n_active,
        activation_ratio=n_active / stats.dim,
        sparsity=1.0 - stats.firing_entries() / (stats.num_samples * stats.dim),
        effective_rank=math.exp(h_spec) if n_active else 0.0,
        orthogonality=ortho,
    )
    out = {key: out[key] for key in METRIC_KEYS}
    if retrieval_dims is not None:
        from .retrieval import retrieval_metrics

        out["retrieval"] = retrieval_metrics(f, y, dims=retrieval_dims)
    note = NO_ACTIVE_NOTE if n_active == 0 else (_undefined_note(undefined) if undefined else None)
    if note is not None:
        out["note"] = note
        _warn(f"compute_all: {note}")
    return out




_TABLE_ROWS = (
    ("semantic_consistency", "Semantic consistency (SC)", "%", "{:.2f}"),
    ("semantic_entropy_sum", "Semantic entropy H_sum", "nats", "{:.4f}"),
    ("semantic_entropy_mean", "Semantic entropy H_mean", "nats", "{:.4f}"),
    ("semantic_entropy_freq", "Semantic entropy H_freq", "nats", "{:.4f}"),
    ("active_dims", "Active dims", "count", "{:d}"),
    ("activation_ratio", "Activation ratio (Act.)", "fraction", "{:.4f}"),
    ("sparsity", "Sparsity", "fraction", "{:.4f}"),
    ("effective_rank", "Effective rank exp(H_spectral)", "dims", "{:.2f}"),
    ("orthogonality", "Orthogonality error", "mean abs cos", "{:.4f}"),
)


def format_metrics_table(result: dict[str, Any]) -> str:
    """Render :func:`compute_all` / :func:`metrics_command` output as a Markdown table."""
    lines: list[str] = []
    src = result.get("source")
    if isinstance(src, dict):
        extra = ", ".join(f"{k}={src[k]}" for k in ("method", "dataset", "split") if k in src)
        lines.append(
            f"Features: {src.get('path')} (N={src.get('num_samples')}, D={src.get('dim')}"
            + (f", {extra}" if extra else "")
            + ")"
        )
        lines.append("")
    lines += ["| metric | value | unit |", "|---|---:|---|"]
    for key, label, unit, fmt in _TABLE_ROWS:
        if key in result:
            val = result[key]
            text = fmt.format(int(val)) if fmt == "{:d}" else fmt.format(float(val))
            lines.append(f"| {label} | {text} | {unit} |")
    retrieval = result.get("retrieval")
    if retrieval:
        cols = list(next(iter(retrieval.values())).keys())
        lines += ["", "Retrieval (top-K dims by expected activation, percent):", ""]
        lines.append("| K | " + " | ".join(cols) + " |")
        lines.append("|---:|" + "---:|" * len(cols))
        for k, row in retrieval.items():
            lines.append(f"| {k} | " + " | ".join(f"{float(row[c]):.2f}" for c in cols) + " |")
    if "note" in result:
        lines += ["", f"Note: {result['note']}."]
    return "\n".join(lines)
