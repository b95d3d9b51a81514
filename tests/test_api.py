"""``import bayesncl``: the main API, and that importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import bayesncl
from bayesncl.config import ConfigError

from .conftest import TINY_BASE


def test_import_loads_no_torch() -> None:
    src = Path(__file__).parents[1] / "src"
    code = "import sys, bayesncl; print('torch' in sys.modules, sorted(bayesncl.__all__))"
    env = {"PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    names = "['build_config', 'evaluate', 'load_encoder', 'metrics', 'pretrain']"
    assert out.stdout == f"False {names}\n"


def test_build_config_takes_overrides_then_a_recipe() -> None:
    cfg = bayesncl.build_config(["method.name=ncl", "train.epochs=30"])
    assert (cfg.method.name, cfg.train.epochs) == ("ncl", 30)
    assert bayesncl.build_config(config="fashion-mnist-demo").data.name == "fashion-mnist"
    with pytest.raises(ConfigError, match="unknown config key 'method.bogus'"):
        bayesncl.build_config(["method.bogus=1"])
    with pytest.raises(AttributeError):
        bayesncl.bogus  # noqa: B018


def test_pretrain_evaluate_load_encoder_and_metrics(tmp_path: Path) -> None:
    import torch

    from bayesncl.app.evaluate import evaluate_command
    from bayesncl.app.train import pretrain
    from bayesncl.core.model import ContrastiveModel

    assert bayesncl.pretrain is pretrain and bayesncl.evaluate is evaluate_command
    cfg = bayesncl.build_config([*TINY_BASE, "train.epochs=1"])
    run = tmp_path / "run"
    assert bayesncl.pretrain(cfg, run, evaluate=False) == {}
    report = bayesncl.evaluate(run, knn=False, probe="none")
    assert 0 <= report["semantic_consistency"] <= 100
    model = bayesncl.load_encoder(run, torch.device("cpu"))
    assert isinstance(model, ContrastiveModel) and not model.training
    x = torch.zeros(2, 3, 16, 16)
    assert model(x).z.shape == (2, cfg.model.proj_dim)
    assert bayesncl.metrics.semantic_consistency is not None
    assert bayesncl.metrics.compute_all is bayesncl.metrics.registry.compute_all
