"""Reference and analytic tests for bayesncl.core.functional (PAPER-NOTES §1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bayesncl.core import functional as BF


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


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
    z = torch.randn(2 * n, d, generator=_gen(n * 100 + d))
    got = BF.info_nce(z, t)
    assert got.dtype == torch.float32 and got.ndim == 0
    assert got.item() == pytest.approx(naive_nt_xent(z, t), rel=1e-5, abs=1e-5)


def test_info_nce_single_pair_is_zero() -> None:
    # n = 1 without other keys: each row's only candidate is its positive.
    assert BF.info_nce(torch.randn(2, 5, generator=_gen(0))).item() == pytest.approx(0.0, abs=1e-7)


def test_info_nce_scale_invariant_and_fp16_input() -> None:
    z = torch.randn(8, 6, generator=_gen(1))
    ref = BF.info_nce(z)
    assert BF.info_nce(3.7 * z).item() == pytest.approx(ref.item(), rel=1e-5)
    half = BF.info_nce(z.half())
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(naive_nt_xent(z.half().float(), 0.2), rel=1e-5)


def test_loss_and_kl_stay_fp32_under_autocast() -> None:
    z = torch.randn(8, 6, generator=_gen(20))
    alpha = torch.rand(8, 6, generator=_gen(21))
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        nce, kl = BF.info_nce(z.bfloat16()), BF.bernoulli_kl(alpha, 0.8)
        zt = BF.gated_features(z, (alpha > 0.5).float())
    assert nce.dtype == kl.dtype == zt.dtype == torch.float32
    assert nce.item() == pytest.approx(naive_nt_xent(z.bfloat16().float(), 0.2), rel=1e-5)
    assert kl.item() == pytest.approx(BF.bernoulli_kl(alpha, 0.8).item(), rel=1e-6)


@pytest.mark.parametrize("n_pairs,t", [(3, 0.2), (6, 0.5), (10, 1.0)])
def test_info_nce_orthogonal_identical_views_analytic(n_pairs: int, t: float) -> None:
    # Pair i: both views are the one-hot e_i. Positive sim 1/T, the 2N-2 negatives sim 0.
    eye = torch.eye(n_pairs, n_pairs + 2)
    z = torch.cat([eye, eye])
    expected = -math.log(math.exp(1 / t) / (math.exp(1 / t) + 2 * n_pairs - 2))
    assert BF.info_nce(z, t).item() == pytest.approx(expected, rel=1e-5)


def test_info_nce_all_identical_views_analytic() -> None:
    # Every view identical: all 2n-1 candidates tie, loss = -log(1/(2n-1)).
    z = torch.ones(10, 4)
    assert BF.info_nce(z, 0.2).item() == pytest.approx(math.log(9), rel=1e-6)


def _rank_layout(v1: torch.Tensor, v2: torch.Tensor, world: int) -> torch.Tensor:
    """Global keys as gathered over ranks: each rank's block is [view1_r; view2_r]."""
    n = v1.shape[0] // world
    blocks = [torch.cat([v1[r * n:(r + 1) * n], v2[r * n:(r + 1) * n]]) for r in range(world)]
    return torch.cat(blocks)


