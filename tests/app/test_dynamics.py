"""Gradient dynamics (Table 3): correlations on known orderings, and the command end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.dynamics import dynamics_command
from bayesncl.app.train import pretrain
from bayesncl.config import build_config
from bayesncl.core.model import build_model, contrastive_loss
from bayesncl.metrics.dynamics import dynamics_correlations, gradient_variance

from ..conftest import TINY_BASE

TINY = [*TINY_BASE, "train.epochs=2"]


def test_correlations_of_known_orderings() -> None:
    af = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.0])  # the last dim never fires: excluded
    gv = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 99.0])
    sc = np.array([0.2, 0.4, 0.5, 0.8, 0.9, np.nan])
    c = dynamics_correlations(af, gv, sc)
    assert c["dims"] == 5
    assert c["AF-GV"] == pytest.approx(-1.0)
    assert c["GV-SC"] == pytest.approx(-1.0)
    assert c["AF-SC"] == pytest.approx(1.0)
    assert math.isnan(dynamics_correlations(af[:2], gv[:2], sc[:2])["AF-GV"])  # < 3 dims


def test_gradient_variance_matches_per_sample_autograd() -> None:
    cfg = build_config(overrides=[*TINY, "method.name=bayesncl"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    x1, x2 = torch.randn(6, 3, 16, 16), torch.randn(6, 3, 16, 16)
    gv, used = gradient_variance(model, [(x1, x2, None)], cfg, samples=6)
    assert used == 6
    model.eval()
    out = model(torch.cat([x1, x2]))
    loss, _ = contrastive_loss(out, cfg.method)
    (g,) = torch.autograd.grad(loss, out.z)
    ref = (12 * g).double().var(dim=0, unbiased=False).numpy()
    np.testing.assert_allclose(gv, ref, rtol=1e-6, atol=1e-12)
    assert gv.shape == (16,) and (gv > 0).any()


@pytest.mark.parametrize("method", ["ce", "ncl-supcon"])
def test_gradient_variance_of_a_supervised_method_uses_the_labels(method: str) -> None:
    """The loader's labels reach a supervised loss (the dynamics of a `ce` run crashed without them)."""
    cfg = build_config(overrides=[*TINY, f"method.name={method}"])
    torch.manual_seed(0)
    model = build_model(cfg, 3, 16, 10)
    x1, x2 = torch.randn(6, 3, 16, 16), torch.randn(6, 3, 16, 16)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    gv, used = gradient_variance(model, [(x1, x2, y)], cfg, samples=6)
    model.eval()
    out = model(torch.cat([x1, x2]))
    loss, _ = contrastive_loss(out, cfg.method, labels=y)
    (g,) = torch.autograd.grad(loss, out.z)
    ref = (12 * g).double().var(dim=0, unbiased=False).numpy()
    np.testing.assert_allclose(gv, ref, rtol=1e-6, atol=1e-12)
    assert used == 6 and (gv > 0).any()


@pytest.mark.slow
def test_dynamics_command_over_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    pretrain(build_config(overrides=[*TINY, "method.name=bayesncl", "train.epochs=2"]), run, evaluate=False)
    result = dynamics_command(run, samples=64)
    assert [r["epoch"] for r in result["rows"]] == [1, 2]
    for r in result["rows"]:
        for k in ("AF-GV", "GV-SC", "AF-SC"):
            assert math.isnan(r[k]) or -1.0 <= r[k] <= 1.0
    saved = json.loads((run / "dynamics.json").read_text())
    assert len(saved["rows"]) == 2 and (run / "dynamics.png").exists() and (run / "dynamics.md").exists()
    assert saved["samples"] == 64  # two batches of 32
    # More samples than the 96 train images: the record says what was used, 3 whole batches.
    assert dynamics_command(run, samples=99999, every=2)["samples"] == 96
    assert json.loads((run / "dynamics.json").read_text())["samples"] == 96
    # Whole batches: 40 asked, two batches of 32 used.
    assert dynamics_command(run, samples=40, every=2)["samples"] == 64


def test_undefined_correlations_are_null_in_the_json(tmp_path: Path) -> None:
    """dynamics.json held the token NaN for an undefined correlation (< 3 dims, or a constant input),
    which strict JSON readers (jq, JavaScript, json.loads(..., parse_constant=...)) refuse."""
    from bayesncl.app.report import write_results

    rows = [{"epoch": 1, "dims": 2, "AF-GV": float("nan"), "GV-SC": np.float64("inf"), "AF-SC": 0.5}]
    write_results(tmp_path, "dynamics", {"rows": rows, "samples": np.int64(64)}, "| table |")

    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    saved = json.loads((tmp_path / "dynamics.json").read_text(), parse_constant=refuse)
    assert saved["rows"] == [{"epoch": 1, "dims": 2, "AF-GV": None, "GV-SC": None, "AF-SC": 0.5}]
    assert saved["samples"] == 64
