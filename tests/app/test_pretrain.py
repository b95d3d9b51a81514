"""End-to-end pretraining on tiny generated images: every preset, the run dir, the CLI errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from bayesncl.app.cli import main
from bayesncl.app.train import pretrain
from bayesncl.config import build_config

from ..conftest import TINY_BASE

TINY = [*TINY_BASE, "train.epochs=2"]


@pytest.mark.parametrize(
    "method",
    [pytest.param(m, marks=pytest.mark.slow) for m in ("cl", "ncl", "ncl-topk")]
    + ["bayesncl", pytest.param("bayesncl-gs", marks=pytest.mark.slow)],
)  # bayesncl: the fast selection's end-to-end run (gate, figures, evaluation); the others: --run-slow
def test_two_epoch_smoke_pretrain_every_preset(tmp_path: Path, method: str) -> None:
    cfg = build_config(overrides=[*TINY, f"method.name={method}", "method.lam=0.01"])
    metrics = pretrain(cfg, tmp_path / "run")
    run = tmp_path / "run"
    for name in (
        "config.yaml",
        "log.csv",
        "last.pt",
        "epoch-0001.pt",
        "epoch-0002.pt",
        "encoder.safetensors",
        "metrics.json",
        "metrics.md",
        "top_activations.png",
        "sparsity.png",
        "training_curves.png",
    ):
        assert (run / name).exists(), name
    assert not (run / "backbone_torchvision.pt").exists()  # small_cnn is no torchvision model
    assert (run / "suppressed_features.png").exists() == method.startswith("bayesncl")
    rows = list(csv.DictReader((run / "log.csv").open()))
    gate_columns = {"kl", "gate_open", "rho", "gate_mean_alpha", "rows_all_closed", "heldout_gate_open",
                    "heldout_gate_mean_alpha"}  # fmt: skip
    header = set(rows[0])
    assert gate_columns <= header if method.startswith("bayesncl") else not gate_columns & header
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert int(rows[-1]["step"]) == 2 * (96 // 32)
    for r in rows:
        assert torch.isfinite(torch.tensor(float(r["loss"])))
        if method.startswith("bayesncl"):
            assert 0.0 <= float(r["gate_open"]) <= 1.0 and float(r["kl"]) > 0
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["n_test"] == 60
    for key in (
        "semantic_consistency",
        "semantic_entropy_sum",
        "semantic_entropy_mean",
        "semantic_entropy_freq",
        "activation_ratio",
        "linear_probe_acc1",
    ):
        assert key in saved and saved[key] == pytest.approx(metrics[key])
    assert 0.0 <= saved["semantic_consistency"] <= 100.0
    if method == "cl":
        assert saved["activation_ratio"] == 1.0  # dense features: every dim active


@pytest.mark.slow
def test_run_dir_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1", "--no-eval"]) == 0
    before = (run / "last.pt").read_bytes()
    capsys.readouterr()
    assert main(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err
    assert (run / "last.pt").read_bytes() == before


@pytest.mark.slow
def test_resume_refuses_a_different_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["pretrain", "--run-dir", str(run), *TINY, "train.epochs=1", "--no-eval"]) == 0
    capsys.readouterr()
    code = main(["pretrain", "--run-dir", str(run), "--resume", *TINY, "train.epochs=2", "method.rho=0.5"])
    assert code == 2
    assert "differs from the run's in: method.rho" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_continues_to_the_same_weights(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), straight, evaluate=False)
    split = tmp_path / "split"
    pretrain(build_config(overrides=[*TINY, "train.epochs=1"]), split, evaluate=False)
    pretrain(build_config(overrides=[*TINY, "train.epochs=2"]), split, resume=True, evaluate=False)
    a = torch.load(straight / "last.pt", weights_only=True)["state_dict"]
    b = torch.load(split / "last.pt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["method.rho=1.5"], "method.rho=1.5: expected 0 < rho < 1"),
        (["method.lam=-1"], "method.lam=-1.0: expected lambda >= 0"),
        (["method.temperature=0"], "method.temperature=0.0: expected 0.01 <= temperature <= 10 (the paper"),
        (["method.bogus=1"], "unknown config key 'method.bogus'"),
        (["train.batch_size=1"], "train.batch_size=1: expected >= 2"),
        (["train.batch_size=500"], "500"),
        (["data.name=fashion-mnist", "data.root=/nonexistent/fmnist"], "/nonexistent/fmnist"),
        (["method.name=ncl-topk", "method.rho=0.01"], "TopK k=round(rho*D)=0"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    code = main(["pretrain", "--run-dir", str(run), *TINY, *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("bayesncl: error:") and "\n" not in err and "Traceback" not in err
    assert message in err
    assert not run.exists()


def test_cuda_requested_without_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["pretrain", "--run-dir", str(tmp_path / "r"), *TINY, "train.device=cuda"]) == 2
    assert "no CUDA device is available" in capsys.readouterr().err


def test_help_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    for key in ("method.rho=0.8", "method.lam=3e-05", "data.root=None", "train.epochs=200", "seed=0",
                "train.checkpoint_every=10"):
        assert key in out


def test_the_epoch_line_shows_a_percent_statistic_in_percent_as_log_csv(registry: None) -> None:
    """A method's ``Statistic(short=..., percent=True)`` is × 100 on the progress bar and the epoch line,
    as in log.csv (it showed the fraction: ``act 0.56`` beside ``z_active`` 55.9 in log.csv)."""
    import dataclasses

    import bayesncl
    from bayesncl.app.fit import shown
    from bayesncl.core import methods

    active = methods.Statistic("z_active", lambda step: (step.out.z > 0).float().mean(), short="act",
                               percent=True)
    bayesncl.register_method(dataclasses.replace(methods.get("ncl"), name="ncl-act", source=None,
                                                 stats=(*methods.get("ncl").stats, active)))
    cfg = build_config(overrides=["method.name=ncl-act"])
    stats = methods.get(cfg.method.name).stats
    assert shown(stats, {"loss": 4.5, "info_nce": 4.5, "z_active": 0.56}) == {
        "loss": "4.50", "InfoNCE": "4.50", "act": "56.0 %"}