@pytest.mark.parametrize("world,n_local", [(2, 3), (4, 2), (3, 1)])
def test_info_nce_gathered_keys_equal_global_loss_and_gradients(world: int, n_local: int) -> None:
    d, t = 8, 0.3
    n_total = world * n_local
    g = _gen(world * 10 + n_local)
    v1 = torch.randn(n_total, d, generator=g)
    v2 = torch.randn(n_total, d, generator=g)

    # Reference: one process holding the whole batch in the standard [view1; view2] layout.
    a1, a2 = v1.clone().requires_grad_(), v2.clone().requires_grad_()
    global_loss = BF.info_nce(torch.cat([a1, a2]), t)
    global_loss.backward()

    # Simulated ranks: rank r holds its own block; the keys are the gathered blocks.
    b1, b2 = v1.clone().requires_grad_(), v2.clone().requires_grad_()
    keys = _rank_layout(b1, b2, world)
    per_rank = []
    for r in range(world):
        off = r * 2 * n_local
        per_rank.append(BF.info_nce(keys[off:off + 2 * n_local], t, keys=keys, offset=off))
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
    assert BF.info_nce(local, t, keys=keys, offset=2 * n).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"z": torch.randn(3, 4)}, "even number"),
        ({"z": torch.randn(0, 4)}, "even number"),
        ({"z": torch.randn(4)}, "2-D"),
        ({"z": torch.randn(4, 4), "temperature": 0.0}, "temperature=0.0"),
        ({"z": torch.randn(4, 4), "temperature": -1.0}, "temperature=-1.0"),
        ({"z": torch.randn(4, 4), "temperature": float("nan")}, "temperature=nan"),
        ({"z": torch.randn(4, 4), "offset": 2}, "offset=2"),
        ({"z": torch.randn(4, 4), "keys": torch.randn(8, 5)}, "width 5"),
        ({"z": torch.randn(4, 4), "keys": torch.randn(8, 4), "offset": 6}, "offset=6"),
        ({"z": torch.randn(4, 4), "keys": torch.randn(8, 4), "offset": -1}, "offset=-1"),
    ],
)
def test_info_nce_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BF.info_nce(**kwargs)


def test_info_nce_accepts_numpy_and_tensor_scalars() -> None:
    z = torch.randn(6, 5, generator=_gen(30))
    ref = BF.info_nce(z, 0.2).item()
    assert BF.info_nce(z, np.float32(0.2)).item() == pytest.approx(ref, rel=1e-6)
    assert BF.info_nce(z, torch.tensor(0.2)).item() == pytest.approx(ref, rel=1e-6)
    keys = torch.cat([torch.randn(6, 5, generator=_gen(31)), z])
    at6 = BF.info_nce(z, 0.2, keys=keys, offset=6).item()
    assert BF.info_nce(z, 0.2, keys=keys, offset=np.int64(6)).item() == at6


@pytest.mark.parametrize("offset", [2.5, 6.0, True, "6"])
def test_info_nce_offset_must_be_an_integer(offset: object) -> None:
    z = torch.randn(4, 3)
    with pytest.raises(ValueError, match=rf"^info_nce: offset={offset!r}: expected an integer"):
        BF.info_nce(z, 0.2, keys=torch.randn(12, 3), offset=offset)


@pytest.mark.parametrize("temperature", ["0.2", True, torch.tensor([0.2]), None])
def test_info_nce_temperature_must_be_a_number(temperature: object) -> None:
    with pytest.raises(ValueError, match="expected a finite number > 0"):
        BF.info_nce(torch.randn(4, 3), temperature)  # type: ignore[arg-type]


def test_info_nce_nan_row_gives_nan_loss() -> None:
    # The training loop detects divergence by a non-finite loss: a NaN row must not be zeroed.
    z = torch.randn(6, 5, generator=_gen(32))
    z[2, 1] = float("nan")
    assert math.isnan(BF.info_nce(z, 0.2).item())
    z[2, 1] = float("inf")
    assert math.isnan(BF.info_nce(z, 0.2).item())


# ----------------------------------------------------------------------------- KL


def test_bernoulli_kl_hand_values() -> None:
    # Row 1: α = (0.5, 0.9), ρ = 0.8:
    #   0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.5 ln(0.625) + 0.5 ln(2.5) = 0.5 ln(1.5625) = 0.2231436
    #   0.9 ln(0.9/0.8) + 0.1 ln(0.1/0.2) = 0.9·0.1177830 − 0.1·0.6931472 = 0.0366900
    # Row 2: α = (0.8, 0.2): 0 + [0.2 ln(0.25) + 0.8 ln(4)] = 0.6·ln 4 = 0.8317766
    alpha = torch.tensor([[0.5, 0.9], [0.8, 0.2]])
    row1 = 0.2231436 + 0.0366900
    row2 = 0.8317766
    assert BF.bernoulli_kl(alpha, 0.8).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)


