"""Tests for bayesncl.core.parts: φ, the gates, TopK, the gated features and the modules (PAPER-NOTES §1).

The parts check nothing (the modules not even in ``__init__``); the values they would get wrong
are refused by config (tests/test_config.py::test_config_refuses_what_the_parts_would_get_wrong).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesncl.core import parts as P
from bayesncl.core.losses import bernoulli_kl, info_nce
from bayesncl.core.parts import Gate, GatingHead, NonNegative, Projector

from ..conftest import gen


def _linear_shapes(module: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


# ----------------------------------------------------------------------------- gates


def test_ste_forward_is_hard_mask_and_backward_identity() -> None:
    g = gen(4)
    alpha = torch.rand(6, 9, generator=g).requires_grad_()
    m = P.ste_gate(alpha, 0.5)
    torch.testing.assert_close(m, (alpha > 0.5).float(), rtol=0, atol=0)
    upstream = torch.randn(6, 9, generator=g)
    (m * upstream).sum().backward()
    torch.testing.assert_close(alpha.grad, upstream, rtol=0, atol=0)


def test_ste_threshold() -> None:
    alpha = torch.tensor([[0.2, 0.3, 0.31, 0.9]])
    assert P.ste_gate(alpha, 0.3).tolist() == [[0.0, 0.0, 1.0, 1.0]]


def test_soft_gate_is_alpha() -> None:
    alpha = torch.rand(3, 4)
    assert P.soft_gate(alpha) is alpha


@pytest.mark.parametrize("noise", ["gumbel", "logistic"])
def test_gumbel_gate_deterministic_with_generator(noise: str) -> None:
    logits = torch.randn(16, 32, generator=gen(5))
    m1, y1 = P.gumbel_sigmoid_gate(logits, noise=noise, generator=gen(123))
    m2, y2 = P.gumbel_sigmoid_gate(logits, noise=noise, generator=gen(123))
    m3, _ = P.gumbel_sigmoid_gate(logits, noise=noise, generator=gen(124))
    assert torch.equal(m1, m2) and torch.equal(y1, y2)
    assert not torch.equal(m1, m3)
    assert set(m1.unique().tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(m1, (y1 > 0.5).float(), rtol=0, atol=0)


@pytest.mark.parametrize("noise", ["gumbel", "logistic"])
def test_gumbel_gate_saturates_and_passes_gradient(noise: str) -> None:
    logits = torch.tensor([[50.0, -50.0, 80.0, -80.0]]).repeat(64, 1).requires_grad_()
    mask, y = P.gumbel_sigmoid_gate(logits, noise=noise, generator=gen(6))
    assert torch.equal(mask, torch.tensor([[1.0, 0.0, 1.0, 0.0]]).repeat(64, 1))
    # Moderate logits: gradient reaches them through y (STE), dmask/dlogit = y(1−y)/τ.
    x = torch.randn(8, 5, generator=gen(7)).requires_grad_()
    tau = 0.7
    mask, y = P.gumbel_sigmoid_gate(x, tau=tau, noise=noise, generator=gen(8))
    mask.sum().backward()
    torch.testing.assert_close(x.grad, (y * (1 - y) / tau).detach(), rtol=1e-5, atol=1e-7)
    assert x.grad.abs().sum() > 0


def test_gumbel_noise_distributions() -> None:
    shape = (200_000,)
    gum = P.gumbel_noise(shape, "gumbel", generator=gen(9))
    log = P.gumbel_noise(shape, "logistic", generator=gen(10))
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
    mask, _ = P.gumbel_sigmoid_gate(torch.full((100_000, 1), logit), noise="logistic", generator=gen(11))
    assert mask.mean().item() == pytest.approx(1 / (1 + math.exp(-logit)), abs=0.01)


# ----------------------------------------------------------------------------- TopK, φ


def test_topk_keeps_exactly_k_largest() -> None:
    z = torch.rand(10, 20, generator=gen(12)) + 0.1  # positive, ties have probability 0
    for k in (1, 5, 20):
        out = P.topk_mask(z, k)
        assert ((out != 0).sum(dim=1) == k).all()
        kept_min = torch.where(out != 0, out, torch.full_like(out, float("inf"))).min(dim=1).values
        dropped_max = torch.where(out == 0, z, torch.zeros_like(z)).max(dim=1).values
        assert (kept_min > dropped_max).all()
        torch.testing.assert_close(out[out != 0], z[out != 0], rtol=0, atol=0)
    assert P.topk_mask(torch.tensor([[0.25, 0.75, 0.125, 0.5]]), 2).tolist() == [[0.0, 0.75, 0.0, 0.5]]


def test_topk_gradient_only_to_kept() -> None:
    z = torch.tensor([[0.3, 0.9, 0.1, 0.5]], requires_grad=True)
    P.topk_mask(z, 2).sum().backward()
    assert z.grad.tolist() == [[0.0, 1.0, 0.0, 1.0]]


def test_rep_relu_forward_relu_backward_gelu() -> None:
    x = torch.linspace(-4, 4, 101).requires_grad_()
    y = P.rep_relu(x)
    torch.testing.assert_close(y, F.relu(x), rtol=0, atol=0)
    upstream = torch.randn(101, generator=gen(13))
    (g_rep,) = torch.autograd.grad((y * upstream).sum(), x)
    x2 = x.detach().clone().requires_grad_()
    (g_gelu,) = torch.autograd.grad((F.gelu(x2) * upstream).sum(), x2)
    torch.testing.assert_close(g_rep, g_gelu)
    assert g_rep[x.detach() < -0.5].abs().sum() > 0  # dead units still get gradient


@pytest.mark.parametrize("kind", P.NONNEG)
def test_nonnegative_kinds(kind: str) -> None:
    x = torch.randn(4, 6, generator=gen(14))
    expected = {
        "identity": x, "relu": F.relu(x), "rep_relu": F.relu(x), "gelu": F.gelu(x),
        "sigmoid": torch.sigmoid(x), "softplus": F.softplus(x), "exp": torch.exp(x),
        "leaky_relu": F.leaky_relu(x, 0.01),
    }[kind]
    torch.testing.assert_close(P.NONNEG[kind](x), expected)


# ----------------------------------------------------------------------------- gated features


def test_gated_features_value() -> None:
    z = torch.tensor([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    m = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    out = P.gated_features(z, m)
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0, 0.0], [s, s, 0.0]]))
    # A soft mask rescales before the second normalisation.
    soft = P.gated_features(torch.tensor([[1.0, 1.0]]), torch.tensor([[0.5, 1.0]]))
    torch.testing.assert_close(soft, torch.tensor([[1.0, 2.0]]) / math.sqrt(5))


def test_gated_features_fp16_and_bool_mask() -> None:
    z = torch.rand(4, 6, generator=gen(16)).half()
    mask = torch.rand(4, 6, generator=gen(17)) > 0.5
    mask[0] = False
    out = P.gated_features(z, mask)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert torch.equal(out[0], torch.zeros(6))


def test_safe_normalize_matches_f_normalize_on_nonzero_rows() -> None:
    x = torch.randn(5, 7, generator=gen(18), dtype=torch.float64).float()
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    up = torch.randn(5, 7, generator=gen(19))
    ya, yb = P.safe_normalize(a), F.normalize(b, dim=1)
    torch.testing.assert_close(ya, yb)
    (ya * up).sum().backward()
    (yb * up).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_safe_normalize_zero_and_non_finite_rows() -> None:
    x = torch.tensor([[0.0, 0.0, 0.0], [3.0, 0.0, 4.0], [float("nan"), 1.0, 1.0], [float("inf"), 1.0, 0.0]])
    x.requires_grad_()
    y = P.safe_normalize(x)
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
    torch.testing.assert_close(P.eval_features(z), torch.tensor([[0.6, 0.8], [0.0, 0.0]]))
    m = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(P.eval_features(z, m), torch.tensor([[0.0, 1.0], [0.0, 0.0]]))


# ----------------------------------------------------------------------------- modules


def test_projector_layout_and_forward() -> None:
    torch.manual_seed(0)
    proj = Projector(12, 32, 8)
    assert _linear_shapes(proj) == [(12, 32), (32, 8)]
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in proj.modules())
    h = torch.randn(5, 12)
    lin1, lin2 = (m for m in proj.modules() if isinstance(m, nn.Linear))
    torch.testing.assert_close(proj(h), lin2(F.relu(lin1(h))))


@pytest.mark.parametrize(
    "depth,expected",
    [(1, [(10, 6)]), (2, [(10, 16), (16, 6)]), (3, [(10, 16), (16, 8), (8, 6)])],
)
def test_gating_head_depths(depth: int, expected: list[tuple[int, int]]) -> None:
    head = GatingHead(10, 16, 6, depth=depth)
    assert _linear_shapes(head) == expected
    n_relu = sum(isinstance(m, nn.ReLU) for m in head.modules())
    assert n_relu == depth - 1
    assert head(torch.randn(4, 10)).shape == (4, 6)


def test_gating_head_tau_and_alpha() -> None:
    torch.manual_seed(1)
    head = GatingHead(6, 8, 5, tau=2.0)
    h = torch.randn(3, 6)
    raw = head.net(h)
    torch.testing.assert_close(head(h), raw / 2.0)
    torch.testing.assert_close(head.alpha(h), torch.sigmoid(raw / 2.0))


def test_gating_head_detach_isolates_backbone() -> None:
    torch.manual_seed(2)
    h = torch.randn(4, 6, requires_grad=True)
    head = GatingHead(6, 8, 5, detach=True)
    loss = bernoulli_kl(head.alpha(h), 0.8) + head(h).pow(2).sum()
    loss.backward()
    assert h.grad is None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_gating_head_no_detach_reaches_input() -> None:
    torch.manual_seed(3)
    h = torch.randn(4, 6, requires_grad=True)
    head = GatingHead(6, 8, 5, detach=False)
    head(h).pow(2).sum().backward()
    assert h.grad is not None and h.grad.abs().sum() > 0
    assert all(p.grad is not None for p in head.parameters())


def test_numpy_integer_dims_are_accepted() -> None:
    proj = Projector(np.int64(4), np.int32(8), np.int64(3))
    assert _linear_shapes(proj) == [(4, 8), (8, 3)]
    head = GatingHead(np.int64(4), np.int64(8), np.int16(3), depth=np.int64(3), tau=np.float32(2.0))
    assert _linear_shapes(head) == [(4, 8), (8, 4), (4, 3)]
    assert (head.tau, head.detach) == (2.0, True)


@pytest.mark.parametrize("kind", P.NONNEG)
def test_nonnegative_module(kind: str) -> None:
    x = torch.randn(3, 4)
    torch.testing.assert_close(NonNegative(kind)(x), P.NONNEG[kind](x))


def test_gate_ste() -> None:
    gate = Gate("ste")
    logits = torch.randn(6, 7, generator=gen(4)).requires_grad_()
    mask, alpha = gate(logits)
    torch.testing.assert_close(alpha, torch.sigmoid(logits))
    assert torch.equal(mask, (alpha > 0.5).float())
    mask.sum().backward()
    torch.testing.assert_close(logits.grad, (alpha * (1 - alpha)).detach())


def test_gate_soft() -> None:
    logits = torch.randn(3, 4)
    mask, alpha = Gate("soft")(logits)
    assert torch.equal(mask, alpha)
    torch.testing.assert_close(alpha, torch.sigmoid(logits))


def test_gate_none() -> None:
    assert Gate("none")(torch.randn(2, 3)) == (None, None)


@pytest.mark.parametrize("noise", ["gumbel", "logistic"])
def test_gate_gumbel_train_vs_eval(noise: str) -> None:
    gate = Gate("gumbel", threshold=0.5, gumbel_noise=noise)
    logits = torch.randn(64, 32, generator=gen(5)).requires_grad_()
    hard = (torch.sigmoid(logits) > 0.5).float()

    gate.train()
    m1, a1 = gate(logits, generator=gen(6))
    m2, _ = gate(logits, generator=gen(6))
    assert torch.equal(m1, m2)  # reproducible with a generator
    assert not torch.equal(m1, hard)  # noise flips some gates in training
    torch.testing.assert_close(a1, torch.sigmoid(logits))  # alpha is noise-free
    m1.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0

    gate.eval()
    m_eval, a_eval = gate(logits)
    assert torch.equal(m_eval, hard)  # no noise in eval
    assert torch.equal(gate(logits)[0], m_eval)
    torch.testing.assert_close(a_eval, torch.sigmoid(logits))


def test_gate_gumbel_matches_the_function() -> None:
    gate = Gate("gumbel", threshold=0.4, gumbel_noise="logistic").train()
    logits = torch.randn(5, 6, generator=gen(7))
    mask, _ = gate(logits, generator=gen(8))
    ref, _ = P.gumbel_sigmoid_gate(logits, 1.0, 0.4, "logistic", generator=gen(8))
    assert torch.equal(mask, ref)


def test_config_allows_exactly_the_registered_parts() -> None:
    from bayesncl.config import choices

    assert choices()["method.gate"] == P.GATE_KINDS
    assert choices()["method.nonneg"] == tuple(P.NONNEG)
    assert choices()["method.gumbel_noise"] == tuple(P.NOISES)


def test_end_to_end_gated_pipeline_finite() -> None:
    """Projector → φ → head → gate → z̃ → InfoNCE + λ·KL, backward reaches every part."""
    torch.manual_seed(9)
    h = torch.randn(8, 10, requires_grad=True)
    proj, head = Projector(10, 16, 6), GatingHead(10, 16, 6)
    gate, phi = Gate("ste"), NonNegative("rep_relu")
    z = phi(proj(h))
    mask, alpha = gate(head(h))
    loss = info_nce(P.gated_features(z, mask), 0.2) + 3e-5 * bernoulli_kl(alpha, 0.8)
    loss.backward()
    assert torch.isfinite(loss)
    assert h.grad is not None and torch.isfinite(h.grad).all()
    for p in [*proj.parameters(), *head.parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all()
