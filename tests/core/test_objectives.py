"""Reference, analytic and gradient tests for the NCL paper's objectives in bayesncl.core.losses: the
spectral contrastive loss, SupCon, the linear cross-entropy (CE / NCE) and the L1 penalty.

Each loss is compared with a per-row Python loop in float64 written from the paper's formula, and
with cases whose value is known in closed form. The 2-process equivalence of the gathered versions
is in tests/core/test_objectives_distributed.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from bayesncl.core.losses import (
    clip_norm,
    info_nce,
    l1_penalty,
    linear_cross_entropy,
    spectral_loss,
    supcon_loss,
)

from ..conftest import gen


# ----------------------------------------------------------------------------- naive references
def naive_spectral(z: torch.Tensor, mu: float) -> float:
    """HaoChen et al.'s loss by loops: clip rows to norm √μ, −2·mean_i z1_i·z2_i plus the mean
    over ordered pairs i ≠ j of (z1_i·z2_j)², all over μ."""
    rows = []
    for r in z.double():
        norm = float(r.norm())
        rows.append(r / norm * math.sqrt(mu) if norm >= math.sqrt(mu) else r)
    n = len(rows) // 2
    v1, v2 = rows[:n], rows[n:]
    positive = -2.0 * sum(float(v1[i] @ v2[i]) for i in range(n)) / n
    pairs = [float(v1[i] @ v2[j]) ** 2 for i in range(n) for j in range(n) if j != i]
    negative = sum(pairs) / len(pairs) if pairs else 0.0
    return (positive + negative) / mu


def naive_supcon(z: torch.Tensor, labels: list[int], t: float) -> float:
    """Khosla et al. Eq. 2 by loops over anchors, positives and the denominator's rows."""
    rows = [r.double() / r.double().norm() for r in z]
    m = len(rows)
    total = 0.0
    for i in range(m):
        denom = sum(math.exp(float(rows[i] @ rows[a]) / t) for a in range(m) if a != i)
        positives = [p for p in range(m) if p != i and labels[p] == labels[i]]
        logs = [float(rows[i] @ rows[p]) / t - math.log(denom) for p in positives]
        total += -sum(logs) / len(logs)
    return total / m


def naive_ce(z: torch.Tensor, y: list[int], w: torch.Tensor, b: torch.Tensor) -> float:
    total = 0.0
    for zi, yi in zip(z.double(), y, strict=True):
        logits = [float(w[c].double() @ zi + b[c].double()) for c in range(len(w))]
        total += -(logits[yi] - math.log(sum(math.exp(v) for v in logits)))
    return total / len(y)


# ----------------------------------------------------------------------------- spectral
@pytest.mark.parametrize("n,d,mu", [(2, 3, 1.0), (5, 8, 1.0), (4, 16, 0.5), (8, 6, 10.0)])
def test_spectral_matches_naive_loop(n: int, d: int, mu: float) -> None:
    z = torch.randn(2 * n, d, generator=gen(n * 10 + d)) * 0.6  # some rows inside the ball, some clipped
    got = spectral_loss(z, mu)
    assert got.dtype == torch.float32 and got.ndim == 0
    assert got.item() == pytest.approx(naive_spectral(z, mu), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("n_pairs,mu", [(3, 1.0), (6, 4.0), (5, 0.25)])
def test_spectral_identical_orthonormal_views_analytic(n_pairs: int, mu: float) -> None:
    # both views of image i are e_i: z1_i·z2_i = min(1, μ) after the clip, every negative is 0
    eye = torch.eye(n_pairs, n_pairs + 3)
    got = spectral_loss(torch.cat([eye, eye]), mu)
    assert got.item() == pytest.approx(-2.0 * min(1.0, mu) / mu, rel=1e-6)


def test_spectral_collapsed_views_pay_the_negative_term() -> None:
    # every row the same unit vector: positive −2, each of the n(n−1) negatives (1)² = 1 → −1
    z = F.normalize(torch.ones(8, 4), dim=1)
    assert spectral_loss(z).item() == pytest.approx(-1.0, rel=1e-6)


def test_spectral_keys_of_one_process_change_nothing_and_zero_rows_stay_finite() -> None:
    z = torch.randn(10, 5, generator=gen(3))
    assert spectral_loss(z, keys=z, offset=0).item() == pytest.approx(spectral_loss(z).item(), rel=1e-7)
    z = z.clone()
    z[2] = 0.0  # a row whose gates are all closed
    z.requires_grad_(True)
    loss = spectral_loss(z)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


def test_spectral_fp16_input_gives_fp32() -> None:
    z = torch.randn(6, 4, generator=gen(4))
    got = spectral_loss(z.half())
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(naive_spectral(z.half().float(), 1.0), rel=1e-5)


def test_clip_norm_projects_onto_the_ball() -> None:
    z = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    torch.testing.assert_close(clip_norm(z), torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))
    torch.testing.assert_close(clip_norm(z, mu=4.0)[0], torch.tensor([1.2, 1.6]))