def test_bernoulli_kl_zero_at_prior_and_positive_elsewhere() -> None:
    assert BF.bernoulli_kl(torch.full((3, 5), 0.3), 0.3).item() == pytest.approx(0.0, abs=1e-7)
    alpha = torch.rand(4, 6, generator=_gen(2))
    assert BF.bernoulli_kl(alpha, 0.5).item() > 0


def test_bernoulli_kl_clamps_at_zero_and_one() -> None:
    # α = 0 is clamped to 0.01 and α = 1 to 0.99, both finite; ρ = 0.8.
    alpha = torch.tensor([[0.0, 1.0]], requires_grad=True)
    kl = BF.bernoulli_kl(alpha, 0.8)
    e01 = 0.01 * math.log(0.01 / 0.8) + 0.99 * math.log(0.99 / 0.2)
    e99 = 0.99 * math.log(0.99 / 0.8) + 0.01 * math.log(0.01 / 0.2)
    assert kl.item() == pytest.approx(e01 + e99, rel=1e-5)
    kl.backward()
    assert torch.isfinite(alpha.grad).all()
    # ρ is clamped too: ρ = 0.999 behaves as 0.99.
    a = torch.tensor([[0.5]])
    assert BF.bernoulli_kl(a, 0.999).item() == pytest.approx(BF.bernoulli_kl(a, 0.99).item())


