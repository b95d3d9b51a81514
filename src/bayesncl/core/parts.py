"""Thin ``nn.Module`` wrappers over :mod:`bayesncl.core.functional` (PAPER-NOTES §1).

``Projector`` and ``GatingHead`` hold parameters; ``NonNegative`` and ``Gate`` hold only their
settings and call the pure functions. Bad arguments raise ``ValueError`` with one line naming the
value and what was expected. Dimensions (and ``depth``) are integers: a Python or NumPy integer
(anything ``operator.index`` accepts) but not a bool or a float.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from bayesncl.core import functional as BF

__all__ = ["GATE_KINDS", "Projector", "GatingHead", "NonNegative", "Gate"]

GATE_KINDS: tuple[str, ...] = ("none", "ste", "gumbel", "soft")
"""The gate kinds accepted by :class:`Gate` (``MethodConfig.gate``)."""


def _check_dim(value: int, name: str, where: str) -> int:
    """``value`` as an ``int`` if it is an integer >= 1 (NumPy integers too, bools not)."""
    v = BF._integer(value)
    if v is None or v < 1:
        raise ValueError(f"{where}: {name}={value!r}: expected an integer >= 1")
    return v


class Projector(nn.Module):
    """Projection head: Linear(in_dim, hidden) → ReLU → Linear(hidden, out_dim).

    PAPER-NOTES §1 ("Projector"; no BatchNorm in the hidden layer). Maps h: (B, in_dim) to the
    raw projector output p: (B, out_dim). CIFAR: hidden 2048, out 256; ImageNet-100: 16384, 2048.
    Raises ValueError if a dimension is not an integer ≥ 1.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        in_dim = _check_dim(in_dim, "in_dim", "Projector")
        hidden = _check_dim(hidden, "hidden", "Projector")
        out_dim = _check_dim(out_dim, "out_dim", "Projector")
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
      Linear(hidden // 2, out_dim).

    With ``detach=True`` the input is ``sg(h)``, so the KL term and the gate's share of the
    InfoNCE gradient reach only θ (gradient isolation); ``detach=False`` is the "no detach"
    ablation. ``forward(h)`` returns ``g_θ(h) / τ``; α = σ of that (:meth:`alpha`).

    Raises ValueError if a dimension is not an integer ≥ 1, depth is not an integer in {1, 2, 3}
    (``2.0`` is not), depth 3 with hidden < 2, ``detach`` is not a bool (``True``/``False``; a
    string such as ``"no"`` is refused), or τ is not a finite number > 0.
    """

    def __init__(
        self, in_dim: int, hidden: int, out_dim: int, depth: int = 2, detach: bool = True, tau: float = 1.0
    ) -> None:
        super().__init__()
        in_dim = _check_dim(in_dim, "in_dim", "GatingHead")
        hidden = _check_dim(hidden, "hidden", "GatingHead")
        out_dim = _check_dim(out_dim, "out_dim", "GatingHead")
        d = BF._integer(depth)
        if d not in (1, 2, 3):
            raise ValueError(f"GatingHead: depth={depth!r}: expected the integer 1, 2 or 3")
        depth = d
        if depth == 3 and hidden < 2:
            raise ValueError(f"GatingHead: hidden={hidden!r}: depth 3 needs hidden >= 2 (uses hidden // 2)")
        if not isinstance(detach, bool):
            raise ValueError(f"GatingHead: detach={detach!r}: expected a bool (True or False)")
        t = BF._real(tau)
        if t is None or not (math.isfinite(t) and t > 0):
            raise ValueError(f"GatingHead: tau={tau!r}: expected a finite number > 0")
        self.depth = depth
        self.detach = detach
        self.tau = t
        layers: list[nn.Module]
        if depth == 1:
            layers = [nn.Linear(in_dim, out_dim)]
        elif depth == 2:
            layers = [nn.Linear(in_dim, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, out_dim)]
        else:
            half = hidden // 2
            layers = [
                nn.Linear(in_dim, hidden), nn.ReLU(inplace=True),
                nn.Linear(hidden, half), nn.ReLU(inplace=True),
                nn.Linear(half, out_dim),
            ]
        self.net = nn.Sequential(*layers)

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
    """Non-negativity map φ (PAPER-NOTES §1, NCL); ``kind`` ∈ :data:`functional.NONNEG_KINDS`.

    Shape-preserving; see :func:`bayesncl.core.functional.nonnegative`. Raises ValueError naming an
    unknown kind and the choices.
    """

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in BF.NONNEG_KINDS:
            raise ValueError(f"NonNegative: kind={kind!r}: expected one of {', '.join(BF.NONNEG_KINDS)}")
        self.kind = kind

    def forward(self, x: Tensor) -> Tensor:
        return BF.nonnegative(x, self.kind)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


class Gate(nn.Module):
    """Turns gate logits into ``(mask, alpha)`` (PAPER-NOTES §1); no parameters.

    ``alpha = σ(logits)`` (float32, noise-free; this is what enters the KL). ``mask`` by kind:

    - ``"ste"``: ``1[α > thr]`` forward, gradient of α (:func:`functional.ste_gate`), train and eval.
    - ``"gumbel"``: in training, ``1[y > thr]`` with STE on ``y = σ(logits + G)``, G drawn fresh per
      call with ``gumbel_noise`` (``"gumbel"``: authors' form, ``"logistic"``: binary concrete).
      In eval mode (``not self.training``) there is no noise: the mask is the hard ``1[α > thr]``
      (with an STE gradient). The logits come from :class:`GatingHead` already divided by τ_s, so
      the relaxation here uses τ = 1; this equals the paper's ``σ((logits + G)/τ_s)`` at τ_s = 1
      (the only value used) and otherwise scales the noise by τ_s relative to it.
    - ``"soft"``: ``mask = α`` in train and eval (the soft-gate ablation).
    - ``"none"``: returns ``(None, None)``, so callers may build a Gate for every method.

    Raises ValueError for an unknown kind or noise, or threshold ∉ (0, 1).
    """

    def __init__(self, kind: str, threshold: float = 0.5, gumbel_noise: str = "gumbel") -> None:
        super().__init__()
        if kind not in GATE_KINDS:
            raise ValueError(f"Gate: kind={kind!r}: expected one of {', '.join(GATE_KINDS)}")
        if not (0.0 < float(threshold) < 1.0):
            raise ValueError(f"Gate: threshold={threshold!r}: expected 0 < threshold < 1")
        if gumbel_noise not in BF.GUMBEL_NOISES:
            raise ValueError(
                f"Gate: gumbel_noise={gumbel_noise!r}: expected one of {', '.join(BF.GUMBEL_NOISES)}"
            )
        self.kind = kind
        self.threshold = float(threshold)
        self.gumbel_noise = gumbel_noise

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
            return BF.ste_gate(alpha, self.threshold), alpha
        if self.kind == "gumbel":
            mask, _ = BF.gumbel_sigmoid_gate(
                logits, tau=1.0, threshold=self.threshold, noise=self.gumbel_noise, generator=generator
            )
            return mask, alpha
        return BF.soft_gate(alpha), alpha

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, threshold={self.threshold}, gumbel_noise={self.gumbel_noise!r}"
