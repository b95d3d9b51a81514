"""Every loss of the methods as a pure function on tensors (PAPER-NOTES §1, "Loss"; the NCL paper's
other objectives): InfoNCE and its inverse-prevalence form, the Bernoulli KL of the gate, the
spectral contrastive loss, SupCon, the cross-entropy of a classifier and the L1 penalty. Each
docstring gives its equation and source; a method's :class:`~bayesncl.core.methods.LossTerm` calls
one on the model outputs it reads (``core/methods/common.py``, ``core/methods/objective_terms.py``).

Layout and shapes: ``n`` images on this process, ``N`` on all processes, ``D`` the feature width;
``z``: (2n, D) laid out ``[view1; view2]`` (rows ``i`` and ``i+n`` are the two views of one image);
``keys``: (2N, D) every process's ``z`` in rank order (an autograd all-gather); ``offset``: the row
of ``z[0]`` in ``keys`` (``rank·2n``; every process holds the same n). The ``global_*`` functions
gather the keys themselves under torch.distributed. The maths runs in float32 with autocast
disabled, whatever the input dtype (fp16 NaNs are a known failure in this field; float64 input
stays float64 where noted, for gradient checks). Nothing is checked per call: the values come from
a config that :func:`bayesncl.config.validate` checked once.

The NCL paper (Wang et al., ICLR 2024, arXiv 2403.12459) uses the spectral loss, SupCon, CE/NCE and
L1; its code (PKU-ML/non_neg) has none of them, so the reference implementations decide where the
papers are silent (HaoChen et al.'s ``models/spectral.py``, Khosla et al.'s SupContrast
``losses.py``; docs/decisions.md, "The NCL paper's other objectives").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bayesncl.core import distributed
from bayesncl.core.parts import fp32_math, ipw_features, safe_normalize, self_mask

__all__ = [
    "info_nce", "ipw_info_nce", "global_info_nce", "bernoulli_kl", "spectral_loss", "global_spectral_loss",
    "supcon_loss", "global_supcon_loss", "cross_entropy", "linear_cross_entropy", "l1_penalty", "clip_norm",
]


def _f32(x: Tensor) -> Tensor:
    """x in float32, or float64 if it already is (so finite-difference checks can run in float64)."""
    return x if x.dtype == torch.float64 else x.float()


# ----------------------------------------------------------------------------- InfoNCE, KL
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
    bit for bit (any other uniform ``w`` up to rounding). The InfoNCE term of ``method.ipw``
    (:func:`global_info_nce` of the same features) gathers the negatives over processes.

    Args:
        z: (2n, D) local non-negative views ``[view1; view2]``, as :func:`info_nce`.
        weights: (D,) positive per-dimension scales, e.g.
            :meth:`bayesncl.core.parts.Prevalence.weights` (detached: no gradient reaches π).
        temperature: T > 0.

    Returns:
        A 0-d float32 tensor (nats).
    """
    return info_nce(ipw_features(z, weights), temperature)


def global_info_nce(
    z: Tensor, temperature: float = 0.2, *, index: Tensor | None = None, gather: bool = True
) -> Tensor:
    """:func:`info_nce` of this process's rows against the whole (global) batch, the loss of every
    InfoNCE method (PAPER-NOTES §1; ``loss_i = −log(e^{q_i·k_pos/T} / Σ_{j≠self} e^{q_i·k_j/T})``).

    With ``gather`` under torch.distributed the keys are every process's rows (an autograd
    all-gather, :func:`bayesncl.core.distributed.gather_with_grad`; every process holds the same n,
    this process's rows at ``offset = rank·2n``): with DDP averaging the gradients, the gradient
    equals the single-process gradient over the concatenated batch (docs/scaling.md). Else, or with
    one process, the keys are z itself.

    Args:
        z: (2n, D) local views ``[view1; view2]`` (z̃, or the ipw features), any float dtype.
        temperature: T > 0.
        index: (2n,) integer dataset index of each row or None: every row of the same index anywhere
            in the (global) batch is a positive (the authors' rule, :func:`info_nce`); the indices of
            the other processes are gathered too.
        gather: take the keys from every process when torch.distributed runs with > 1 process.

    Returns:
        A 0-d float32 tensor (nats), a mean over the 2n local rows.
    """
    got = _gathered(z) if gather else None
    if got is None:
        return info_nce(z, temperature, index=index)
    keys, offset = got
    key_index = None if index is None else _gather_plain(index, len(keys))
    return info_nce(z, temperature, keys=keys, offset=offset, index=index, key_index=key_index)


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


