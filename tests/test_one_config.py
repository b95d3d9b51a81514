"""One way to a config (``config.build_config``), checked once, and the facts a run derives from it
(``app.train.RunFacts``), computed once and passed down (issue 22, item 5)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import bayesncl
import bayesncl.app.train as train_module
import bayesncl.config as config_module
import bayesncl.data.sources as sources
from bayesncl.app.cli import main
from bayesncl.config import Config, ConfigError, build_config, dump_yaml
from bayesncl.runs.export import load_run_config
from bayesncl.runs.safe_load import load_checkpoint_file

from .conftest import TINY_BASE

TINY = [*TINY_BASE, "method.name=bayesncl", "method.lam=0.01", "train.epochs=1"]
EXAMPLE = Path(__file__).parents[1] / "examples" / "ncl_l1.py"


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """Every config :func:`bayesncl.config.validate` checks during the test."""
    seen: list[Config] = []
    real = config_module.validate

    def counted(cfg: Config) -> None:
        seen.append(cfg)
        real(cfg)

    monkeypatch.setattr(config_module, "validate", counted)
    return seen


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """The configs the CLI's ``pretrain`` hands to the library (nothing is trained)."""
    got: list[Config] = []
    monkeypatch.setattr(train_module, "pretrain", lambda cfg, *a, **k: got.append(cfg) or {})
    return got


def _run_dir(tmp_path: Path, overrides: list[str]) -> Path:
    """A run dir holding only the ``config.yaml`` of ``overrides``, as a run killed early leaves it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(build_config(overrides=overrides)))
    return run


@pytest.mark.slow
def test_resume_builds_the_runs_saved_config_checked_once(
    tmp_path: Path, trained: list[Config], validations: list[Config]
) -> None:
    run = _run_dir(tmp_path, TINY)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    validations.clear()
    assert main(["pretrain", "--run-dir", str(run), "--resume", "train.epochs=4"]) == 0
    (cfg,) = trained
    assert len(validations) == 1 and validations[0] is cfg  # checked once, in bayesncl.config
    assert cfg.train.epochs == 4
    saved["train"]["epochs"] = 4
    assert cfg.to_dict() == saved  # the run's config, the override on top, nothing else
    assert cfg == build_config(overrides=[*TINY, "train.epochs=4"])


def test_reloading_a_run_checks_its_config_once_and_names_the_file_at_fault(
    tmp_path: Path, validations: list[Config]
) -> None:
    run = _run_dir(tmp_path, TINY)
    validations.clear()
    cfg = load_run_config(run, ["data.root=/elsewhere", "eval.batch_size=7"])
    assert len(validations) == 1
    assert (cfg.data.root, cfg.eval.batch_size, cfg.method.lam) == ("/elsewhere", 7, 0.01)
    with pytest.raises(ConfigError) as bad_override:  # the command line's value: no file named
        load_run_config(run, ["eval.batch_size=0"])
    assert str(bad_override.value) == "eval.batch_size=0: expected >= 1"
    text = (run / "config.yaml").read_text().replace("batch_size: 64", "batch_size: 0")
    (run / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as bad_file:  # the file's value
        load_run_config(run)
    assert str(bad_file.value) == f"the config in {run / 'config.yaml'}: eval.batch_size=0: expected >= 1"
    assert load_run_config(run, ["eval.batch_size=8"]).eval.batch_size == 8  # an override mends it


@pytest.mark.slow
def test_the_python_api_and_the_cli_build_the_same_config(
    tmp_path: Path, trained: list[Config], validations: list[Config], registry: None
) -> None:
    given = ["method.name=ncl-l1-example", "method.l1_weight=0.5", "train.epochs=2", "data.train_subset=500"]
    args = ["pretrain", "--config", "fashion-mnist-demo", "--plugin", str(EXAMPLE), "--run-dir", "r"]
    assert main([*args, *given]) == 0
    api = bayesncl.build_config(given, "fashion-mnist-demo", plugins=[EXAMPLE])
    assert trained == [api]
    assert (api.method.name, api.method.own, api.train.epochs) == ("ncl-l1-example", {"l1_weight": 0.5}, 2)
    assert len(validations) == 2  # once for each
    # a Config handed back to build_config is reloaded as it is
    assert build_config(api) == api and build_config(api.to_dict()) == api


@pytest.mark.slow
def test_the_run_facts_are_computed_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One tiny pretrain with its held-out batch and its evaluation reads the dataset's facts once,
    and the peak learning rates once; the facts are what the loop and the loader use."""
    calls: dict[str, int] = {"dataset_info": 0, "peak_lrs": 0}

    def counting(name: str, real: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return counted

    import bayesncl.core.optim as optim

    real, info = sources.dataset_info, counting("dataset_info", sources.dataset_info)
    for module in list(sys.modules.values()):  # every module that imported the function by name
        if module.__name__.startswith("bayesncl") and getattr(module, "dataset_info", None) is real:
            monkeypatch.setattr(module, "dataset_info", info)
    monkeypatch.setattr(train_module, "peak_lrs", counting("peak_lrs", optim.peak_lrs))
    monkeypatch.setattr(optim, "peak_lrs", train_module.peak_lrs)
    facts: list[train_module.RunFacts] = []
    real_train = train_module.train
    monkeypatch.setattr(train_module, "train", lambda cfg, run, f: facts.append(f) or real_train(cfg, run, f))
    cfg = build_config(overrides=[*TINY, "train.monitor_samples=16"])
    metrics = train_module.pretrain(cfg, tmp_path / "run")
    assert calls == {"dataset_info": 1, "peak_lrs": 1}
    (f,) = facts
    assert f.data.num_train == 96 and f.eval_data is f.data  # the same data, read once
    last = load_checkpoint_file(tmp_path / "run" / "last.pt")
    assert f.steps_per_epoch == 96 // 32 == last["steps_per_epoch"] == last["step"]  # the loader's batches
    assert f.peak_lrs["encoder"] == pytest.approx(cfg.train.base_lr * 32 / 256)
    assert "linear_probe_acc1" in metrics and (tmp_path / "run" / "log.csv").read_text().count("\n") == 2
