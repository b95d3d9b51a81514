"""SEPIN@k, separated informativeness of feature dimensions: a label-based Gaussian estimate
(Do & Tran, 2020; used by Wang et al., 2024; docs/metrics.md, "SEPIN@k")."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._numerics import CHUNK_BYTES, downscale_exponent, scaled
from .inputs import EvalError, needs_labels, validate_features

__all__ = ["sepin_at_k", "sepin_scores"]

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
    needs_labels(labels, "sepin_scores")
    f, y = validate_features(features, labels)
    n, d = f.shape
    if f.dtype == torch.float64:  # the ratios below do not depend on a common scale of F
        f = scaled(f, downscale_exponent(float(f.abs().max()), 4 * n, torch.float64, power=2))
    _, inverse, sizes = torch.unique(y, return_inverse=True, return_counts=True)  # type: ignore[arg-type]
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
