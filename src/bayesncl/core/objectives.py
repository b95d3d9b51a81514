"""The NCL paper's other objectives as pure functions: the spectral contrastive loss, SupCon, the
cross-entropy of a linear classifier (CE; NCE on non-negative features) and the L1 penalty.

The NCL paper (Wang et al., ICLR 2024, arXiv 2403.12459) uses them; its code (PKU-ML/non_neg) has
none of them, so the reference implementations decide where the papers are silent (HaoChen et al.'s
``models/spectral.py``, Khosla et al.'s SupContrast ``losses.py``; docs/decisions.md, "The NCL
paper's other objectives").

Layout and shapes as :func:`bayesncl.core.losses.info_nce`: ``n`` images on this process, ``N`` on
all processes, ``z``: (2n, D) laid out ``[view1; view2]`` (rows ``i`` and ``i+n`` are the two views
of one image), ``keys``: (2N, D) every process's ``z`` in rank order, ``offset``: the row of
``z[0]`` in ``keys`` (``rank·2n``; every process holds the same n). The maths runs in float32 with
autocast disabled (float64 input stays float64, for gradient checks). Nothing is checked per call:
the values come from a config that was checked once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from bayesncl.core.parts import fp32_math, safe_normalize, self_mask

__all__ = [
    "spectral_loss", "supcon_loss", "linear_cross_entropy", "l1_penalty", "clip_norm", "global_spectral_loss",
    "global_supcon_loss",
]


def _f32(x: Tensor) -> Tensor:
    """x in float32, or float64 if it already is (so finite-difference checks can run in float64)."""
    return x if x.dtype == torch.float64 else x.float()


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
        return F.cross_entropy(logits, labels)


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
    from bayesncl.core import distributed

    if not distributed.is_distributed():
        return None
    return distributed.gather_with_grad(z), torch.distributed.get_rank() * len(z)


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
    key_labels = labels.new_empty(len(keys))
    torch.distributed.all_gather_into_tensor(key_labels, labels.contiguous())
    return supcon_loss(z, labels, temperature, keys=keys, key_labels=key_labels, offset=offset)