# ----------------------------------------------------------------------------- SupCon
@pytest.mark.parametrize("n,d,t,classes", [(2, 3, 0.1, 2), (5, 8, 0.2, 3), (8, 6, 0.5, 4)])
def test_supcon_matches_naive_loop(n: int, d: int, t: float, classes: int) -> None:
    z = torch.randn(2 * n, d, generator=gen(n + d))
    y = torch.randint(0, classes, (n,), generator=gen(n))
    labels = torch.cat([y, y])
    got = supcon_loss(z, labels, t)
    assert got.dtype == torch.float32 and got.ndim == 0
    assert got.item() == pytest.approx(naive_supcon(z, labels.tolist(), t), rel=1e-5)


def test_supcon_with_one_label_per_image_is_info_nce() -> None:
    z = torch.randn(12, 7, generator=gen(5))
    labels = torch.arange(6).repeat(2)
    assert supcon_loss(z, labels, 0.2).item() == pytest.approx(info_nce(z, 0.2).item(), rel=1e-6)


def test_supcon_every_row_in_one_class_analytic() -> None:
    # identical rows: every logit 1/τ, so each anchor's log-probability is −log(M−1)
    m = 10
    z = torch.ones(m, 4)
    assert supcon_loss(z, torch.zeros(m, dtype=torch.long), 0.3).item() == pytest.approx(math.log(m - 1))
    # generic rows, one class: loss_i = logsumexp_{a≠i}(s_ia/τ) − mean_{p≠i}(s_ip/τ)
    z = torch.randn(m, 5, generator=gen(6))
    u = F.normalize(z.double(), dim=1)
    s = (u @ u.T) / 0.3
    off = ~torch.eye(m, dtype=torch.bool)
    expected = torch.stack([s[i][off[i]].logsumexp(0) - s[i][off[i]].mean() for i in range(m)]).mean()
    got = supcon_loss(z, torch.zeros(m, dtype=torch.long), 0.3)
    assert got.item() == pytest.approx(float(expected), rel=1e-5)


def test_supcon_anchor_without_positive_adds_zero() -> None:
    z = torch.randn(4, 3, generator=gen(7))
    labels = torch.tensor([0, 0, 1, 2])  # rows 2 and 3 have no positive
    u = F.normalize(z.double(), dim=1)
    s = (u @ u.T) / 0.5
    row = [s[i][torch.arange(4) != i].logsumexp(0) - s[i, 1 - i] for i in (0, 1)]
    assert supcon_loss(z, labels, 0.5).item() == pytest.approx(float(sum(row)) / 4, rel=1e-5)


# ----------------------------------------------------------------------------- CE / NCE
def test_linear_cross_entropy_matches_naive_and_equal_logits_give_log_c() -> None:
    z = torch.randn(7, 5, generator=gen(8))
    w = torch.randn(3, 5, generator=gen(9))
    b = torch.randn(3, generator=gen(10))
    y = torch.randint(0, 3, (7,), generator=gen(11))
    got = linear_cross_entropy(z, y, w, b)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(naive_ce(z, y.tolist(), w, b), rel=1e-5)
    assert linear_cross_entropy(z, y, torch.zeros(4, 5)).item() == pytest.approx(math.log(4), rel=1e-6)


def test_nce_gradient_matches_finite_differences() -> None:
    """NCE = CE on ReLU(p): the autograd gradient with respect to p, W and b equals central
    differences in float64 and the closed form (softmax − onehot)/M · W masked by p > 0."""
    p = torch.randn(6, 4, generator=gen(12), dtype=torch.float64)
    p = torch.where(p.abs() < 0.05, torch.full_like(p, 0.3), p)  # no entry within h of ReLU's kink
    w = torch.randn(3, 4, generator=gen(13), dtype=torch.float64)
    b = torch.randn(3, generator=gen(14), dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 2, 1, 0])

    def nce(p: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(torch.relu(p), y, w, b)

    args = [t.clone().requires_grad_(True) for t in (p, w, b)]
    nce(*args).backward()
    h = 1e-6
    for which, arg in enumerate(args):
        fd = torch.zeros_like(arg)
        for idx in itertools.product(*(range(s) for s in arg.shape)):
            plus = [t.detach().clone() for t in args]
            minus = [t.detach().clone() for t in args]
            plus[which][idx] += h
            minus[which][idx] -= h
            fd[idx] = (nce(*plus) - nce(*minus)) / (2 * h)
        torch.testing.assert_close(arg.grad, fd, atol=1e-7, rtol=1e-6)
    probs = torch.softmax(torch.relu(p) @ w.T + b, dim=1)
    closed = ((probs - F.one_hot(y, 3)) / len(y)) @ w * (p > 0)
    torch.testing.assert_close(args[0].grad, closed, atol=1e-12, rtol=1e-9)
    assert (args[0].grad[p < 0] == 0).all()  # no gradient reaches a negative (cut) entry


# ----------------------------------------------------------------------------- L1
def test_l1_penalty_value_and_subgradient() -> None:
    z = torch.tensor([[1.0, -2.0, 0.0], [0.5, 0.0, -0.25]], requires_grad=True)
    loss = l1_penalty(z)
    assert loss.item() == pytest.approx((3.0 + 0.75) / 2)
    loss.backward()
    torch.testing.assert_close(z.grad, torch.tensor([[1.0, -1.0, 0.0], [1.0, 0.0, -1.0]]) / 2)
    assert l1_penalty(z.detach().half()).dtype == torch.float32
