"""The parts a method is made of (PAPER-NOTES §1): φ, the gates, TopK, the gated features, the
projector and the gating head; pure functions plus thin ``nn.Module`` wrappers.

Registries (the allowed values of ``config``, defined here once): :data:`NONNEG` (φ by name),
:data:`GATE_KINDS`, :data:`NOISES` (the Gumbel gate's noise by name). Nothing here checks its
arguments: :func:`bayesncl.config.validate` checks every value once, before a model is built.

Shapes: ``M`` rows (samples), ``D`` the projector output width. The normalisations run in float32
with autocast disabled, whatever the input dtype, and are *safe* (:func:`safe_normalize`: an
all-zero row, whose gates are all closed, gives the zero vector and a zero gradient, not the
``1e12``-scaled gradient of ``F.normalize``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "NONNEG", "GATE_KINDS", "NOISES", "fp32_math", "safe_normalize", "rep_relu", "ste_gate", "gumbel_noise",
    "gumbel_sigmoid_gate", "soft_gate", "topk_mask", "gated_features", "eval_features", "raw_features",
    "ipw_features", "Projector", "GatingHead", "NonNegative", "Gate", "Prevalence"
]

_NORM_EPS = 1e-12


@contextlib.contextmanager
def fp32_math(device: torch.device) -> Iterator[None]:
    """Disable autocast on ``device`` so that the enclosed maths really runs in float32."""
    try:
        ctx = torch.autocast(device_type=device.type, enabled=False)
    except (RuntimeError, ValueError):  # a device type without autocast support
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def safe_normalize(x: Tensor, eps: float = _NORM_EPS) -> Tensor:
    """L2-normalise the rows of ``x``; rows with norm ≤ ``eps`` become exactly zero.

    x: (M, D) any float dtype. Returns (M, D) float32 unit rows (or zero rows). The gradient of a
    zero row is zero (the normalisation is not differentiable there; we take zero, as ReLU does
    at 0), so an all-zero row gives a zero row and a zero gradient, with no ``1/eps`` blow-up.
    Finite input never gives NaN, forward or backward (a row whose float32 sum of squares
    overflows, entries beyond ~1e19, comes out as zeros). A row holding a NaN or an infinity
    comes out holding NaN (forward and backward), so that a diverging model shows up as a
    non-finite loss.
    """
    with fp32_math(x.device):
        x = x.float()
        sq = (x * x).sum(dim=1, keepdim=True)
        ok = ~(sq <= eps * eps)  # a NaN row is "ok": it is divided by its NaN norm and stays NaN
        norm = torch.sqrt(torch.where(ok, sq, torch.ones_like(sq)))
        return torch.where(ok, x / norm, torch.zeros_like(x))


def self_mask(rows: int, width: int, offset: int, device: torch.device) -> Tensor:
    """(rows, width) bool, True exactly at (i, offset + i): each local row's own column among the
    (gathered) keys, which the contrastive losses exclude. Built by comparing two ``arange``s: the
    ``mask[i, offset + i] = True`` of before was an ``index_put_`` that synchronised with the host
    on CUDA (gpu_check, 2026-12-04). Raises ValueError if the rows do not fit: ``offset`` outside
    ``0 .. width - rows``."""
    if not 0 <= offset <= width - rows:  # shapes only: no synchronisation
        raise ValueError(f"offset={offset} puts the {rows} local rows outside the {width} keys")
    local = torch.arange(rows, device=device) + offset
    return torch.arange(width, device=device)[None, :] == local[:, None]


# ----------------------------------------------------------------------------- φ
def rep_relu(x: Tensor) -> Tensor:
    """Reparameterised ReLU (NCL; PAPER-NOTES §1): forward ReLU, backward GELU′.

    ``rep_relu(x) = gelu(x) − sg(gelu(x)) + sg(relu(x))``. x: any shape; returns the same shape
    and dtype, equal to ``relu(x)`` exactly, with the gradient of the (exact, erf) GELU, so that
    units with negative pre-activation still receive gradient ("dead" units revive).
    """
    g = F.gelu(x)
    return (g - g.detach()) + F.relu(x).detach()


def _identity(x: Tensor) -> Tensor:
    return x


NONNEG: dict[str, Callable[[Tensor], Tensor]] = {
    "identity": _identity,  # plain CL
    "relu": F.relu,  # the ImageNet-100 default
    "rep_relu": rep_relu,  # the CIFAR default
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "softplus": F.softplus,
    "exp": torch.exp,
    "leaky_relu": functools.partial(F.leaky_relu, negative_slope=0.01),
}
"""The non-negativity maps φ by name (``method.nonneg``; PAPER-NOTES §1, NCL). Each keeps its
input's shape. ``gelu`` and ``leaky_relu`` (slope 0.01) can be slightly negative; they are here
because the authors' code has them."""


