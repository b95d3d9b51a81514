"""Overflow-safe row norms and power-of-two rescaling, so that no metric depends on the scale of F.

Float32 features of magnitude ~1e19 and above overflow a sum of squares. :func:`row_norms` and
:func:`normalize_rows` divide an overflowing row by its max-abs first; :func:`downscale_exponent`
gives a power of two to divide a whole matrix by before a sum or a product (exact in binary floating
point, so results equal the original's bit for bit wherever it did not overflow). Rows and matrices
that do not overflow take the plain path, unchanged.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "CHUNK_BYTES", "EPS", "NORM_EPS", "downscale_exponent", "magnitudes", "normalize_rows", "row_norms",
    "scaled",
]

#: The activation threshold of PAPER-NOTES §3 (and of the authors' evaluation code).
EPS = 1e-5
#: ``F.normalize``'s floor on the norm: x / max(‖x‖, 1e-12).
NORM_EPS = 1e-12
#: Bytes of one float64 block of rows or columns that the metrics accumulate over (64 MiB).
CHUNK_BYTES = 64 << 20


def magnitudes(f: torch.Tensor) -> torch.Tensor:
    """|F|, without a copy when F is already non-negative (the NCL/BayesNCL case)."""
    return f if bool(f.min() >= 0) else f.abs()


def row_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of every row of the (N, D) ``x`` as an (N, 1) float64 tensor, never inf for finite x.

    Rows whose norm overflows ``x``'s dtype are recomputed as max|x_n| · ‖x_n / max|x_n|‖ in float64.
    """
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    bad = ~torch.isfinite(norms).flatten()
    norms = norms.to(torch.float64)
    if bool(bad.any()):
        sub = x[bad].to(torch.float64)
        peak = sub.abs().amax(dim=1, keepdim=True)
        norms[bad] = peak * torch.linalg.vector_norm(sub / peak, dim=1, keepdim=True)
    return norms


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """x_n / max(‖x_n‖, 1e-12) for every row of the (N, D) ``x``, in ``x``'s dtype (a new tensor).

    A zero row stays zero. A row whose norm overflows is divided by its max-abs first, so a row
    of 1e38 normalises like a row of 1 (``torch.nn.functional.normalize`` would return zeros).
    """
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    out = x / norms.clamp_min(NORM_EPS)
    bad = ~torch.isfinite(norms).flatten()
    if bool(bad.any()):
        sub = x[bad]
        sub = sub / sub.abs().amax(dim=1, keepdim=True)
        out[bad] = sub / torch.linalg.vector_norm(sub, dim=1, keepdim=True)
    return out


def downscale_exponent(peak: float, terms: int, dtype: torch.dtype, power: int = 1) -> int:
    """The ``e`` to divide values of magnitude up to ``peak`` by (as 2**e) so that a sum of
    ``terms`` of their ``power``-th powers fits ``dtype`` with a margin; 0 when it already does.

    After the division the largest magnitude lies in [0.5, 1).
    """
    if not peak > 0 or not math.isfinite(peak):
        return 0
    limit = torch.finfo(dtype).max / 16
    if math.log2(peak) * power + math.log2(max(1, terms)) < math.log2(limit):
        return 0
    return math.frexp(peak)[1]


def scaled(x: torch.Tensor, exponent: int) -> torch.Tensor:
    """``x / 2**exponent`` (exact), or ``x`` itself when ``exponent`` is 0."""
    return x if exponent == 0 else torch.ldexp(x, torch.tensor(-exponent, dtype=torch.int32))
