"""``reproduce ID --plan`` prints at once; it times training steps here only with ``--time`` (issue 47,
item 6a): a GPU recipe's plan on a CPU no longer waits minutes for three steps nobody asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

import bayesncl.app.timing as timing
from bayesncl.app.cli import main

from ..conftest import TINY, expect


@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake(cfg, steps: int = 3) -> float:  # noqa: ANN001 - the measured function's signature
        calls.append(cfg.method.name)
        return 1000.0  # images/s

    monkeypatch.setattr(timing, "images_per_second", fake)
    return calls


def _args(tmp_path: Path) -> list[str]:
    return ["reproduce", "1", "--dataset", "fashion-mnist", "--store", str(tmp_path / "store"),
            "--run-dir", str(tmp_path / "t"), *TINY]  # fmt: skip


def test_plan_without_time_measures_nothing(
    tmp_path: Path, timings: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_args(tmp_path), "--plan"]) == 0
    out = capsys.readouterr().out
    assert timings == [] and "timing " not in out
    assert ": none, not timed: 5 run(s) of a cost no stored run's log.csv gives a rate for (--plan --time " \
           "times 3 training steps here)\n" in out
    assert not (tmp_path / "t").exists() and not (tmp_path / "store").exists()


def test_plan_with_time_measures_each_cost_once(
    tmp_path: Path, timings: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_args(tmp_path), "--plan", "--time"]) == 0
    out = capsys.readouterr().out
    assert 1 <= len(timings) <= 5 and "not timed" not in out
    assert "(from a 3-step measurement; evaluation not included)" in out
    # 1 epoch of 96 images at 1000 images/s per run, 5 runs: about 0.5 s in all (whole batches only)
    assert "estimated training time on this device (" in out and "): 0 s (from a 3-step" in out


def test_time_without_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_args(tmp_path), "--time"]) == 2
    expect("C22", capsys.readouterr().err, tmp_path)
    assert not (tmp_path / "t").exists()


def test_plan_estimates_from_a_stored_runs_log_without_timing(
    tmp_path: Path, timings: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A stored run of the same cost (backbone, size, batch, device, ...): its log.csv rate serves every
    run of the plan, nothing is timed; 3 steps of 32 images in 0.96 s = 100 images/s, and each of the 5
    runs trains 1 epoch of 3 steps x 32 = 96 images: 5 x 0.96 s = 4.8 s, printed as 5 s."""
    from bayesncl.config import dump_yaml
    from bayesncl.paper import studies
    from bayesncl.paper.reproduce import study_configs
    from bayesncl.runs.logs import LOG_FIELDS, write_log

    fake = tmp_path / "store" / "stored-run"  # another method's run of the recipe: the same cost
    fake.mkdir(parents=True)
    cfg = study_configs(studies.build("1", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)["NCL", 0]
    (fake / "config.yaml").write_text(dump_yaml(cfg))
    write_log(fake, [{f: 0.0 for f in LOG_FIELDS} | {"epoch": 1, "step": 3, "epoch_time_s": 0.96}])
    assert main([*_args(tmp_path), "--plan"]) == 0
    out = capsys.readouterr().out
    assert timings == [] and "not timed" not in out
    assert "): 5 s (from 1 stored run(s)' log.csv; evaluation not included)" in out