# ----------------------------------------------------------------------------- gates
GATE_KINDS: tuple[str, ...] = ("none", "ste", "gumbel", "soft")
"""The gate kinds :class:`Gate` implements (``method.gate``)."""


def ste_gate(alpha: Tensor, threshold: float = 0.5) -> Tensor:
    """Straight-through hard gate: ``m = 1[α > thr] + α − sg(α)`` (PAPER-NOTES §1, "STE gate").

    alpha: (M, D) gate probabilities; threshold in (0, 1). Returns (M, D) in alpha's dtype whose
    forward value is exactly the hard mask ``1[α > thr]`` (0 or 1) and whose gradient w.r.t. α is
    the identity.
    """
    hard = (alpha > threshold).to(alpha.dtype)
    return hard + (alpha - alpha.detach())  # the bracket is exactly 0 in the forward pass


def _gumbel(u: Tensor) -> Tensor:
    return -torch.log(-torch.log(u + 1e-4) + 1e-4)


def _logistic(u: Tensor) -> Tensor:
    u = u.clamp(1e-6, 1.0 - 1e-6)
    return torch.log(u) - torch.log1p(-u)


NOISES: dict[str, Callable[[Tensor], Tensor]] = {"gumbel": _gumbel, "logistic": _logistic}
"""The Gumbel gate's noise by name (``method.gumbel_noise``), a function of ``u ~ U(0, 1)``:

- ``"gumbel"`` (the authors' code): one Gumbel sample ``G = −log(−log(u + 1e-4) + 1e-4)``;
  mean ≈ 0.5772 (Euler–Mascheroni), variance ≈ π²/6.
- ``"logistic"`` (the textbook binary concrete / Gumbel-sigmoid of Maddison et al. and Jang
  et al., a difference of two Gumbels): ``L = log u − log(1 − u)`` with u clamped to
  ``[1e-6, 1 − 1e-6]``; mean 0, variance π²/3."""


