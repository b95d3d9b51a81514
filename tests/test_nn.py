"""Tests for the thin modules in bayesncl.core.parts (PAPER-NOTES §1)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bayesncl.core import functional as BF
from bayesncl.core.parts import GATE_KINDS, Gate, GatingHead, NonNegative, Projector


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _linear_shapes(module: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


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
    loss = BF.bernoulli_kl(head.alpha(h), 0.8) + head(h).pow(2).sum()
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


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"depth": 4}, "depth=4"),
        ({"depth": 0}, "depth=0"),
        ({"tau": 0.0}, "tau=0.0"),
        ({"tau": -1.0}, "tau=-1.0"),
        ({"hidden": 0}, "hidden=0"),
        ({"hidden": 1, "depth": 3}, "hidden=1"),
        ({"in_dim": -3}, "in_dim=-3"),
    ],
)
def test_gating_head_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"in_dim": 4, "hidden": 8, "out_dim": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        GatingHead(**args)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"detach": "no"}, "GatingHead: detach='no': expected a bool (True or False)"),
        ({"detach": 1}, "GatingHead: detach=1: expected a bool (True or False)"),
        ({"depth": 2.0}, "GatingHead: depth=2.0: expected the integer 1, 2 or 3"),
        ({"depth": True}, "GatingHead: depth=True: expected the integer 1, 2 or 3"),
        ({"hidden": 8.0}, "GatingHead: hidden=8.0: expected an integer >= 1"),
        ({"out_dim": True}, "GatingHead: out_dim=True: expected an integer >= 1"),
        ({"tau": "1"}, "GatingHead: tau='1': expected a finite number > 0"),
    ],
)
def test_gating_head_argument_types(kwargs: dict, message: str) -> None:
    args = {"in_dim": 4, "hidden": 8, "out_dim": 3, **kwargs}
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        GatingHead(**args)


def test_numpy_integer_dims_are_accepted() -> None:
    proj = Projector(np.int64(4), np.int32(8), np.int64(3))
    assert _linear_shapes(proj) == [(4, 8), (8, 3)]
    head = GatingHead(np.int64(4), np.int64(8), np.int16(3), depth=np.int64(3), tau=np.float32(2.0))
    assert _linear_shapes(head) == [(4, 8), (8, 4), (4, 3)]
    assert (type(head.depth), head.tau, head.detach) == (int, 2.0, True)


def test_projector_bad_arguments() -> None:
    with pytest.raises(ValueError, match="out_dim=0"):
        Projector(4, 8, 0)
    with pytest.raises(ValueError, match=r"^Projector: in_dim=4\.0: expected an integer >= 1$"):
        Projector(4.0, 8, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^Projector: hidden=True: expected an integer >= 1$"):
        Projector(4, True, 3)


@pytest.mark.parametrize("kind", BF.NONNEG_KINDS)
def test_nonnegative_module(kind: str) -> None:
    x = torch.randn(3, 4)
    torch.testing.assert_close(NonNegative(kind)(x), BF.nonnegative(x, kind))


def test_nonnegative_module_bad_kind() -> None:
    with pytest.raises(ValueError, match="kind='abs'"):
        NonNegative("abs")


def test_gate_ste() -> None:
    gate = Gate("ste")
    logits = torch.randn(6, 7, generator=_gen(4)).requires_grad_()
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
    logits = torch.randn(64, 32, generator=_gen(5)).requires_grad_()
    hard = (torch.sigmoid(logits) > 0.5).float()

    gate.train()
    m1, a1 = gate(logits, generator=_gen(6))
    m2, _ = gate(logits, generator=_gen(6))
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


def test_gate_gumbel_matches_functional() -> None:
    gate = Gate("gumbel", threshold=0.4, gumbel_noise="logistic").train()
    logits = torch.randn(5, 6, generator=_gen(7))
    mask, _ = gate(logits, generator=_gen(8))
    ref, _ = BF.gumbel_sigmoid_gate(logits, 1.0, 0.4, "logistic", generator=_gen(8))
    assert torch.equal(mask, ref)


@pytest.mark.parametrize(
    "args,match",
    [
        (("hard",), "kind='hard'"),
        (("ste", 0.0), "threshold=0.0"),
        (("ste", 1.2), "threshold=1.2"),
        (("gumbel", 0.5, "normal"), "gumbel_noise='normal'"),
    ],
)
def test_gate_bad_arguments(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Gate(*args)


def test_gate_kinds_match_config() -> None:
    from bayesncl.config import CHOICES

    assert tuple(CHOICES["method.gate"]) == GATE_KINDS
    assert tuple(CHOICES["method.nonneg"]) == BF.NONNEG_KINDS
    assert tuple(CHOICES["method.gumbel_noise"]) == BF.GUMBEL_NOISES


def test_end_to_end_gated_pipeline_finite() -> None:
    """Projector → φ → head → gate → z̃ → InfoNCE + λ·KL, backward reaches every part."""
    torch.manual_seed(9)
    h = torch.randn(8, 10, requires_grad=True)
    proj, head = Projector(10, 16, 6), GatingHead(10, 16, 6)
    gate, phi = Gate("ste"), NonNegative("rep_relu")
    z = phi(proj(h))
    mask, alpha = gate(head(h))
    loss = BF.info_nce(BF.gated_features(z, mask), 0.2) + 3e-5 * BF.bernoulli_kl(alpha, 0.8)
    loss.backward()
    assert torch.isfinite(loss)
    assert h.grad is not None and torch.isfinite(h.grad).all()
    for p in [*proj.parameters(), *head.parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all()