# ----------------------------------------------------------------------------- the NCL paper's others
def clip_norm(z: Tensor, mu: float = 1.0) -> Tensor:
    """Rows of norm ≥ √μ scaled down to norm √μ, the others unchanged (HaoChen et al.'s ``D``).

    z: (M, D) any float dtype. Returns (M, D) float32 (float64 stays float64). The spectral loss is
    unbounded below for unbounded features; this projection onto the ball of radius √μ is how the
    reference code keeps it bounded (the paper's analysis assumes bounded features).
    """
    z = _f32(z)
    norm = z.norm(dim=1, keepdim=True)
    inside = norm < mu**0.5
    return torch.where(inside, z, z / torch.where(inside, torch.ones_like(norm), norm) * mu**0.5)


def spectral_loss(z: Tensor, mu: float = 1.0, *, keys: Tensor | None = None, offset: int = 0) -> Tensor:
    """The spectral contrastive loss (HaoChen et al. 2021, Eq. 1; NCL paper Eq. 2 with f ≥ 0 for NCL).

    ``L = (−2·E[f(x)ᵀf(x⁺)] + E[(f(x)ᵀf(x⁻))²]) / μ``, computed as the reference code does
    (``models/spectral.py``, ``D``): every row is first clipped to norm ≤ √μ (:func:`clip_norm`);
    the positive term is the mean over the n local images of ``z1_i·z2_i`` (view 1 against view 2);
    the negative term pairs view 1 of image i with view 2 of every *other* image j of the (global)
    batch, mean over the N−1 of them, then over i. No temperature and no L2 normalisation.

    Args:
        z: (2n, D), n ≥ 1 (N ≥ 2 for a negative term), local views ``[view1; view2]``.
        mu: μ > 0, the squared radius of the clip and the scale the loss is divided by (1 in the
            reference's CIFAR config).
        keys: (2N, D) every process's ``z`` (an autograd all-gather), or None (one process). Their
            view-2 rows are the negatives; a local row's own image (row ``offset // 2 + i`` of them)
            is left out.
        offset: the row of ``z[0]`` in ``keys`` (0 without keys).

    Returns:
        A 0-d float32 tensor. Identical orthonormal views give −2/μ (positive term −2, negatives 0).
        The mean over processes of the local losses is the one-process loss of the whole batch, and
        with DDP averaging the gradients so is the gradient (tests/core/test_objectives_distributed.py).
    """
    n = z.shape[0] // 2
    with fp32_math(z.device):
        q = clip_norm(z[:n], mu)
        pos = clip_norm(z[n:], mu)
        if keys is None:
            k2, self_col = pos, 0
        else:
            k = keys.reshape(-1, 2, n, keys.shape[1])  # (ranks, view, n, D)
            k2, self_col = clip_norm(k[:, 1].reshape(-1, keys.shape[1]), mu), offset // 2
        positive = -2.0 * (q * pos).sum(dim=1).mean()
        sq = (q @ k2.T) ** 2  # (n, N)
        sq = sq.masked_fill(self_mask(n, sq.shape[1], self_col, z.device), 0.0)
        negative = sq.sum(dim=1).mean() / max(k2.shape[0] - 1, 1)
        return (positive + negative) / mu


def supcon_loss(
    z: Tensor, labels: Tensor, temperature: float = 0.1, *, keys: Tensor | None = None,
    key_labels: Tensor | None = None, offset: int = 0,
) -> Tensor:
    """The supervised contrastive loss (Khosla et al. 2020, Eq. 2, ``L^sup_out``), mean over anchors.

    Every local row ``i`` is an anchor; its positives ``P(i)`` are all *other* rows of the (global)
    batch with its label (its own second view included), and with unit rows ``ẑ``::

        loss_i = −1/|P(i)| · Σ_{p ∈ P(i)} log( exp(ẑ_i·ẑ_p/τ) / Σ_{a ≠ i} exp(ẑ_i·ẑ_a/τ) )

    as the SupContrast reference code (``losses.py``, contrast_mode "all") computes it, except that
    its factor τ/τ_base (1 at its defaults) is left out. An anchor without a positive (impossible
    with two views of every image) adds 0, as that code's guard does. With a distinct label per
    image this is :func:`~bayesncl.core.losses.info_nce` exactly.

    Args:
        z: (2n, D) local views ``[view1; view2]``; rows are L2-normalised here
            (:func:`~bayesncl.core.parts.safe_normalize`: an all-zero row stays zero).
        labels: (2n,) integer class of each local row (the image's label, repeated per view).
        temperature: τ > 0.
        keys: (2N, D) every process's ``z`` (autograd all-gather) or None (one process).
        key_labels: (2N,) the labels of ``keys`` (plainly gathered); required with ``keys``, so
            that positives on other processes are found.
        offset: the row of ``z[0]`` in ``keys``.

    Returns:
        A 0-d float32 tensor (nats). Every row in one class with identical rows gives log(2N−1).
    """
    m = z.shape[0]
    with fp32_math(z.device):
        q = safe_normalize(z)
        k = q if keys is None else safe_normalize(keys)
        klab = labels if keys is None else key_labels
        logits = (q @ k.T) / temperature
        own = self_mask(m, logits.shape[1], offset, z.device)
        log_prob = logits.masked_fill(own, float("-inf")).log_softmax(dim=1)
        pos = (labels[:, None] == klab[None, :]) & ~own
        per_anchor = log_prob.masked_fill(~pos, 0.0).sum(dim=1) / pos.sum(dim=1).clamp(min=1)
        return -per_anchor.mean()


