"""Reference and analytic tests for bayesncl.core.losses (PAPER-NOTES §1, "Loss").

The losses check nothing per call; the values they take (temperature, rho, the batch size) are
refused by config (tests/test_config.py::test_config_refuses_what_the_parts_would_get_wrong).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bayesncl.core import parts as P
from bayesncl.core.losses import bernoulli_kl, info_nce

from ..conftest import gen


def naive_nt_xent(z: torch.Tensor, t: float) -> float:
    """Per-sample Python loop in float64 over [view1; view2] rows (cosine similarity)."""
    rows = [r.double() for r in z]
    rows = [r / r.norm() if r.norm() > 0 else r * 0 for r in rows]
    two_n = len(rows)
    n = two_n // 2
    total = 0.0
    for i in range(two_n):
        pos = (i + n) % two_n
        sims = {j: float(rows[i] @ rows[j]) / t for j in range(two_n) if j != i}
        denom = sum(math.exp(s) for s in sims.values())
        total += -(sims[pos] - math.log(denom))
    return total / two_n


# ----------------------------------------------------------------------------- info_nce


@pytest.mark.parametrize("n,d,t", [(1, 3, 0.2), (2, 4, 0.5), (5, 16, 0.2), (8, 7, 1.0), (4, 32, 0.07)])
def test_info_nce_matches_naive_loop(n: int, d: int, t: float) -> None:
    z = torch.randn(2 * n, d, generator=gen(n * 100 + d))
    got = info_nce(z, t)
    assert got.dtype == torch.float32 and got.ndim == 0
    assert got.item() == pytest.approx(naive_nt_xent(z, t), rel=1e-5, abs=1e-5)


def test_info_nce_single_pair_is_zero() -> None:
    # n = 1 without other keys: each row's only candidate is its positive.
    assert info_nce(torch.randn(2, 5, generator=gen(0))).item() == pytest.approx(0.0, abs=1e-7)


def test_info_nce_scale_invariant_and_fp16_input() -> None:
    z = torch.randn(8, 6, generator=gen(1))
    ref = info_nce(z)
    assert info_nce(3.7 * z).item() == pytest.approx(ref.item(), rel=1e-5)
    half = info_nce(z.half())
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(naive_nt_xent(z.half().float(), 0.2), rel=1e-5)


def test_loss_and_kl_stay_fp32_under_autocast() -> None:
    z = torch.randn(8, 6, generator=gen(20))
    alpha = torch.rand(8, 6, generator=gen(21))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        nce, kl = info_nce(z.bfloat16()), bernoulli_kl(alpha, 0.8)
        zt = P.gated_features(z, (alpha > 0.5).float())
    assert nce.dtype == kl.dtype == zt.dtype == torch.float32
    assert nce.item() == pytest.approx(naive_nt_xent(z.bfloat16().float(), 0.2), rel=1e-5)
    assert kl.item() == pytest.approx(bernoulli_kl(alpha, 0.8).item(), rel=1e-6)


@pytest.mark.parametrize("n_pairs,t", [(3, 0.2), (6, 0.5), (10, 1.0)])
def test_info_nce_orthogonal_identical_views_analytic(n_pairs: int, t: float) -> None:
    # Pair i: both views are the one-hot e_i. Positive sim 1/T, the 2N-2 negatives sim 0.
    eye = torch.eye(n_pairs, n_pairs + 2)
    z = torch.cat([eye, eye])
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2 * n_pairs - 2))
    assert info_nce(z, t).item() == pytest.approx(expected, rel=1e-5)


def test_info_nce_all_identical_views_analytic() -> None:
    # Every view identical: all 2n-1 candidates tie, loss = -log(1/(2n-1)).
    z = torch.ones(10, 4)
    assert info_nce(z, 0.2).item() == pytest.approx(math.log(9), rel=1e-6)


def _rank_layout(v1: torch.Tensor, v2: torch.Tensor, world: int) -> torch.Tensor:
    """Global keys as gathered over ranks: each rank's block is [view1_r; view2_r]."""
    n = v1.shape[0] // world
    blocks = [torch.cat([v1[r * n:(r + 1) * n], v2[r * n:(r + 1) * n]]) for r in range(world)]
    return torch.cat(blocks)


