"""The mathematical core of NCL and BayesNCL as pure functions (no state, no modules).

Shapes use ``n`` for the number of positive pairs on this process, ``N`` for all processes,
``D`` for the projector output width and ``M`` for any number of samples. Sources are given as
PAPER-NOTES sections (``/work/shared/PAPER-NOTES.md``), which summarise the BayesNCL paper
(gating, KL prior) and the NCL paper (non-negativity, rep_relu).

Numerics: the loss and the KL are computed in float32 with autocast disabled, whatever the input
dtype (fp16 NaNs are a known failure in this field). Normalisation is *safe*: a row whose L2 norm
is at most ``1e-12`` (in practice, an all-zero row such as one whose gates are all closed) maps to
the zero vector and passes back a zero gradient. ``F.normalize`` would instead divide such a row
by its ``eps`` and send a gradient scaled by ``1e12`` into the gate and the backbone. A row
holding a NaN or an infinity is not masked: it stays non-finite, so the loss becomes NaN and the
training loop stops on it.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "NONNEG_KINDS",
    "GUMBEL_NOISES",
    "safe_normalize",
    "info_nce",
    "bernoulli_kl",
    "ste_gate",
    "gumbel_noise",
    "gumbel_sigmoid_gate",
    "soft_gate",
    "topk_mask",
    "rep_relu",
    "nonnegative",
    "gated_features",
    "eval_features",
]

NONNEG_KINDS: tuple[str, ...] = (
    "identity", "relu", "rep_relu", "gelu", "sigmoid", "softplus", "exp", "leaky_relu",
)
"""The non-negativity maps φ accepted by :func:`nonnegative` (PAPER-NOTES §1)."""

GUMBEL_NOISES: tuple[str, ...] = ("gumbel", "logistic")
"""The noise forms accepted by :func:`gumbel_sigmoid_gate`."""

_NORM_EPS = 1e-12


@contextlib.contextmanager
def _fp32(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` so that the enclosed maths really runs in float32."""
    try:
        ctx = torch.autocast(device_type=device.type, enabled=False)
    except (RuntimeError, ValueError):  # a device type without autocast support
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def _real(value: object) -> float | None:
    """``float(value)`` for a real number (a Python or NumPy scalar, or a 0-d real tensor), None for
    anything else (a bool, a string, a sequence). A 0-d CUDA tensor costs a host sync."""
    if isinstance(value, torch.Tensor):
        ok = value.ndim == 0 and value.dtype != torch.bool and not value.is_complex()
        return float(value) if ok else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _integer(value: object) -> int | None:
    """``operator.index(value)`` for an integer (Python, NumPy or a 0-d integer tensor; not a bool),
    None for anything else (a float, a string)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _check_threshold(threshold: float, where: str) -> None:
    t = _real(threshold)
    if t is None or not (0.0 < t < 1.0):
        raise ValueError(f"{where}: threshold={threshold!r}: expected 0 < threshold < 1")


def _check_2d(x: Tensor, name: str, where: str) -> None:
    if x.ndim != 2:
        raise ValueError(f"{where}: {name} must be 2-D (rows, dims), got shape {tuple(x.shape)}")


def safe_normalize(x: Tensor, eps: float = _NORM_EPS) -> Tensor:
    """L2-normalise the rows of ``x``; rows with norm ≤ ``eps`` become exactly zero.

    x: (M, D) any float dtype. Returns (M, D) float32 unit rows (or zero rows). The gradient of a
    zero row is zero (the normalisation is not differentiable there; we take zero, as ReLU does
    at 0), so an all-zero row gives a zero row and a zero gradient, with no ``1/eps`` blow-up.
    Finite input never gives NaN, forward or backward (a row whose float32 sum of squares
    overflows, entries beyond ~1e19, comes out as zeros). A row holding a NaN or an infinity
    comes out holding NaN (forward and backward), so that a diverging model shows up as a
    non-finite loss. Raises ValueError if ``x`` is not 2-D.
    """
    _check_2d(x, "x", "safe_normalize")
    with _fp32(x.device):
        x = x.float()
        sq = (x * x).sum(dim=1, keepdim=True)
        ok = ~(sq <= eps * eps)  # a NaN row is "ok": it is divided by its NaN norm and stays NaN
        norm = torch.sqrt(torch.where(ok, sq, torch.ones_like(sq)))
        return torch.where(ok, x / norm, torch.zeros_like(x))


def info_nce(z: Tensor, temperature: float = 0.2, *, keys: Tensor | None = None, offset: int = 0) -> Tensor:
    """NT-Xent (InfoNCE over 2n views with cosine similarity), mean over the 2n local rows.

    PAPER-NOTES §1 ("Loss"); SimCLR's NT-Xent. For local row ``i`` (query ``q_i = ẑ_i``, rows
    L2-normalised with :func:`safe_normalize`) and keys ``k_j`` (also normalised)::

        loss_i = −log( exp(q_i·k_pos/T) / Σ_{j ≠ self} exp(q_i·k_j/T) )

    computed as ``cross_entropy`` over logits with the self-similarity set to −inf, in float32.

    Args:
        z: (2n, D) local views laid out ``[view1; view2]``: rows ``i`` and ``i+n`` are a positive
            pair. Any float dtype; cast to float32. All-zero rows (all gates closed) are allowed:
            they have similarity 0 to everything, and a finite loss and gradient.
        temperature: T > 0 (dimensionless); 0.2 in the paper. A Python or NumPy scalar or a 0-d
            tensor (read with ``float()``, a host sync for a CUDA tensor).
        keys: (2N, D) every view of the global batch, e.g. gathered over ranks with an
            autograd-aware all-gather, each rank's block laid out ``[view1; view2]``. Defaults to
            ``z`` (single process). Rows ``keys[offset : offset + 2n]`` must be this process's
            ``z``; this is not checked (it would cost a comparison per step).
        offset: the row of ``z[0]`` inside ``keys`` (``rank * 2n`` for equal per-rank batches); an
            integer (a NumPy integer is accepted, a bool or a float is not).
            Local row ``i``'s self-similarity is masked at column ``offset + i``; its positive is
            column ``offset + (i + n) mod 2n``.

    Returns:
        A 0-d float32 tensor (nats). With n = 1 and no other keys each row has only its positive,
        so the loss is exactly 0; use n ≥ 2 (or gathered keys) for a meaningful loss.

    Raises:
        ValueError: if ``z`` is not 2-D, has an odd or zero row count, if ``temperature`` is not
            a finite positive number, if ``keys`` has another width than ``z``, if ``offset`` is
            not an integer, or if it does not place the 2n local rows inside ``keys`` (or is
            non-zero without ``keys``).

    A NaN or infinite entry in ``z`` or ``keys`` makes the loss NaN (see :func:`safe_normalize`).
    """
    _check_2d(z, "z", "info_nce")
    two_n, d = z.shape
    if two_n < 2 or two_n % 2:
        raise ValueError(
            f"info_nce: z must have an even number >= 2 of rows laid out [view1; view2], got {two_n}"
        )
    t = _real(temperature)
    if t is None or not (math.isfinite(t) and t > 0):
        raise ValueError(f"info_nce: temperature={temperature!r}: expected a finite number > 0")
    off = _integer(offset)
    if off is None:
        raise ValueError(f"info_nce: offset={offset!r}: expected an integer (the row of z[0] in keys)")
    offset = off
    if keys is None:
        if offset != 0:
            raise ValueError(f"info_nce: offset={offset!r} needs keys (it is the row of z[0] in keys)")
    else:
        _check_2d(keys, "keys", "info_nce")
        if keys.shape[1] != d:
            raise ValueError(f"info_nce: keys has width {keys.shape[1]} but z has width {d}")
        if not (offset >= 0 and offset + two_n <= keys.shape[0]):
            raise ValueError(
                f"info_nce: offset={offset!r}: the {two_n} local rows must lie inside keys' "
                f"{keys.shape[0]} rows"
            )
    n = two_n // 2
    with _fp32(z.device):
        q = safe_normalize(z)
        k = q if keys is None else safe_normalize(keys)
        logits = (q @ k.T) / t
        rows = torch.arange(two_n, device=z.device)
        self_mask = torch.zeros_like(logits, dtype=torch.bool)
        self_mask[rows, offset + rows] = True
        logits = logits.masked_fill(self_mask, float("-inf"))
        targets = offset + (rows + n) % two_n
        return F.cross_entropy(logits, targets)


def bernoulli_kl(alpha: Tensor, rho: float, eps: float = 0.01) -> Tensor:
    """KL(Bern(α) ‖ Bern(ρ)) summed over dims, averaged over rows (nats), in float32.

    PAPER-NOTES §1 ("Loss"): ``Σ_k [α_k log(α_k/ρ) + (1−α_k) log((1−α_k)/(1−ρ))]`` with α and ρ
    clamped to ``[eps, 1−eps]`` first, as the authors do (so the value is finite at α ∈ {0, 1}, and
    the gradient is zero where α lies outside the clamp range).

    Args:
        alpha: (M, D) gate probabilities, noise-free σ(logits), in [0, 1], M ≥ 1. Any float
            dtype. NaN entries are allowed and make the result NaN.
        rho: the prior keep probability, a number with 0 < ρ < 1.
        eps: clamp margin, a number with 0 ≤ eps < 0.5 (0.01 in the authors' code).

    Returns:
        A 0-d float32 tensor: mean over the M rows of the per-row sum over D.

    Raises:
        ValueError: if ``alpha`` is not 2-D or has no rows, if ρ or eps is not a real number
            (a bool or a string is not), if ρ ∉ (0, 1), or if eps ∉ [0, 0.5); for a CPU
            ``alpha`` also if an entry lies outside [0, 1] (e.g. logits were passed). On other
            devices the range is not checked: reading the min and max back would cost a host
            sync on every training step.
    """
    _check_2d(alpha, "alpha", "bernoulli_kl")
    if alpha.shape[0] == 0:
        raise ValueError("bernoulli_kl: alpha has 0 rows: expected at least one row to average over")
    r, e = _real(rho), _real(eps)
    if r is None or not (0.0 < r < 1.0):
        raise ValueError(f"bernoulli_kl: rho={rho!r}: expected a number with 0 < rho < 1")
    if e is None or not (0.0 <= e < 0.5):
        raise ValueError(f"bernoulli_kl: eps={eps!r}: expected a number with 0 <= eps < 0.5")
    if alpha.device.type == "cpu" and alpha.numel():
        lo, hi = (float(v) for v in torch.aminmax(alpha.detach()))
        if lo < 0.0 or hi > 1.0:  # False for NaN: a NaN alpha gives a NaN KL instead
            raise ValueError(
                f"bernoulli_kl: alpha holds values in [{lo:.4g}, {hi:.4g}]: expected probabilities "
                "in [0, 1] (sigmoid of the gate logits, not the logits)"
            )
    with _fp32(alpha.device):
        a = alpha.float().clamp(e, 1.0 - e)
        r = min(max(r, e), 1.0 - e)
        kl = a * torch.log(a / r) + (1.0 - a) * torch.log((1.0 - a) / (1.0 - r))
        return kl.sum(dim=1).mean()


def ste_gate(alpha: Tensor, threshold: float = 0.5) -> Tensor:
    """Straight-through hard gate: ``m = 1[α > thr] + α − sg(α)`` (PAPER-NOTES §1, "STE gate").

    alpha: (M, D) gate probabilities. Returns (M, D) in alpha's dtype whose forward value is
    exactly the hard mask ``1[α > thr]`` (0 or 1) and whose gradient w.r.t. α is the identity.
    Raises ValueError if threshold ∉ (0, 1).
    """
    _check_threshold(threshold, "ste_gate")
    hard = (alpha > threshold).to(alpha.dtype)
    return hard + (alpha - alpha.detach())  # the bracket is exactly 0 in the forward pass


def gumbel_noise(
    shape: torch.Size | tuple[int, ...],
    noise: str = "gumbel",
    *,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw the float32 noise used by :func:`gumbel_sigmoid_gate`, from ``u ~ U(0, 1)``.

    - ``"gumbel"`` (the authors' code): one Gumbel sample ``G = −log(−log(u + 1e-4) + 1e-4)``;
      mean ≈ 0.5772 (Euler–Mascheroni), variance ≈ π²/6.
    - ``"logistic"`` (the textbook binary concrete / Gumbel-sigmoid of Maddison et al. and Jang
      et al., a difference of two Gumbels): ``L = log u − log(1 − u)`` with u clamped to
      ``[1e-6, 1 − 1e-6]``; mean 0, variance π²/3.

    ``generator`` must live on ``device``. Raises ValueError for an unknown ``noise``.
    """
    if noise not in GUMBEL_NOISES:
        raise ValueError(f"gumbel_noise: noise={noise!r}: expected one of {', '.join(GUMBEL_NOISES)}")
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    if noise == "gumbel":
        return -torch.log(-torch.log(u + 1e-4) + 1e-4)
    u = u.clamp(1e-6, 1.0 - 1e-6)
    return torch.log(u) - torch.log1p(-u)


def gumbel_sigmoid_gate(
    logits: Tensor,
    tau: float = 1.0,
    threshold: float = 0.5,
    noise: str = "gumbel",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Stochastic hard gate: ``y = σ((logits + G)/τ)``, ``m = 1[y > thr]`` with STE on y.

    PAPER-NOTES §1 ("Gumbel-Sigmoid gate"). ``noise="gumbel"`` is the authors' single Gumbel
    sample; ``noise="logistic"`` is the textbook binary concrete (see :func:`gumbel_noise`).

    Args:
        logits: (M, D) gate logits (already divided by τ_s when they come from ``GatingHead``).
        tau: relaxation temperature τ > 0.
        threshold: hard threshold in (0, 1).
        noise: ``"gumbel"`` or ``"logistic"``.
        generator: optional ``torch.Generator`` on logits' device, for reproducible noise.

    Returns:
        ``(mask, y)``, both (M, D) float32: ``mask`` is exactly 0/1 in the forward pass with the
        gradient of ``y``; ``y`` is the relaxed sample.

    Raises:
        ValueError: if τ ≤ 0, threshold ∉ (0, 1) or ``noise`` is unknown.
    """
    t = _real(tau)
    if t is None or not (math.isfinite(t) and t > 0):
        raise ValueError(f"gumbel_sigmoid_gate: tau={tau!r}: expected a finite number > 0")
    _check_threshold(threshold, "gumbel_sigmoid_gate")
    with _fp32(logits.device):
        g = gumbel_noise(logits.shape, noise, device=logits.device, generator=generator)
        y = torch.sigmoid((logits.float() + g) / t)
        return ste_gate(y, threshold), y


def soft_gate(alpha: Tensor) -> Tensor:
    """Soft gate ablation: ``m = α`` (PAPER-NOTES §1). alpha: (M, D); returns it unchanged."""
    return alpha


def topk_mask(z: Tensor, k: int) -> Tensor:
    """TopK baseline: keep the ``k`` largest entries of each row of z, zero the rest.

    PAPER-NOTES §1 ("TopK baseline", k = round(ρ·D)). z: (M, D). Returns (M, D) in z's dtype; the
    gradient flows to the kept entries only. Ties at the k-th value are broken by
    ``torch.topk`` (exactly k entries are kept). Raises ValueError if z is not 2-D or k ∉ [1, D].
    """
    _check_2d(z, "z", "topk_mask")
    d = z.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not (1 <= k <= d):
        raise ValueError(f"topk_mask: k={k!r}: expected an integer with 1 <= k <= D={d}")
    idx = z.detach().topk(k, dim=1).indices
    keep = torch.zeros_like(z, dtype=torch.bool).scatter_(1, idx, True)
    return z * keep.to(z.dtype)


def rep_relu(x: Tensor) -> Tensor:
    """Reparameterised ReLU (NCL; PAPER-NOTES §1): forward ReLU, backward GELU′.

    ``rep_relu(x) = gelu(x) − sg(gelu(x)) + sg(relu(x))``. x: any shape; returns the same shape
    and dtype, equal to ``relu(x)`` exactly, with the gradient of the (exact, erf) GELU, so that
    units with negative pre-activation still receive gradient ("dead" units revive).
    """
    g = F.gelu(x)
    return (g - g.detach()) + F.relu(x).detach()


def nonnegative(x: Tensor, kind: str) -> Tensor:
    """Apply the non-negativity map φ named ``kind`` (PAPER-NOTES §1, NCL).

    kind ∈ :data:`NONNEG_KINDS`: ``identity`` (plain CL), ``relu`` (ImageNet-100 default),
    ``rep_relu`` (CIFAR default, see :func:`rep_relu`), ``gelu``, ``sigmoid``, ``softplus``,
    ``exp``, ``leaky_relu`` (slope 0.01). ``gelu`` and ``leaky_relu`` can be slightly negative;
    they are supported because the authors' code supports them. x: any shape; shape is kept.
    Raises ValueError naming ``kind`` and the choices if it is unknown.
    """
    if kind == "identity":
        return x
    if kind == "relu":
        return F.relu(x)
    if kind == "rep_relu":
        return rep_relu(x)
    if kind == "gelu":
        return F.gelu(x)
    if kind == "sigmoid":
        return torch.sigmoid(x)
    if kind == "softplus":
        return F.softplus(x)
    if kind == "exp":
        return torch.exp(x)
    if kind == "leaky_relu":
        return F.leaky_relu(x, 0.01)
    raise ValueError(f"nonnegative: kind={kind!r}: expected one of {', '.join(NONNEG_KINDS)}")


def gated_features(z: Tensor, mask: Tensor) -> Tensor:
    """Gated features ``z̃ = normalize(normalize(z) ⊙ m)`` (PAPER-NOTES §1, "Gated features").

    z: (M, D) non-negative projector outputs; mask: (M, D) gate (hard 0/1 with STE, soft α, or
    bool). Returns (M, D) float32 unit rows. A row whose open gates carry nothing (all gates
    closed, or z zero on every open dim) is the zero vector, with a zero gradient (see
    :func:`safe_normalize`): no NaN forward or backward for finite input (a NaN or infinite
    entry in z or mask makes its row NaN). Raises ValueError if the shapes differ.
    """
    _check_2d(z, "z", "gated_features")
    if mask.shape != z.shape:
        raise ValueError(
            f"gated_features: mask shape {tuple(mask.shape)} differs from z shape {tuple(z.shape)}"
        )
    with _fp32(z.device):
        return safe_normalize(safe_normalize(z) * mask.float())


def eval_features(z: Tensor, mask: Tensor | None = None) -> Tensor:
    """Evaluation features (PAPER-NOTES §3): ``normalize(z)`` without a gate, else
    :func:`gated_features`. z: (M, D); mask: (M, D) or None. Returns (M, D) float32."""
    return safe_normalize(z) if mask is None else gated_features(z, mask)
