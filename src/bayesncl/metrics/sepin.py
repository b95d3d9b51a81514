"""SEPIN@k, separated informativeness of feature dimensions (Do & Tran, 2020), under a Gaussian
model, in two forms (docs/metrics.md, "SEPIN@k"):

* **about the input x** (:func:`sepin_input_scores`, :func:`sepin_input_at_k`): the quantity the NCL
  paper reports, I(x; z_i | z_≠i), estimated from V ≥ 2 augmented views of each image, the
  augmentation acting as the encoder's noise q(z | x);
* **about the label y** (:func:`sepin_label_scores`, :func:`sepin_label_at_k`; the older names
  :func:`sepin_scores` and :func:`sepin_at_k` are the same functions): I(y; z_i | z_≠i), computable
  from a features file alone, another quantity.

Both are the same computation with a different grouping of the rows: by class, or by source image.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._numerics import CHUNK_BYTES, downscale_exponent, scaled
from .inputs import EvalError, needs_labels, validate_features

__all__ = [
    "sepin_at_k", "sepin_input_at_k", "sepin_input_scores", "sepin_label_at_k", "sepin_label_scores",
    "sepin_scores", "sepin_top_k",
]

_SEPIN_RIDGE = 1e-6


def _inverse_diagonal(chol: torch.Tensor) -> torch.Tensor:
    """diag(Σ⁻¹) from the Cholesky factor L of Σ: Σ⁻¹ = L⁻ᵀL⁻¹, so (Σ⁻¹)_ii = Σ_k (L⁻¹)_ki².
    (A triangular solve; ``torch.cholesky_inverse`` is ~20x slower on CPU.)"""
    eye = torch.eye(chol.shape[0], dtype=chol.dtype)
    inv_l = torch.linalg.solve_triangular(chol, eye, upper=False)
    return (inv_l * inv_l).sum(dim=0)


def _gaussian_info_sep(
    f: torch.Tensor, groups: torch.Tensor, within_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """INFO_i = I(g; z_i) and SEP_i = I(g; z) − I(g; z_≠i) in nats for the grouping ``groups`` (N,) of
    the rows of ``f`` (N, D), under the shared-covariance Gaussian model: Σ_T the total covariance
    (1/N), Σ_W the pooled within-group covariance (1/N, times ``within_scale``), each plus the ridge
    1e-6 · mean(diag Σ_T) · I; INFO_i = ½ log(Σ_T[i,i] / Σ_W[i,i]), SEP_i = ½ log((Σ_W⁻¹)[i,i] /
    (Σ_T⁻¹)[i,i]), both clamped at 0. Zero-variance dims get 0."""
    n, d = f.shape
    if f.dtype == torch.float64:  # the ratios below do not depend on a common scale of F
        f = scaled(f, downscale_exponent(float(f.abs().max()), 4 * n, torch.float64, power=2))
    _, inverse, sizes = torch.unique(groups, return_inverse=True, return_counts=True)  # type: ignore[arg-type]
    weights = sizes.to(torch.float64) / n
    # float64 moments accumulated in row chunks (no full float64 copy of F), about a shift close
    # to the mean so that the second moment minus the squared mean does not cancel badly
    shift = f[: min(n, 1024)].to(torch.float64).mean(dim=0)
    second = torch.zeros(d, d, dtype=torch.float64)
    class_sums = torch.zeros(sizes.numel(), d, dtype=torch.float64)
    step = max(1, CHUNK_BYTES // (8 * d))
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
    sigma_w = (sigma_t - sigma_b) * within_scale
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
    t_chol, err = torch.linalg.cholesky_ex(sigma_t)
    if int(err) != 0:
        evals, evecs = torch.linalg.eigh(sigma_t)
        t_chol = torch.linalg.cholesky((evecs * evals.clamp_min(ridge)) @ evecs.T)
    sep_k = 0.5 * torch.log(_inverse_diagonal(w_chol) / _inverse_diagonal(t_chol))
    keep_np = keep.numpy()
    info[keep_np] = info_k.clamp_min(0).numpy()
    sep[keep_np] = sep_k.clamp_min(0).numpy()
    return info, sep


def sepin_top_k(info: np.ndarray, sep: np.ndarray, k: int | str | None) -> float:
    """SEPIN@k from per-dim scores (D,) of either estimator: the mean of ``sep`` over the k dims of
    largest ``info`` (ties: lower index); ``None`` / ``"all"``: all D. k outside 1..D: EvalError."""
    d = info.shape[0]
    if k is None or k == "all":
        k = d
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise EvalError(f"SEPIN k must be a positive integer or 'all'; got {k!r}")
    if not 0 < int(k) <= d:
        raise EvalError(f"SEPIN k must be in 1..{d} (the feature dimension); got {k}")
    order = np.argsort(-info, kind="stable")[: int(k)]
    return float(sep[order].mean())


def sepin_label_scores(features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Label-based per-dim informativeness INFO_i = I(y; z_i) and separated informativeness
    SEP_i = I(y; z_i | z_≠i) = I(y; z) − I(y; z_≠i), both (D,) in nats, for features (N, D) and class
    labels (N,), under the shared-covariance Gaussian model of docs/metrics.md:

    * INFO_i = ½ log(Σ_T[i,i] / Σ_W[i,i]),
    * SEP_i  = ½ log((Σ_W⁻¹)[i,i] / (Σ_T⁻¹)[i,i]),

    with Σ_T the total and Σ_W the pooled within-class covariance (both 1/N), each plus the
    ridge 1e-6 · mean(diag Σ_T) · I. Dims with zero variance get INFO = SEP = 0. Not the NCL paper's
    quantity (that is about the input x: :func:`sepin_input_scores`).
    """
    needs_labels(labels, "sepin_scores")
    f, y = validate_features(features, labels)
    return _gaussian_info_sep(f, y)