@pytest.mark.parametrize("world,n_local", [(2, 3), (4, 2), (3, 1)])
def test_info_nce_gathered_keys_equal_global_loss_and_gradients(world: int, n_local: int) -> None:
    d, t = 8, 0.3
    n_total = world * n_local
    g = gen(world * 10 + n_local)
    v1 = torch.randn(n_total, d, generator=g)
    v2 = torch.randn(n_total, d, generator=g)

    # Reference: one process holding the whole batch in the standard [view1; view2] layout.
    a1, a2 = v1.clone().requires_grad_(), v2.clone().requires_grad_()
    global_loss = info_nce(torch.cat([a1, a2]), t)
    global_loss.backward()

    # Simulated ranks: rank r holds its own block; the keys are the gathered blocks.
    b1, b2 = v1.clone().requires_grad_(), v2.clone().requires_grad_()
    keys = _rank_layout(b1, b2, world)
    per_rank = []
    for r in range(world):
        off = r * 2 * n_local
        per_rank.append(info_nce(keys[off:off + 2 * n_local], t, keys=keys, offset=off))
    mean_loss = torch.stack(per_rank).mean()
    mean_loss.backward()  # what DDP's gradient averaging with an autograd-aware gather computes

    assert mean_loss.item() == pytest.approx(global_loss.item(), rel=1e-6)
    torch.testing.assert_close(b1.grad, a1.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(b2.grad, a2.grad, rtol=1e-5, atol=1e-7)


def test_info_nce_offset_positive_on_later_rank() -> None:
    # Rank 1 of 2: local row i's positive is keys[offset + (i+n) mod 2n], not a row of rank 0.
    n, d = 2, 4
    local = torch.eye(4)[: 2 * n].clone()
    local[n:] = local[:n]  # views identical within pairs: e0,e1,e0,e1
    other = torch.zeros(2 * n, d)  # rank 0's rows are zero: similarity 0 to everything
    keys = torch.cat([other, local])
    t = 0.5
    # Row i: positive sim 1/T; self masked; negatives: 2 local rows of sim 0 + 4 zero rows.
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2 + 4))
    assert info_nce(local, t, keys=keys, offset=2 * n).item() == pytest.approx(expected, rel=1e-6)


def test_info_nce_accepts_numpy_and_tensor_scalars() -> None:
    z = torch.randn(6, 5, generator=gen(30))
    ref = info_nce(z, 0.2).item()
    assert info_nce(z, np.float32(0.2)).item() == pytest.approx(ref, rel=1e-6)
    assert info_nce(z, torch.tensor(0.2)).item() == pytest.approx(ref, rel=1e-6)
    keys = torch.cat([torch.randn(6, 5, generator=gen(31)), z])
    at6 = info_nce(z, 0.2, keys=keys, offset=6).item()
    assert info_nce(z, 0.2, keys=keys, offset=np.int64(6)).item() == at6


def test_info_nce_self_mask_is_the_diagonal_at_offset() -> None:
    """The self-mask (a comparison of two aranges, no index_put_) masks exactly column offset + i of
    row i: the loss equals a naive per-row sum over every other key; an offset that puts z outside
    the keys is refused (before, a negative one wrapped around silently)."""
    z = torch.randn(4, 3, generator=gen(40))
    keys = torch.cat([torch.randn(2, 3, generator=gen(41)), z, torch.randn(4, 3, generator=gen(42))])
    q, k = F.normalize(z, dim=1), F.normalize(keys, dim=1)
    naive = 0.0
    for i in range(4):
        logits = [float(q[i] @ k[j]) / 0.5 for j in range(len(keys)) if j != 2 + i]
        pos = float(q[i] @ k[2 + (i + 2) % 4]) / 0.5
        naive += -pos + math.log(sum(math.exp(v) for v in logits))
    assert info_nce(z, 0.5, keys=keys, offset=2).item() == pytest.approx(naive / 4, rel=1e-5)
    for bad in (-1, 7):
        with pytest.raises(ValueError, match=f"offset={bad} puts the 4 local rows outside the 10 keys"):
            info_nce(z, 0.5, keys=keys, offset=bad)


def test_info_nce_nan_row_gives_nan_loss() -> None:
    # The training loop detects divergence by a non-finite loss: a NaN row must not be zeroed.
    z = torch.randn(6, 5, generator=gen(32))
    z[2, 1] = float("nan")
    assert math.isnan(info_nce(z, 0.2).item())
    z[2, 1] = float("inf")
    assert math.isnan(info_nce(z, 0.2).item())


# ----------------------------------------------------------------------------- KL


def test_bernoulli_kl_hand_values() -> None:
    # Row 1: α = (0.5, 0.9), ρ = 0.8:
    #   0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.5 ln(0.625) + 0.5 ln(2.5) = 0.5 ln(1.5625) = 0.2231436
    #   0.9 ln(0.9/0.8) + 0.1 ln(0.1/0.2) = 0.9·0.1177830 − 0.1·0.6931472 = 0.0366900
    # Row 2: α = (0.8, 0.2): 0 + [0.2 ln(0.25) + 0.8 ln(4)] = 0.6·ln 4 = 0.8317766
    alpha = torch.tensor([[0.5, 0.9], [0.8, 0.2]])
    row1 = 0.2231436 + 0.0366900
    row2 = 0.8317766
    assert bernoulli_kl(alpha, 0.8).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)


