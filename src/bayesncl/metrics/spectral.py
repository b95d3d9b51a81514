"""Activity, sparsity, spectrum and orthogonality of features (PAPER-NOTES §3, docs/metrics.md).

Every public function takes an (N, D) ``torch.Tensor`` or ``np.ndarray`` (labels are accepted and
ignored, so that every metric has the signature ``(features, labels)``) and returns a Python
``float`` (``active_dims``: ``int``). A dimension is active when some |F_nk| > 0.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ._numerics import CHUNK_BYTES as _GRAM_CHUNK_BYTES
from ._numerics import EPS, downscale_exponent, magnitudes, scaled
from .inputs import validate_features

__all__ = [
    "activation_ratio", "active_dims", "effective_rank", "nonneg_ratio", "orthogonality", "sparsity",
    "active_mask",
    "spectral_entropy", "spectrum",
]


def active_mask(f: torch.Tensor) -> torch.Tensor:
    """(D,) bool: the active dims of a validated (N, D) tensor F."""
    # A sum of non-negative floats is 0 only if every term is 0, so float32 accumulation is exact
    # for this test.
    return magnitudes(f).sum(dim=0) > 0


def active_dims(features: Any, labels: Any = None) -> int:
    """Number of dims with mean_n |F_nk| > 0."""
    f, _ = validate_features(features, None)
    return int(active_mask(f).sum())


def activation_ratio(features: Any, labels: Any = None) -> float:
    """Active dims / D ("Act." in the BayesNCL paper's Table 1)."""
    f, _ = validate_features(features, None)
    return int(active_mask(f).sum()) / f.shape[1]


def sparsity(features: Any, labels: Any = None) -> float:
    """1 − mean(|F| > 1e-5): the fraction of entries at or below the threshold."""
    f, _ = validate_features(features, None)
    fired = int((magnitudes(f) > EPS).sum())
    return 1.0 - fired / f.numel()


def nonneg_ratio(features: Any, labels: Any = None) -> float:
    """The share of entries F_nk >= 0 (zeros count), a fraction in [0, 1]: the NCL code's logged
    ``non_neg_ratio`` (PKU-ML/non_neg ``solo/methods/simclr.py``: ``(z >= 0).float().mean()``, there
    on a training batch's z, here on the features given). 1.0 for any non-negative F."""
    f, _ = validate_features(features, None)
    return int((f >= 0).sum()) / f.numel()


# --------------------------------------------------------------------------------------------
# spectrum and orthogonality, from the float64 Gram FᵀF of the D_a active columns when D_a <= N;
# else (a wide projector) from FFᵀ (the same nonzero eigenvalues) and blocks of rows of FᵀF, so
# memory stays O(min(N, D_a)^2) plus fixed 64 MiB blocks
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
    e = _float64_exponent(f, f.shape[0])
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


def spectrum(f: torch.Tensor, active: torch.Tensor) -> tuple[float, float]:
    """``(spectral entropy (nats), orthogonality error)`` of a validated (N, D) tensor F with its
    (D,) :func:`active_mask`, from one Gram matrix: FᵀF over the active columns when D_a <= N,
    else FFᵀ for the spectrum and blocks of FᵀF for the orthogonality error."""
    if int(active.sum()) > f.shape[0]:
        return _spectral_entropy_from_gram(_gram_rows(f)), _orthogonality_blocked(f, active)
    gram = _gram_active(f, active)
    return _spectral_entropy_from_gram(gram), _orthogonality_from_gram(gram)


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
    active = active_mask(f)
    wide = int(active.sum()) > f.shape[0]  # the smaller Gram: FFᵀ has FᵀF's nonzero spectrum
    return _spectral_entropy_from_gram(_gram_rows(f) if wide else _gram_active(f, active))


def effective_rank(features: Any, labels: Any = None) -> float:
    """Effective rank exp(−Σ s̄ log s̄) (Roy & Vetterli 2007), in [1, rank F]; 0.0 for F = 0.

    This is what the ``effective_rank`` key reports; the entropy itself is :func:`spectral_entropy`.
    Memory is O(min(N, D)²), as for :func:`spectral_entropy`.
    """
    f, _ = validate_features(features, None)
    return math.exp(spectral_entropy(f)) if bool(active_mask(f).any()) else 0.0


def orthogonality(features: Any, labels: Any = None) -> float:
    """Orthogonality error: on active dims, normalise each column and return the mean of
    |F̂ᵀF̂ − I| over the off-diagonal entries (0 = orthogonal dims). 0.0 for fewer than 2 dims.

    With more active dims D_a than rows N, F̂ᵀF̂ is summed block by block (64 MiB blocks) instead
    of being built: memory O(D_a) plus the blocks, time O(N·D_a²) as before."""
    f, _ = validate_features(features, None)
    active = active_mask(f)
    if int(active.sum()) > f.shape[0]:  # no D_a x D_a matrix
        return _orthogonality_blocked(f, active)
    return _orthogonality_from_gram(_gram_active(f, active))