def sepin_label_at_k(features: Any, labels: Any, k: int | str | None = None) -> float:
    """Label-based SEPIN@k (nats): mean of SEP_i over the k dims with the largest INFO_i (ties: lower
    index), from :func:`sepin_label_scores`. ``k=None`` or ``"all"`` averages over all D dims
    (SEPIN@all); k outside 1..D raises :class:`EvalError`. docs/metrics.md, "SEPIN@k"."""
    f, _ = validate_features(features, None)
    sepin_top_k(np.zeros(f.shape[1]), np.zeros(f.shape[1]), k)  # k checked before the work
    info, sep = sepin_label_scores(f, labels)
    return sepin_top_k(info, sep, k)


#: The names the label-based estimate had before the input-based one existed (results keep them).
sepin_scores = sepin_label_scores
sepin_at_k = sepin_label_at_k


def _views_tensor(views: Any) -> torch.Tensor:
    """``views`` (N, V, D), V ≥ 2, finite, as a float tensor; else one EvalError line."""
    t = torch.as_tensor(np.asarray(views) if not torch.is_tensor(views) else views)
    if t.ndim != 3:
        raise EvalError(f"SEPIN about the input needs views of shape (N, V, D); got {tuple(t.shape)}")
    n, v, d = t.shape
    if v < 2 or n < 2 or d < 1:
        raise EvalError(f"SEPIN about the input needs N ≥ 2 images with V ≥ 2 views each; got N={n}, V={v}")
    if not t.is_floating_point():
        t = t.to(torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise EvalError("SEPIN about the input: the views hold NaN or inf")
    return t


def sepin_input_scores(views: Any) -> tuple[np.ndarray, np.ndarray]:
    """Input-based INFO_i = I(x; z_i) and SEP_i = I(x; z_i | z_≠i) = I(x; z) − I(x; z_≠i), both (D,)
    in nats: Do & Tran's (2020) definitions, the quantity of the NCL paper's SEPIN@k.

    views: (N, V, D), the features of V ≥ 2 random augmentations of each of N images. A deterministic
    encoder has I(x; z) = ∞ on its own; the augmentation is the channel's noise: z = μ(x) + ε with
    ε ~ N(0, Σ_W) independent of x (the Gaussian model), so for any set of dims S
    I(x; z_S) = ½ log det Σ_T[S] − ½ log det Σ_W[S], with Σ_T the covariance of one view over
    images and augmentations and Σ_W the pooled within-image covariance, unbiased (1/(N(V−1))).
    INFO_i and SEP_i then follow as in :func:`sepin_label_scores` (same ridge, clamped at 0).
    Check: z = s + e with s ~ N(0, a²) per image and e ~ N(0, b²) per view gives
    INFO = −½ log(1 − r²) = ½ log(1 + a²/b²), r the correlation of z with s. Raises EvalError.
    """
    t = _views_tensor(views)
    n, v, d = t.shape
    groups = torch.arange(n).repeat_interleave(v)
    return _gaussian_info_sep(t.reshape(n * v, d), groups, within_scale=v / (v - 1))


def sepin_input_at_k(views: Any, k: int | str | None = None) -> float:
    """Input-based SEPIN@k (nats): mean of SEP_i = I(x; z_i | z_≠i) over the k dims with the largest
    INFO_i = I(x; z_i) (ties: lower index), from :func:`sepin_input_scores` on ``views`` (N, V, D).
    ``k=None`` or ``"all"``: all D dims. k outside 1..D raises :class:`EvalError`. The NCL paper
    reports this quantity ×10⁻² (ImageNet-100, SEPIN@100: CL 0.69, NCL 3.87); its estimator is not in
    the material we have, so values agree in meaning and unit, not necessarily in estimator."""
    t = _views_tensor(views)
    sepin_top_k(np.zeros(t.shape[2]), np.zeros(t.shape[2]), k)
    info, sep = sepin_input_scores(t)
    return sepin_top_k(info, sep, k)