def test_bernoulli_kl_fp16_and_gradient() -> None:
    alpha = torch.rand(5, 7, generator=_gen(3)) * 0.9 + 0.05
    assert BF.bernoulli_kl(alpha.half(), 0.8).dtype == torch.float32
    a = alpha.clone().requires_grad_()
    BF.bernoulli_kl(a, 0.8).backward()
    # d/dα [α ln(α/ρ) + (1−α) ln((1−α)/(1−ρ))] = ln(α/ρ) − ln((1−α)/(1−ρ)), divided by M rows.
    expected = (torch.log(alpha / 0.8) - torch.log((1 - alpha) / 0.2)) / 5
    torch.testing.assert_close(a.grad, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rho", [0.0, 1.0, -0.5, 1.5])
def test_bernoulli_kl_bad_rho(rho: float) -> None:
    with pytest.raises(ValueError, match=f"rho={rho}"):
        BF.bernoulli_kl(torch.rand(2, 2), rho)


@pytest.mark.parametrize("rho", ["0.5", True, None, [0.5]])
def test_bernoulli_kl_rho_must_be_a_number(rho: object) -> None:
    with pytest.raises(ValueError, match=r"^bernoulli_kl: rho=.*: expected a number with 0 < rho < 1$"):
        BF.bernoulli_kl(torch.rand(2, 2), rho)  # type: ignore[arg-type]


def test_bernoulli_kl_numpy_and_tensor_rho() -> None:
    alpha = torch.rand(3, 4, generator=_gen(33))
    ref = BF.bernoulli_kl(alpha, 0.25).item()
    assert BF.bernoulli_kl(alpha, np.float32(0.25)).item() == ref
    assert BF.bernoulli_kl(alpha, torch.tensor(0.25)).item() == ref


def test_bernoulli_kl_rejects_values_outside_unit_interval() -> None:
    logits = torch.tensor([[-2.0, 3.0], [0.5, 0.1]])
    msg = r"^bernoulli_kl: alpha holds values in \[-2, 3\]: expected probabilities in \[0, 1\]"
    with pytest.raises(ValueError, match=msg):
        BF.bernoulli_kl(logits, 0.5)
    with pytest.raises(ValueError, match=r"values in \[0.5, 1.5\]"):
        BF.bernoulli_kl(torch.tensor([[0.5, 1.5]]), 0.5)
    # The ends of the interval are valid, and NaN propagates (no error): the loop stops on it.
    assert math.isfinite(BF.bernoulli_kl(torch.tensor([[0.0, 1.0]]), 0.5).item())
    assert math.isnan(BF.bernoulli_kl(torch.tensor([[float("nan"), 0.5]]), 0.5).item())


def test_bernoulli_kl_rejects_zero_rows() -> None:
    with pytest.raises(ValueError, match="^bernoulli_kl: alpha has 0 rows: expected at least one row"):
        BF.bernoulli_kl(torch.zeros(0, 3), 0.5)


# ----------------------------------------------------------------------------- gates


def test_ste_forward_is_hard_mask_and_backward_identity() -> None:
    g = _gen(4)
    alpha = torch.rand(6, 9, generator=g).requires_grad_()
    m = BF.ste_gate(alpha, 0.5)
    torch.testing.assert_close(m, (alpha > 0.5).float(), rtol=0, atol=0)
    upstream = torch.randn(6, 9, generator=g)
    (m * upstream).sum().backward()
    torch.testing.assert_close(alpha.grad, upstream, rtol=0, atol=0)


def test_ste_threshold() -> None:
    alpha = torch.tensor([[0.2, 0.3, 0.31, 0.9]])
    assert BF.ste_gate(alpha, 0.3).tolist() == [[0.0, 0.0, 1.0, 1.0]]
    with pytest.raises(ValueError, match="threshold=1.0"):
        BF.ste_gate(alpha, 1.0)


def test_soft_gate_is_alpha() -> None:
    alpha = torch.rand(3, 4)
    assert BF.soft_gate(alpha) is alpha


@pytest.mark.parametrize("noise", ["gumbel", "logistic"])
def test_gumbel_gate_deterministic_with_generator(noise: str) -> None:
    logits = torch.randn(16, 32, generator=_gen(5))
    m1, y1 = BF.gumbel_sigmoid_gate(logits, noise=noise, generator=_gen(123))
    m2, y2 = BF.gumbel_sigmoid_gate(logits, noise=noise, generator=_gen(123))
    m3, _ = BF.gumbel_sigmoid_gate(logits, noise=noise, generator=_gen(124))
    assert torch.equal(m1, m2) and torch.equal(y1, y2)
    assert not torch.equal(m1, m3)
    assert set(m1.unique().tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(m1, (y1 > 0.5).float(), rtol=0, atol=0)


@pytest.mark.parametrize("noise", ["gumbel", "logistic"])
def test_gumbel_gate_saturates_and_passes_gradient(noise: str) -> None:
    logits = torch.tensor([[50.0, -50.0, 80.0, -80.0]]).repeat(64, 1).requires_grad_()
    mask, y = BF.gumbel_sigmoid_gate(logits, noise=noise, generator=_gen(6))
    assert torch.equal(mask, torch.tensor([[1.0, 0.0, 1.0, 0.0]]).repeat(64, 1))
    # Moderate logits: gradient reaches them through y (STE), dmask/dlogit = y(1−y)/τ.
    x = torch.randn(8, 5, generator=_gen(7)).requires_grad_()
    tau = 0.7
    mask, y = BF.gumbel_sigmoid_gate(x, tau=tau, noise=noise, generator=_gen(8))
    mask.sum().backward()
    torch.testing.assert_close(x.grad, (y * (1 - y) / tau).detach(), rtol=1e-5, atol=1e-7)
    assert x.grad.abs().sum() > 0


def test_gumbel_noise_distributions() -> None:
    shape = (200_000,)
    gum = BF.gumbel_noise(shape, "gumbel", generator=_gen(9))
    log = BF.gumbel_noise(shape, "logistic", generator=_gen(10))
    euler = 0.5772156649
    assert gum.mean().item() == pytest.approx(euler, abs=0.02)
    assert gum.var().item() == pytest.approx(math.pi**2 / 6, rel=0.03)
    assert log.mean().item() == pytest.approx(0.0, abs=0.02)
    assert log.var().item() == pytest.approx(math.pi**2 / 3, rel=0.03)
    # Logistic CDF: P(L < x) = σ(x); Gumbel CDF: P(G < x) = exp(−e^{−x}).
    for x in (-1.0, 0.0, 1.5):
        assert (log < x).float().mean().item() == pytest.approx(1 / (1 + math.exp(-x)), abs=0.01)
        assert (gum < x).float().mean().item() == pytest.approx(math.exp(-math.exp(-x)), abs=0.01)
    assert torch.isfinite(gum).all() and torch.isfinite(log).all()


def test_gumbel_gate_keep_rate_matches_probability() -> None:
    # With logistic noise and τ = 1 the keep probability is exactly σ(logit) (binary concrete).
    logit = 0.8
    mask, _ = BF.gumbel_sigmoid_gate(torch.full((100_000, 1), logit), noise="logistic", generator=_gen(11))
    assert mask.mean().item() == pytest.approx(1 / (1 + math.exp(-logit)), abs=0.01)


@pytest.mark.parametrize(
    "kwargs,match",
    [({"tau": 0.0}, "tau=0.0"), ({"tau": -2.0}, "tau=-2.0"), ({"threshold": 0.0}, "threshold=0.0"),
     ({"noise": "normal"}, "noise='normal'")],
)
def test_gumbel_gate_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BF.gumbel_sigmoid_gate(torch.zeros(2, 2), **kwargs)


# ----------------------------------------------------------------------------- TopK, φ


def test_topk_keeps_exactly_k_largest() -> None:
    z = torch.rand(10, 20, generator=_gen(12)) + 0.1  # positive, ties have probability 0
    for k in (1, 5, 20):
        out = BF.topk_mask(z, k)
        assert ((out != 0).sum(dim=1) == k).all()
        kept_min = torch.where(out != 0, out, torch.full_like(out, float("inf"))).min(dim=1).values
        dropped_max = torch.where(out == 0, z, torch.zeros_like(z)).max(dim=1).values
        assert (kept_min > dropped_max).all()
        torch.testing.assert_close(out[out != 0], z[out != 0], rtol=0, atol=0)
    assert BF.topk_mask(torch.tensor([[0.25, 0.75, 0.125, 0.5]]), 2).tolist() == [[0.0, 0.75, 0.0, 0.5]]


def test_topk_gradient_only_to_kept() -> None:
    z = torch.tensor([[0.3, 0.9, 0.1, 0.5]], requires_grad=True)
    BF.topk_mask(z, 2).sum().backward()
    assert z.grad.tolist() == [[0.0, 1.0, 0.0, 1.0]]


@pytest.mark.parametrize("k", [0, 5, -1, 2.0])
def test_topk_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match=f"k={k!r}"):
        BF.topk_mask(torch.rand(2, 4), k)  # type: ignore[arg-type]


def test_rep_relu_forward_relu_backward_gelu() -> None:
    x = torch.linspace(-4, 4, 101).requires_grad_()
    y = BF.rep_relu(x)
    torch.testing.assert_close(y, F.relu(x), rtol=0, atol=0)
    upstream = torch.randn(101, generator=_gen(13))
    (g_rep,) = torch.autograd.grad((y * upstream).sum(), x)
    x2 = x.detach().clone().requires_grad_()
    (g_gelu,) = torch.autograd.grad((F.gelu(x2) * upstream).sum(), x2)
    torch.testing.assert_close(g_rep, g_gelu)
    assert g_rep[x.detach() < -0.5].abs().sum() > 0  # dead units still get gradient


@pytest.mark.parametrize("kind", BF.NONNEG_KINDS)
def test_nonnegative_kinds(kind: str) -> None:
    x = torch.randn(4, 6, generator=_gen(14))
    expected = {
        "identity": x, "relu": F.relu(x), "rep_relu": F.relu(x), "gelu": F.gelu(x),
        "sigmoid": torch.sigmoid(x), "softplus": F.softplus(x), "exp": torch.exp(x),
        "leaky_relu": F.leaky_relu(x, 0.01),
    }[kind]
    torch.testing.assert_close(BF.nonnegative(x, kind), expected)


def test_nonnegative_unknown_kind() -> None:
    with pytest.raises(ValueError, match=r"kind='tanh'.*identity, relu, rep_relu"):
        BF.nonnegative(torch.zeros(1), "tanh")


# ----------------------------------------------------------------------------- gated features


def test_gated_features_value() -> None:
    z = torch.tensor([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    out = BF.gated_features(z, m)
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0], [s, s, 0.0]]))
    # A soft mask rescales before the second normalisation.
    soft = BF.gated_features(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.5, 1.0]]))
    torch.testing.assert_close(soft, torch.tensor([[1.0, 2.0]]) / math.sqrt(5))


