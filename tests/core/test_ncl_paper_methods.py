"""The NCL paper's other methods on the registry: cl-l1, ncl-l1, scl, ncl-scl, scl-l1, supcon,
ncl-supcon, ce, nce, and the gate switched on any of them.

Each method's loss on a real model output equals its definition computed from the pure functions
of bayesncl.core.losses (tested against naive loops in tests/core/test_objectives.py); bad input
(β < 0, a supervised method without labels, a gate on a method with nothing to gate) is one line.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from bayesncl.app.cli import main
from bayesncl.config import ConfigError, build_config
from bayesncl.core import methods
from bayesncl.core.engine import TrainForward, forward_loss
from bayesncl.core.losses import (
    clip_norm,
    info_nce,
    l1_penalty,
    linear_cross_entropy,
    spectral_loss,
    supcon_loss,
)
from bayesncl.core.model import build_model, contrastive_loss
from bayesncl.core.parts import rep_relu

from ..conftest import ROWS, TINY_BASE, error_line, expect

NEW = ("cl-l1", "ncl-l1", "scl", "ncl-scl", "scl-l1", "supcon", "ncl-supcon", "ce", "nce")
SUPERVISED = ("supcon", "ncl-supcon", "ce", "nce")


def _run(method: str, *extra: str) -> tuple[object, torch.Tensor, torch.Tensor, object]:
    """A tiny model of ``method`` (seeded), its output on 2×4 random views, and their labels."""
    cfg = build_config(overrides=[*TINY_BASE, f"method.name={method}", *extra])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 3, 16, 16, generator=g)
    y = torch.tensor([0, 1, 2, 0])
    return cfg, model(x, views=2), y, model


def test_each_method_is_registered_with_its_parts_and_keys() -> None:
    assert list(methods.METHODS)[-len(NEW):] == list(NEW)
    for name in NEW:
        m = methods.get(name)
        assert m.nonneg == ("identity" if name in ("cl-l1", "scl", "scl-l1", "supcon", "ce") else "rep_relu")
        assert m.needs_labels == (name in SUPERVISED) and not m.gated
    assert methods.preset("ncl-l1")["beta"] == 0.01 and methods.preset("scl")["mu"] == 1.0
    assert set(methods.preset("scl-l1")) >= {"beta", "mu"}


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_l1_methods_add_beta_times_mean_l1_of_the_unit_rows(beta: float) -> None:
    for name in ("cl-l1", "ncl-l1"):
        cfg, out, y, _ = _run(name, f"method.beta={beta}")
        loss, terms = contrastive_loss(out, cfg.method, labels=y)
        expected = info_nce(out.z_tilde, 0.2) + beta * l1_penalty(out.z_tilde)
        torch.testing.assert_close(loss, expected)
        assert set(terms) == {"info_nce", "l1_penalty"}
        assert float(terms["l1_penalty"]) >= 1.0  # a unit row has ‖·‖₁ ≥ 1
    cfg, out, y, _ = _run("scl-l1", f"method.beta={beta}", "method.mu=0.5")
    loss, _ = contrastive_loss(out, cfg.method)
    torch.testing.assert_close(loss, spectral_loss(out.z, 0.5) + beta * l1_penalty(clip_norm(out.z, 0.5)))


def test_spectral_methods_use_raw_features_and_ncl_scl_is_non_negative() -> None:
    for name in ("scl", "ncl-scl"):
        cfg, out, _, _ = _run(name)
        loss, terms = contrastive_loss(out, cfg.method)
        torch.testing.assert_close(loss, spectral_loss(out.z, 1.0))
        assert set(terms) == {"spectral"}
    assert (out.z >= 0).all() and (out.z == rep_relu(out.p)).all()


def test_supcon_methods_read_the_labels() -> None:
    for name in ("supcon", "ncl-supcon"):
        cfg, out, y, _ = _run(name)
        loss, _ = contrastive_loss(out, cfg.method, labels=y)
        torch.testing.assert_close(loss, supcon_loss(out.z_tilde, torch.cat([y, y]), 0.2))
        other, _ = contrastive_loss(out, cfg.method, labels=torch.arange(4))  # one class per image
        torch.testing.assert_close(other, info_nce(out.z_tilde, 0.2))


def test_ce_and_nce_train_their_own_classifier_on_z() -> None:
    for name in ("ce", "nce"):
        cfg, out, y, model = _run(name)
        head = model.heads["classifier"]
        loss, terms = contrastive_loss(out, cfg.method, labels=y)
        z = out.p if name == "ce" else torch.relu(out.p)
        torch.testing.assert_close(loss, linear_cross_entropy(z, torch.cat([y, y]), head.weight, head.bias))
        loss.backward()
        assert head.weight.grad is not None and model.projector.net[0].weight.grad is not None
        assert model.classifier.weight.grad is None  # the online probe learns from its own loss only


def test_training_step_logs_each_methods_statistics() -> None:
    for name in NEW:
        cfg, _, y, model = _run(name)
        g = torch.Generator().manual_seed(2)
        x1, x2 = torch.randn(4, 3, 16, 16, generator=g), torch.randn(4, 3, 16, 16, generator=g)
        loss, stats = forward_loss(TrainForward(model), x1, x2, y, cfg.method)
        assert torch.isfinite(loss), name
        own = {t.name for t in methods.get(name).terms}
        assert own <= set(stats) and {"loss", "online_acc"} <= set(stats), name
        assert ("train_acc" in stats) == (name in ("ce", "nce"))


def test_the_gate_switches_on_any_loss() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "turns method.name=scl into bayesncl" warning
        cfg, out, y, model = _run("scl", "method.gate=ste", "method.lam=0.01")
    assert model.gating_head is not None and out.mask is not None
    loss, terms = contrastive_loss(out, cfg.method)
    assert set(terms) == {"spectral", "kl"}
    torch.testing.assert_close(terms["spectral"], spectral_loss(out.z * out.mask, 1.0))
    for name in ("supcon", "nce", "cl-l1"):
        cfg, out, y, _ = _run(name, "method.gate=ste", "method.lam=0.01")
        _, terms = contrastive_loss(out, cfg.method, labels=y)
        assert "kl" in terms and float(terms["kl"]) > 0, name


def test_negative_beta_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY_BASE, "method.name=ncl-l1",
                 "method.beta=-0.1"]) == 2  # fmt: skip
    expect("C17", error_line(capsys), tmp_path)
    assert not (tmp_path / "r").exists()


def test_supervised_method_without_labels_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in SUPERVISED:
        assert main(["pretrain", "--run-dir", str(tmp_path / name), *TINY_BASE, f"method.name={name}",
                     "data.labels=none"]) == 2  # fmt: skip
        msg = error_line(capsys)
        assert msg == ROWS["C18"].replace("supcon", name), msg
    flat = tmp_path / "flat"  # images without class folders: no labels
    flat.mkdir()
    for i in range(12):
        Image.fromarray(np.full((20, 20, 3), 10 * i, dtype=np.uint8)).save(flat / f"{i}.png")
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY_BASE, "method.name=ce",
                 "data.name=imagefolder", f"data.root={flat}", "data.train_subset=0", "data.test_subset=0",
                 ]) == 2  # fmt: skip
    expect("C19", error_line(capsys), tmp_path)
    assert not (tmp_path / "r").exists()


def test_gate_on_a_method_with_nothing_to_gate_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    h_only = methods.Method("h-only", nonneg="identity", terms=methods.get("cl").terms,
                            stats=methods.get("cl").stats, gateable=False, source="test")  # fmt: skip
    methods.register_method(h_only)
    try:
        with pytest.raises(ConfigError) as e:
            build_config(overrides=["method.name=h-only", "method.gate=ste"])
        expect("C20", str(e.value), Path("."))
        build_config(overrides=["method.name=h-only"])  # without the gate it is fine
    finally:
        del methods.METHODS["h-only"]


@pytest.mark.slow
def test_a_supervised_method_trains_probes_and_evaluates(tmp_path: Path) -> None:
    """nce end to end on tiny synthetic data: labels reach the loss, the online probe and the
    evaluation (SC, LP@1) run as for a self-supervised method, and the classifier is saved."""
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY_BASE, "train.epochs=1", "method.name=nce"]) == 0
    header, row = (run / "log.csv").read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(","), strict=True))
    assert float(values["cross_entropy"]) > 0 and float(values["online_acc"]) >= 0 and "train_acc" in values
    metrics = (run / "metrics.json").read_text()
    assert "semantic_consistency" in metrics and "linear_probe_acc1" in metrics
    state = torch.load(run / "last.pt", weights_only=True)["state_dict"]
    assert "heads.classifier.weight" in state
