"""The loss terms of NCL and BayesNCL as pure functions (PAPER-NOTES §1, "Loss").

``n``: positive pairs on this process, ``N``: on all processes, ``D``: the feature width. Both
terms are computed in float32 with autocast disabled, whatever the input dtype (fp16 NaNs are a
known failure in this field). They check nothing per call: the values they take come from a
config that :func:`bayesncl.config.validate` checked once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bayesncl.core.parts import fp32_math, ipw_features, safe_normalize, self_mask

__all__ = ["info_nce", "ipw_info_nce", "bernoulli_kl"]


def info_nce(
    z: Tensor, temperature: float = 0.2, *, keys: Tensor | None = None, offset: int = 0,
    index: Tensor | None = None, key_index: Tensor | None = None,
) -> Tensor:
    """NT-Xent (InfoNCE over 2n views with cosine similarity), mean over the 2n local rows.

    PAPER-NOTES §1 ("Loss"); SimCLR's NT-Xent. For local row ``i`` (query ``q_i = ẑ_i``, rows
    L2-normalised with :func:`~bayesncl.core.parts.safe_normalize`) and keys ``k_j`` (also
    normalised)::

        loss_i = −log( exp(q_i·k_pos/T) / Σ_{j ≠ self} exp(q_i·k_j/T) )

    computed as ``cross_entropy`` over logits with the self-similarity set to −inf, in float32.

    Args:
        z: (2n, D), n ≥ 1, local views laid out ``[view1; view2]``: rows ``i`` and ``i+n`` are a
            positive pair. Any float dtype; cast to float32. All-zero rows (all gates closed)
            are allowed: they have similarity 0 to everything, and a finite loss and gradient.
        temperature: T > 0 (dimensionless); 0.2 in the paper.
        keys: (2N, D) every view of the global batch, e.g. gathered over ranks with an
            autograd-aware all-gather, each rank's block laid out ``[view1; view2]``. Defaults to
            ``z`` (single process). Rows ``keys[offset : offset + 2n]`` must be this process's ``z``.
        offset: the integer row of ``z[0]`` inside ``keys`` (``rank * 2n`` for equal per-rank
            batches; 0 without ``keys``). Local row ``i``'s self-similarity is masked at column
            ``offset + i``; its positive is column ``offset + (i + n) mod 2n``.
        index: (2n,) integer dataset index of each local row's image. Given, row ``i``'s positives
            are all other keys of its image, ``loss_i = −log(Σ_pos e^{q_i·k_j/T} / Σ_{j≠self}
            e^{q_i·k_j/T})`` (the authors' solo/losses/simclr.py:30-37): the same as the default
            when no image appears twice in the batch, right when one does.
        key_index: (2N,) the index of each row of ``keys`` (with ``keys`` and ``index``).

    Returns:
        A 0-d float32 tensor (nats). With n = 1 and no other keys each row has only its positive,
        so the loss is exactly 0; use n ≥ 2 (or gathered keys) for a meaningful loss. A NaN or
        infinite entry in ``z`` or ``keys`` makes the loss NaN.

    Raises:
        ValueError: ``offset`` outside ``0 .. len(keys) - 2n`` (z's rows would not lie inside ``keys``).
    """
    two_n = z.shape[0]
    n = two_n // 2
    own = self_mask(two_n, two_n if keys is None else keys.shape[0], offset, z.device)
    with fp32_math(z.device):
        q = safe_normalize(z)
        k = q if keys is None else safe_normalize(keys)
        logits = (q @ k.T) / temperature
        rows = torch.arange(two_n, device=z.device)
        logits = logits.masked_fill(own, float("-inf"))
        if index is None:
            return F.cross_entropy(logits, offset + (rows + n) % two_n)
        kidx = index if keys is None else key_index
        pos = (index[:, None] == kidx[None, :]) & ~own
        return (logits.logsumexp(1) - logits.masked_fill(~pos, float("-inf")).logsumexp(1)).mean()


def ipw_info_nce(z: Tensor, weights: Tensor, temperature: float = 0.2) -> Tensor:
    """InfoNCE on the inverse-prevalence similarity (BayesNCL paper Definition 4.4), one process.

    With ``w_k = π_k^(-1/2)`` the similarity ``Σ_k z_k z'_k / π_k`` is the dot product of ``z ⊙ w``
    and ``z' ⊙ w``; as NCL's, it is taken between unit rows: this is :func:`info_nce` of
    :func:`~bayesncl.core.parts.ipw_features` ``= normalize(z ⊙ w)``, i.e. logits
    ``cos(z ⊙ w, z' ⊙ w) / T``. A uniform ``w`` = 1 gives NCL's loss ``info_nce(normalize(z))``
    bit for bit (any other uniform ``w`` up to rounding). :func:`bayesncl.core.model.contrastive_loss`
    uses the same features, with the negatives gathered over processes.

    Args:
        z: (2n, D) local non-negative views ``[view1; view2]``, as :func:`info_nce`.
        weights: (D,) positive per-dimension scales, e.g.
            :meth:`bayesncl.core.parts.Prevalence.weights` (detached: no gradient reaches π).
        temperature: T > 0.

    Returns:
        A 0-d float32 tensor (nats).
    """
    return info_nce(ipw_features(z, weights), temperature)


def bernoulli_kl(alpha: Tensor, rho: float, eps: float = 0.01) -> Tensor:
    """KL(Bern(α) ‖ Bern(ρ)) summed over dims, averaged over rows (nats), in float32.

    PAPER-NOTES §1 ("Loss"): ``Σ_k [α_k log(α_k/ρ) + (1−α_k) log((1−α_k)/(1−ρ))]`` with α and ρ
    clamped to ``[eps, 1−eps]`` first, as the authors do (so the value is finite at α ∈ {0, 1}, and
    the gradient is zero where α lies outside the clamp range).

    Args:
        alpha: (M, D), M ≥ 1, gate probabilities, noise-free σ(logits), in [0, 1]. Any float
            dtype. NaN entries are allowed and make the result NaN.
        rho: the prior keep probability, 0 < ρ < 1.
        eps: clamp margin, 0 ≤ eps < 0.5 (0.01 in the authors' code).

    Returns:
        A 0-d float32 tensor: mean over the M rows of the per-row sum over D.
    """
    with fp32_math(alpha.device):
        a = alpha.float().clamp(eps, 1.0 - eps)
        r = min(max(rho, eps), 1.0 - eps)
        kl = a * torch.log(a / r) + (1.0 - a) * torch.log((1.0 - a) / (1.0 - r))
        return kl.sum(dim=1).mean()