def test_all_closed_gates_zero_rows_no_nan() -> None:
    g = _gen(15)
    n, d = 4, 8
    p = torch.randn(2 * n, d, generator=g).requires_grad_()
    logits = torch.randn(2 * n, d, generator=g)
    logits[1] = -30.0  # row 1: every gate closed
    logits[n + 2] = -30.0  # row n+2: every gate closed
    logits.requires_grad_()
    z = BF.rep_relu(p)
    alpha = torch.sigmoid(logits)
    mask = BF.ste_gate(alpha)
    zt = BF.gated_features(z, mask)
    assert torch.equal(zt[1], torch.zeros(d)) and torch.equal(zt[n + 2], torch.zeros(d))
    open_rows = [i for i in range(2 * n) if i not in (1, n + 2)]
    torch.testing.assert_close(zt[open_rows].norm(dim=1), torch.ones(len(open_rows)))
    loss = BF.info_nce(zt, 0.2) + 1e-3 * BF.bernoulli_kl(alpha, 0.8)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(p.grad).all() and torch.isfinite(logits.grad).all()
    # No 1/eps blow-up: the gradients stay of order one.
    assert p.grad.abs().max() < 100 and logits.grad.abs().max() < 100


def test_zero_rows_info_nce_gradient_finite() -> None:
    z = torch.zeros(6, 5, requires_grad=True)
    loss = BF.info_nce(z, 0.2)
    assert loss.item() == pytest.approx(math.log(5), rel=1e-6)  # all similarities 0: 5 equal logits
    loss.backward()
    assert torch.equal(z.grad, torch.zeros(6, 5))


