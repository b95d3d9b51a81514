"""Model assembly and gradient isolation (PAPER-NOTES §1: the KL term reaches only the gate)."""

from __future__ import annotations

import pytest
import torch

from bayesncl.config import build_config
from bayesncl.core.losses import bernoulli_kl
from bayesncl.core.model import build_model, contrastive_loss
from bayesncl.core.parts import gated_features


def _model(*overrides: str, backbone: str = "small_cnn"):
    cfg = build_config(
        overrides=[f"model.backbone={backbone}", "model.proj_hidden=32", "model.proj_dim=16", *overrides]
    )
    torch.manual_seed(0)
    return build_model(cfg, in_channels=1, image_size=16, num_classes=3), cfg


def _grads(model, loss) -> dict[str, float]:
    model.zero_grad(set_to_none=True)
    loss.backward(retain_graph=True)
    out = {}
    for part in ("backbone", "projector", "gating_head"):
        mod = getattr(model, part)
        total = sum(float(p.grad.abs().sum()) for p in mod.parameters() if p.grad is not None)
        out[part] = total
    return out


def test_kl_reaches_only_the_gate() -> None:
    model, cfg = _model("method.name=bayesncl")
    out = model(torch.randn(8, 1, 16, 16))
    kl = bernoulli_kl(out.alpha, cfg.method.rho)
    g = _grads(model, kl)
    assert g["backbone"] == 0.0 and g["projector"] == 0.0
    assert g["gating_head"] > 0.0


def test_no_detach_ablation_lets_kl_reach_backbone() -> None:
    model, cfg = _model("method.name=bayesncl", "method.detach=false")
    out = model(torch.randn(8, 1, 16, 16))
    g = _grads(model, bernoulli_kl(out.alpha, cfg.method.rho))
    assert g["backbone"] > 0.0 and g["gating_head"] > 0.0
    assert g["projector"] == 0.0  # the gate reads h, not p


def test_infonce_reaches_backbone_and_gate_through_ste() -> None:
    model, cfg = _model("method.name=bayesncl")
    out = model(torch.randn(8, 1, 16, 16))
    loss, parts = contrastive_loss(out, cfg.method)
    g = _grads(model, loss)
    assert all(v > 0 for v in g.values())


@pytest.mark.parametrize(
    ("name", "gated", "topk"),
    [
        ("cl", False, 0),
        ("ncl", False, 0),
        ("ncl-topk", False, 13),
        ("bayesncl", True, 0),
        ("bayesncl-gs", True, 0),
    ],
)
def test_presets_build_the_right_parts(name: str, gated: bool, topk: int) -> None:
    model, cfg = _model(f"method.name={name}")
    assert (model.gating_head is not None) == gated
    assert model.topk == topk  # round(0.8 * 16) = 13
    model.eval()
    out = model(torch.randn(6, 1, 16, 16))
    assert out.h.shape == (6, 256) and out.z.shape == (6, 16) and out.z_tilde.shape == (6, 16)
    norms = out.z_tilde.norm(dim=1)
    assert torch.all(((norms - 1).abs() < 1e-5) | (norms == 0))
    if name != "cl":
        assert torch.all(out.z >= 0)
    if topk:
        assert torch.all((out.z > 0).sum(1) <= topk)
    if gated:
        assert set(out.mask.unique().tolist()) <= {0.0, 1.0}
        expected = gated_features(out.z, out.mask)
        torch.testing.assert_close(out.z_tilde, expected)


def test_eval_features_follow_paper_notes_section3() -> None:
    # BayesNCL: normalize(normalize(z) * m_hard), with m_hard = 1[alpha > 0.5] in eval mode.
    model, _ = _model("method.name=bayesncl-gs")
    model.eval()
    out = model(torch.randn(5, 1, 16, 16))
    m_hard = (out.alpha > 0.5).float()
    torch.testing.assert_close(out.mask, m_hard)
    ref = torch.nn.functional.normalize(torch.nn.functional.normalize(out.z, dim=1) * m_hard, dim=1)
    torch.testing.assert_close(out.z_tilde, ref)


@pytest.mark.parametrize(
    ("backbone", "stem", "h_dim"), [("resnet18", "true", 512), ("resnet18", "false", 512)]
)
def test_resnet_stems(backbone: str, stem: str, h_dim: int) -> None:
    model, _ = _model(f"model.cifar_stem={stem}", backbone=backbone)
    conv1 = model.backbone.conv1
    if stem == "true":
        assert conv1.kernel_size == (3, 3) and conv1.stride == (1, 1)
        assert isinstance(model.backbone.maxpool, torch.nn.Identity)
    else:
        assert conv1.kernel_size == (7, 7) and conv1.stride == (2, 2)
    assert conv1.in_channels == 1
    assert model.h_dim == h_dim