def test_bernoulli_kl_zero_at_prior_and_positive_elsewhere() -> None:
    assert bernoulli_kl(torch.full((3, 5), 0.3), 0.3).item() == pytest.approx(0.0, abs=1e-7)
    alpha = torch.rand(4, 6, generator=gen(2))
    assert bernoulli_kl(alpha, 0.5).item() > 0


def test_bernoulli_kl_clamps_at_zero_and_one() -> None:
    # α = 0 is clamped to 0.01 and α = 1 to 0.99, both finite; ρ = 0.8.
    alpha = torch.tensor([[0.0, 1.0]], requires_grad=True)
    kl = bernoulli_kl(alpha, 0.8)
    e01 = 0.01 * math.log(0.01 / 0.8) + 0.99 * math.log(0.99 / 0.2)
    e99 = 0.99 * math.log(0.99 / 0.8) + 0.01 * math.log(0.01 / 0.2)
    assert kl.item() == pytest.approx(e01 + e99, rel=1e-5)
    kl.backward()
    assert torch.isfinite(alpha.grad).all()
    # ρ is clamped too: ρ = 0.999 behaves as 0.99.
    a = torch.tensor([[0.5]])
    assert bernoulli_kl(a, 0.999).item() == pytest.approx(bernoulli_kl(a, 0.99).item())


def test_bernoulli_kl_fp16_and_gradient() -> None:
    alpha = torch.rand(5, 7, generator=gen(3)) * 0.9 + 0.05
    assert bernoulli_kl(alpha.half(), 0.8).dtype == torch.float32
    a = alpha.clone().requires_grad_()
    bernoulli_kl(a, 0.8).backward()
    # d/dα [α ln(α/ρ) + (1−α) ln((1−α)/(1−ρ))] = ln(α/ρ) − ln((1−α)/(1−ρ)), divided by M rows.
    expected = (torch.log(alpha / 0.8) - torch.log((1 - alpha) / 0.2)) / 5
    torch.testing.assert_close(a.grad, expected, rtol=1e-4, atol=1e-6)


def test_bernoulli_kl_numpy_and_tensor_rho() -> None:
    alpha = torch.rand(3, 4, generator=gen(33))
    ref = bernoulli_kl(alpha, 0.25).item()
    assert bernoulli_kl(alpha, np.float32(0.25)).item() == ref
    assert bernoulli_kl(alpha, torch.tensor(0.25)).item() == ref


def test_bernoulli_kl_ends_of_the_interval_and_nan() -> None:
    # The ends of the interval are valid, and NaN propagates (no error): the loop stops on it.
    assert math.isfinite(bernoulli_kl(torch.tensor([[0.0, 1.0]]), 0.5).item())
    assert math.isnan(bernoulli_kl(torch.tensor([[float("nan"), 0.5]]), 0.5).item())


def test_all_closed_gates_zero_rows_no_nan() -> None:
    g = gen(15)
    n, d = 4, 8
    p = torch.randn(2 * n, d, generator=g).requires_grad_()
    logits = torch.randn(2 * n, d, generator=g)
    logits[1] = -30.0  # row 1: every gate closed
    logits[n + 2] = -30.0  # row n+2: every gate closed
    logits.requires_grad_()
    z = P.rep_relu(p)
    alpha = torch.sigmoid(logits)
    mask = P.ste_gate(alpha)
    zt = P.gated_features(z, mask)
    assert torch.equal(zt[1], torch.zeros(d)) and torch.equal(zt[n + 2], torch.zeros(d))
    open_rows = [i for i in range(2 * n) if i not in (1, n + 2)]
    torch.testing.assert_close(zt[open_rows].norm(dim=1), torch.ones(len(open_rows)))
    loss = info_nce(zt, 0.2) + 1e-3 * bernoulli_kl(alpha, 0.8)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(p.grad).all() and torch.isfinite(logits.grad).all()
    # No 1/eps blow-up: the gradients stay of order one.
    assert p.grad.abs().max() < 100 and logits.grad.abs().max() < 100


def test_zero_rows_info_nce_gradient_finite() -> None:
    z = torch.zeros(6, 5, requires_grad=True)
    loss = info_nce(z, 0.2)
    assert loss.item() == pytest.approx(math.log(5), rel=1e-6)  # all similarities 0: 5 equal logits
    loss.backward()
    assert torch.equal(z.grad, torch.zeros(6, 5))