def test_gated_features_fp16_and_bool_mask() -> None:
    z = torch.rand(4, 6, generator=_gen(16)).half()
    mask = torch.rand(4, 6, generator=_gen(17)) > 0.5
    mask[0] = False
    out = BF.gated_features(z, mask)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.equal(out[0], torch.zeros(6))
    with pytest.raises(ValueError, match="mask shape"):
        BF.gated_features(z, mask[:, :3])


def test_safe_normalize_matches_f_normalize_on_nonzero_rows() -> None:
    x = torch.randn(5, 7, generator=_gen(18), dtype=torch.float64).float()
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    up = torch.randn(5, 7, generator=_gen(19))
    ya, yb = BF.safe_normalize(a), F.normalize(b, dim=1)
    torch.testing.assert_close(ya, yb)
    (ya * up).sum().backward()
    (yb * up).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_safe_normalize_zero_and_non_finite_rows() -> None:
    x = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0], [float("nan"), 1.0, 1.0], [float("inf"), 1.0, 0.0]])
    x.requires_grad_()
    y = BF.safe_normalize(x)
    assert torch.equal(y[0], torch.zeros(3))
    torch.testing.assert_close(y[1], torch.tensor([0.6, 0.0, 0.8]))
    assert torch.isnan(y[2]).all()  # NaN propagates: it is not mapped to a zero row
    assert not torch.isfinite(y[3]).all()
    y[:2].sum().backward()
    assert torch.equal(x.grad[0], torch.zeros(3))  # zero row: zero (finite) gradient
    # d/dx of the unit row (0.6, 0, 0.8) summed: (1 − 1.4·x̂)/‖x‖ = (0.032, 0.2, −0.024)
    torch.testing.assert_close(x.grad[1], torch.tensor([0.032, 0.2, -0.024]))
    assert torch.isnan(x.grad[2:]).all()  # non-finite rows pass NaN back


def test_eval_features() -> None:
    z = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(BF.eval_features(z), torch.tensor([[0.6, 0.8], [0.0, 0.0]]))
    m = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(BF.eval_features(z, m), torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