def gumbel_noise(
    shape: torch.Size | tuple[int, ...], noise: str = "gumbel", *, device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Float32 noise of ``shape`` for :func:`gumbel_sigmoid_gate`: ``NOISES[noise]`` of a uniform
    draw. ``generator`` must live on ``device``."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return NOISES[noise](u)


def gumbel_sigmoid_gate(
    logits: Tensor, tau: float = 1.0, threshold: float = 0.5, noise: str = "gumbel",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Stochastic hard gate: ``y = σ((logits + G)/τ)``, ``m = 1[y > thr]`` with STE on y.

    PAPER-NOTES §1 ("Gumbel-Sigmoid gate"). logits: (M, D) raw gate logits (:class:`Gate` undoes
    ``GatingHead``'s division by τ_s); tau: relaxation temperature τ > 0; threshold in (0, 1);
    noise: a key of :data:`NOISES`; generator: optional, on logits' device, for reproducible noise.

    Returns ``(mask, y)``, both (M, D) float32: ``mask`` is exactly 0/1 in the forward pass with
    the gradient of ``y``; ``y`` is the relaxed sample.
    """
    with fp32_math(logits.device):
        g = gumbel_noise(logits.shape, noise, device=logits.device, generator=generator)
        y = torch.sigmoid((logits.float() + g) / tau)
        return ste_gate(y, threshold), y


def soft_gate(alpha: Tensor) -> Tensor:
    """Soft gate ablation: ``m = α`` (PAPER-NOTES §1). alpha: (M, D); returns it unchanged."""
    return alpha


# ----------------------------------------------------------------------------- TopK, features
def topk_mask(z: Tensor, k: int) -> Tensor:
    """TopK baseline: keep the ``k`` largest entries of each row of z, zero the rest.

    PAPER-NOTES §1 ("TopK baseline", k = round(ρ·D), 1 ≤ k ≤ D). z: (M, D). Returns (M, D) in z's
    dtype; the gradient flows to the kept entries only. Ties at the k-th value are broken by
    ``torch.topk`` (exactly k entries are kept).
    """
    idx = z.detach().topk(k, dim=1).indices
    keep = torch.zeros_like(z, dtype=torch.bool).scatter_(1, idx, True)
    return z * keep.to(z.dtype)


def gated_features(z: Tensor, mask: Tensor) -> Tensor:
    """Gated features ``z̃ = normalize(normalize(z) ⊙ m)`` (PAPER-NOTES §1, "Gated features").

    z: (M, D) non-negative projector outputs; mask: (M, D) gate (hard 0/1 with STE, soft α, or
    bool). Returns (M, D) float32 unit rows. A row whose open gates carry nothing (all gates
    closed, or z zero on every open dim) is the zero vector, with a zero gradient (see
    :func:`safe_normalize`): no NaN forward or backward for finite input (a NaN or infinite
    entry in z or mask makes its row NaN).
    """
    with fp32_math(z.device):
        return safe_normalize(safe_normalize(z) * mask.float())


def eval_features(z: Tensor, mask: Tensor | None = None) -> Tensor:
    """Evaluation features (PAPER-NOTES §3): ``normalize(z)`` without a gate, else
    :func:`gated_features`. z: (M, D); mask: (M, D) or None. Returns (M, D) float32."""
    return safe_normalize(z) if mask is None else gated_features(z, mask)


def raw_features(z: Tensor, mask: Tensor | None) -> Tensor:
    """The features of a loss that does its own scaling (the spectral loss, CE's classifier, a
    method's own heads): ``z ⊙ m`` with a gate (the mask's straight-through gradient reaches the
    gating head), z itself without one; not L2-normalised. z: (M, D) after φ and TopK; mask: (M, D)
    or None. Returns (M, D) in z's dtype."""
    return z if mask is None else z * mask.to(z.dtype)


def ipw_features(z: Tensor, weights: Tensor) -> Tensor:
    """The features of the inverse-prevalence similarity (Definition 4.4): ``normalize(z ⊙ w)``.

    z: (M, D); weights: (D,) positive, ``π^(-1/2)`` (detached here: no gradient reaches π).
    Returns (M, D) float32 unit rows (zero rows stay zero, as :func:`safe_normalize`)."""
    with fp32_math(z.device):
        return safe_normalize(z.float() * weights.detach().float())


# ----------------------------------------------------------------------------- modules
class Projector(nn.Module):
    """Projection head: Linear(in_dim, hidden) → ReLU → Linear(hidden, out_dim).

    PAPER-NOTES §1 ("Projector"; no BatchNorm in the hidden layer). Maps h: (B, in_dim) to the
    raw projector output p: (B, out_dim). CIFAR: hidden 2048, out 256; ImageNet-100: 16384, 2048.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim))

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, in_dim) → p: (B, out_dim)."""
        return self.net(h)


class GatingHead(nn.Module):
    """Gating head g_θ: an MLP on the (detached) backbone feature, returning logits / τ_s.

    PAPER-NOTES §1 ("Gating head"):

    - depth 1: Linear(in_dim, out_dim);
    - depth 2 (the paper's choice): Linear(in_dim, hidden) → ReLU → Linear(hidden, out_dim);
    - depth 3: Linear(in_dim, hidden) → ReLU → Linear(hidden, hidden // 2) → ReLU →
      Linear(hidden // 2, out_dim) (hidden ≥ 2).

    With ``detach=True`` the input is ``sg(h)``, so the KL term and the gate's share of the
    InfoNCE gradient reach only θ (gradient isolation); ``detach=False`` is the "no detach"
    ablation. ``forward(h)`` returns ``g_θ(h) / τ`` (τ > 0); α = σ of that (:meth:`alpha`).
    """

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, depth: int = 2, detach: bool = True, tau: float = 1.0
    ) -> None:
        super().__init__()
        self.depth = depth
        self.detach = detach
        self.tau = tau
        widths = [in_dim, hidden, hidden // 2][:depth] + [out_dim]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        self.net = nn.Sequential(*layers[:-1])  # no ReLU after the last layer

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, in_dim) backbone features → gate logits (B, out_dim), already divided by τ."""
        if self.detach:
            h = h.detach()
        out = self.net(h)
        return out if self.tau == 1.0 else out / self.tau

    def alpha(self, h: Tensor) -> Tensor:
        """Noise-free gate probabilities α = σ(g_θ(h) / τ): (B, out_dim) float32 in (0, 1)."""
        return torch.sigmoid(self(h).float())

    def extra_repr(self) -> str:
        return f"depth={self.depth}, detach={self.detach}, tau={self.tau}"


class NonNegative(nn.Module):
    """Non-negativity map φ = ``NONNEG[kind]`` (PAPER-NOTES §1, NCL); shape-preserving."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor:
        return NONNEG[self.kind](x)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


class Gate(nn.Module):
    """Turns gate logits into ``(mask, alpha)`` (PAPER-NOTES §1); no parameters.

    ``alpha = σ(logits)`` (float32, noise-free; this is what enters the KL). ``mask`` by kind
    (:data:`GATE_KINDS`), with threshold in (0, 1):

    - ``"ste"``: ``1[α > thr]`` forward, gradient of α (:func:`ste_gate`), train and eval.
    - ``"gumbel"``: in training, ``1[y > thr]`` with STE on ``y = σ((l + G)/τ_s)``, where
      ``l = τ_s · logits`` is the head's raw output (:class:`GatingHead` returns ``l / τ_s``) and G
      is drawn fresh per call from ``NOISES[gumbel_noise]`` (``"gumbel"``: authors' form,
      ``"logistic"``: binary concrete); the noise is divided by τ_s too, as in the authors' code
      (bayesncl_helper_functions.py:29). In eval mode (``not self.training``) there is no noise:
      the mask is the hard ``1[α > thr]`` (with an STE gradient).
    - ``"soft"``: ``mask = α`` in train and eval (the soft-gate ablation).
    - ``"none"``: returns ``(None, None)``, so callers may build a Gate for every method.
    """

    def __init__(
        self, kind: str, threshold: float = 0.5, gumbel_noise: str = "gumbel", tau: float = 1.0
    ) -> None:
        super().__init__()
        self.kind = kind
        self.threshold = threshold
        self.gumbel_noise = gumbel_noise
        self.tau = tau

    def forward(
        self, logits: Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor] | tuple[None, None]:
        """logits: (B, D) → ``(mask, alpha)``, both (B, D) float32 (or ``(None, None)`` for "none").

        ``generator`` (on logits' device) makes the Gumbel noise reproducible; other kinds ignore it.
        """
        if self.kind == "none":
            return None, None
        alpha = torch.sigmoid(logits.float())
        if self.kind == "ste" or (self.kind == "gumbel" and not self.training):
            return ste_gate(alpha, self.threshold), alpha
        if self.kind == "gumbel":
            mask, _ = gumbel_sigmoid_gate(
                logits * self.tau, tau=self.tau, threshold=self.threshold, noise=self.gumbel_noise,
                generator=generator,
            )
            return mask, alpha
        return soft_gate(alpha), alpha

    def extra_repr(self) -> str:
        noise = f"gumbel_noise={self.gumbel_noise!r}, tau={self.tau}"
        return f"kind={self.kind!r}, threshold={self.threshold}, {noise}"


class Prevalence(nn.Module):
    """π, the prevalence of each feature of z (Definition 4.4's π_k), for ``method.ipw``.

    A registered buffer ``pi`` (D,) float32, starting at 1 (uniform: the loss is then NCL's
    exactly), saved in checkpoints so that a resumed run continues bit-identically. Each training
    forward :meth:`update` s it with the batch activation frequency f_k = #{rows with z_k > 0} / M:
    ``π ← m·π + (1 − m)·f`` (averaged over processes under torch.distributed, so every rank holds
    the same π). :meth:`weights` gives ``max(π, ε)^(-1/2)``, the per-dimension scale that turns the
    cosine of InfoNCE into the inverse-prevalence similarity ``Σ_k z_k z'_k / π_k`` before the
    normalisation. No gradient flows into π (a buffer, updated under ``no_grad``).
    """

    pi: Tensor

    def __init__(self, dim: int, momentum: float = 0.99, eps: float = 0.01) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("pi", torch.ones(dim))

    @torch.no_grad()
    def update(self, z: Tensor) -> None:
        """z: (M, D) non-negative features of one batch (both views)."""
        freq = (z.detach() > 0).float().mean(0)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(freq)
            freq /= torch.distributed.get_world_size()
        self.pi.mul_(self.momentum).add_(freq, alpha=1.0 - self.momentum)

    def weights(self) -> Tensor:
        """(D,) float32 ``max(π, ε)^(-1/2)``, detached."""
        return self.pi.detach().clamp_min(self.eps).rsqrt()

    def extra_repr(self) -> str:
        return f"dim={self.pi.numel()}, momentum={self.momentum}, eps={self.eps}"