def linear_cross_entropy(z: Tensor, labels: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Cross-entropy of a linear classifier on features z: ``mean_i −log softmax(W z_i + b)[y_i]``.

    CE (``z`` the raw representation) and the NCL paper's Non-negative Cross Entropy (NCE: the
    same loss on non-negative features ``z = φ(p)``; the weights stay unconstrained, so a class
    score is a signed combination of non-negative activations) are this function; they differ
    only in the z they pass.

    Args:
        z: (M, D) features, any float dtype (cast to float32; float64 stays float64).
        labels: (M,) integer classes in ``[0, C)``.
        weight: (C, D) classifier weights; bias: (C,) or None.

    Returns:
        A 0-d float32 tensor (nats); ``log C`` when the logits are all equal.
    """
    with fp32_math(z.device):
        x = _f32(z)
        logits = F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    return cross_entropy(logits, labels)


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy of class logits: ``mean_i −log softmax(l_i)[y_i]`` (CE's and NCE's loss on the
    logits their classifier head computed in the forward pass; :func:`linear_cross_entropy`).

    Args:
        logits: (M, C) any float dtype (cast to float32; float64 stays float64).
        labels: (M,) integer classes in ``[0, C)``.

    Returns:
        A 0-d float32 tensor (nats); ``log C`` when the logits are all equal.
    """
    with fp32_math(logits.device):
        return F.cross_entropy(_f32(logits), labels)


def l1_penalty(z: Tensor) -> Tensor:
    """The L1 term of an L1-regularised CL: ``mean_i ‖z_i‖₁`` (sum over dims, mean over rows).

    z: (M, D) any float dtype. Returns a 0-d float32 tensor (float64 stays float64), in the units of
    z; the method weighs it by β. Its (sub)gradient is ``sign(z)/M``, 0 where z = 0 (torch's |·|).
    """
    with fp32_math(z.device):
        return _f32(z).abs().sum(dim=1).mean()


# ----------------------------------------------------------------------------- over every process
def _gathered(z: Tensor) -> tuple[Tensor, int] | None:
    """(every process's z with gradient, this process's row offset), or None for one process."""
    if not distributed.is_distributed():
        return None
    return distributed.gather_with_grad(z), torch.distributed.get_rank() * len(z)


def _gather_plain(x: Tensor, rows: int) -> Tensor:
    """Every process's x (1-d, no gradient: labels, indices) in rank order, ``rows`` in all."""
    out = x.new_empty(rows)
    torch.distributed.all_gather_into_tensor(out, x.contiguous())
    return out


def global_spectral_loss(z: Tensor, mu: float = 1.0, *, gather: bool = True) -> Tensor:
    """:func:`spectral_loss` of this process's rows against the whole (global) batch: with ``gather``
    under torch.distributed the negatives are every process's view-2 rows (an autograd all-gather,
    :func:`bayesncl.core.distributed.gather_with_grad`; every process must hold the same n), else
    this process's. z: (2n, D) ``[view1; view2]``. Returns a 0-d float32 tensor."""
    got = _gathered(z) if gather else None
    return spectral_loss(z, mu) if got is None else spectral_loss(z, mu, keys=got[0], offset=got[1])


def global_supcon_loss(z: Tensor, labels: Tensor, temperature: float = 0.1, *, gather: bool = True) -> Tensor:
    """:func:`supcon_loss` of this process's rows against the whole (global) batch: with ``gather``
    under torch.distributed the other processes' rows (autograd all-gather) and labels (plain
    all-gather) are negatives *and positives*, so a positive on another process counts (the
    per-rank mask bug of solo-learn #206 in SupCon's form). z: (2n, D); labels: (2n,) int.
    Returns a 0-d float32 tensor."""
    got = _gathered(z) if gather else None
    if got is None:
        return supcon_loss(z, labels, temperature)
    keys, offset = got
    key_labels = _gather_plain(labels, len(keys))
    return supcon_loss(z, labels, temperature, keys=keys, key_labels=key_labels, offset=offset)
