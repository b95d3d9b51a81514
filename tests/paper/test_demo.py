"""``bayesncl demo``: the side-by-side table, and an interrupted demo continued (--resume) or
replaced (--overwrite) in the same run dir. Tiny settings: a few seconds per method."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bayesncl.app.cli import main
from bayesncl.config import Config

from ..conftest import TINY_BASE, error_line

TINY = [*TINY_BASE, "train.epochs=2"]


def _interrupt_bayesncl_after_one_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's bayesncl run stops after its first epoch checkpoint, as a Ctrl-C would."""
    import bayesncl.app.train

    real = bayesncl.app.train.pretrain

    def pretrain(cfg: Config, run_dir: Path, **kwargs: Any) -> dict[str, Any]:
        if cfg.method.name != "bayesncl":
            return real(cfg, run_dir, **kwargs)
        cfg.train.epochs = 1
        real(cfg, run_dir, **{**kwargs, "evaluate": False})
        raise KeyboardInterrupt("stopped after epoch 1")

    monkeypatch.setattr(bayesncl.app.train, "pretrain", pretrain)


@pytest.mark.slow
def test_interrupted_demo_resumes_then_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "demo"
    with monkeypatch.context() as m:
        _interrupt_bayesncl_after_one_epoch(m)
        assert main(["demo", "--run-dir", str(run), *TINY]) == 130
    assert (run / "ncl" / "metrics.json").exists() and (run / "bayesncl" / "last.pt").exists()
    assert not (run / "table.json").exists() and not (run / "bayesncl" / "metrics.json").exists()
    ncl_metrics = (run / "ncl" / "metrics.json").read_text()
    capsys.readouterr()

    # the same command again: refused, nothing touched
    assert main(["demo", "--run-dir", str(run), *TINY]) == 2
    assert error_line(capsys) == (
        f"bayesncl: error: run dir {run} already exists and is not empty; pass --resume to continue the "
        "demo in it, --overwrite to replace it, or choose another --run-dir"
    )
    # other settings than the interrupted demo's: refused before anything runs
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY, "data.blur_prob=0.2"]) == 2
    assert error_line(capsys) == (
        f"bayesncl: error: --resume: {run / 'ncl'} holds a finished run with other settings "
        "(data.blur_prob: 0.5 -> 0.2; run's -> now); resume with the same options and key=value "
        "overrides, or use --overwrite"
    )
    assert main(["demo", "--run-dir", str(run), "--resume", "--overwrite", *TINY]) == 2
    assert error_line(capsys) == (
        "bayesncl: error: --resume and --overwrite contradict each other: continue the demo, or replace it"
    )

    # --resume: ncl is reused as it is, bayesncl continues from its epoch-1 checkpoint to epoch 2
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY]) == 0
    out = capsys.readouterr().out
    assert f"== ncl: reusing the finished run {run / 'ncl'} ==" in out
    assert f"== bayesncl: continuing {run / 'bayesncl'}: 2 epochs on synthetic ==" in out
    assert (run / "ncl" / "metrics.json").read_text() == ncl_metrics
    log = (run / "bayesncl" / "log.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in log] == ["epoch", "1", "2"]
    table = json.loads((run / "table.json").read_text())
    assert list(table) == ["ncl", "bayesncl"]
    assert table["ncl"] == json.loads(ncl_metrics)
    assert table["bayesncl"] == json.loads((run / "bayesncl" / "metrics.json").read_text())
    assert (run / "curves.png").read_bytes().startswith(b"\x89PNG")
    index = (run / "report" / "index.html").read_text()  # the report keeps the table's order (and colours)
    assert index.index('href="ncl/') < index.index('href="bayesncl/')
    assert "<h1>bayesncl report: demo</h1>" in index
    assert 'The table: <a href="../table.md">table.md</a>' in index
    caption = (run / "table.md").read_text().splitlines()[0]
    assert "Test split, 60-image subset; SC in %" in caption

    # --resume of a finished demo: both reused, the same table
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY]) == 0
    assert json.loads((run / "table.json").read_text()) == table
    capsys.readouterr()

    # --overwrite: both methods train again from scratch, with the new settings
    assert main(["demo", "--run-dir", str(run), "--overwrite", *TINY_BASE, "train.epochs=1"]) == 0
    assert "reusing" not in capsys.readouterr().out
    for method in ("ncl", "bayesncl"):
        assert (run / method / "log.csv").read_text().count("\n") == 2  # header + 1 epoch
        assert not (run / method / "epoch-0002.pt").exists()
    assert json.loads((run / "table.json").read_text())["ncl"] != table["ncl"]


def test_demo_refusals_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "demo"
    assert main(["demo", "--run-dir", str(run), *TINY, "method.name=cl"]) == 2
    assert error_line(capsys) == (
        "bayesncl: error: method.name defines the demo's two runs (ncl, bayesncl); it cannot be overridden "
        "here"
    )
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY]) == 2
    want = f"bayesncl: error: --resume: no demo run in {run} to continue (no such directory)"
    assert error_line(capsys) == want
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY]) == 2
    assert error_line(capsys) == (
        f"bayesncl: error: --resume: no demo run in {run} to continue "
        f"(no {run / 'ncl' / 'last.pt'} or {run / 'bayesncl' / 'last.pt'})"
    )
    assert main(["demo", "--resume", *TINY]) == 2
    assert error_line(capsys) == "bayesncl: error: --resume needs --run-dir DIR (the demo to continue)"
    assert main(["demo", "--run-dir", str(run / "notes.txt"), *TINY]) == 2
    assert error_line(capsys) == (
        f"bayesncl: error: run dir {run / 'notes.txt'} is a file, not a directory; choose another --run-dir"
    )
    assert main(["demo", "--run-dir", "", *TINY]) == 2
    assert error_line(capsys) == "bayesncl: error: --run-dir '': expected a directory, not an empty path"
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_method_keys_for_the_bayesncl_run_leave_the_ncl_run_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """method.rho has no effect on ncl: it is meant for the bayesncl run. No warning names ncl, the ncl
    run keeps the recipe's value, and a finished ncl run differing only in it is reused on --resume."""
    import warnings

    import yaml

    from bayesncl.config import build_config
    from bayesncl.paper.demo import DEMO_CONFIG, demo_configs

    recipe = build_config(DEMO_CONFIG, ["method.name=ncl"]).method
    recipe_rho = recipe.rho
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all
        configs = demo_configs([*TINY, "method.rho=0.5", "method.lam=0.01"])
    assert (configs["ncl"].method.rho, configs["ncl"].method.lam) == (recipe.rho, recipe.lam)
    assert (configs["bayesncl"].method.rho, configs["bayesncl"].method.lam) == (0.5, 0.01)
    with pytest.warns(UserWarning) as caught:  # no effect on either run: said once, for bayesncl
        demo_configs([*TINY, "method.gumbel_noise=logistic"])
    assert [str(w.message) for w in caught] == [
        "method.gumbel_noise has no effect with method.name=bayesncl (method.gate=ste, method.topk=false)"
    ]

    run = tmp_path / "demo"
    with monkeypatch.context() as m:
        _interrupt_bayesncl_after_one_epoch(m)
        assert main(["demo", "--run-dir", str(run), *TINY, "method.rho=0.5"]) == 130
    assert "no effect" not in capsys.readouterr().err
    assert yaml.safe_load((run / "ncl" / "config.yaml").read_text())["method"]["rho"] == recipe_rho
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY, "method.rho=0.5"]) == 0
    out = capsys.readouterr()
    assert f"== ncl: reusing the finished run {run / 'ncl'} ==" in out.out and "no effect" not in out.err
    table = json.loads((run / "table.json").read_text())

    # an ncl run that recorded the bayesncl run's rho (as older versions did) is still the same run
    config = run / "ncl" / "config.yaml"
    config.write_text(config.read_text().replace(f"rho: {recipe_rho}\n", "rho: 0.5\n"))
    assert yaml.safe_load(config.read_text())["method"]["rho"] == 0.5
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY, "method.rho=0.5"]) == 0
    assert "reusing the finished run" in capsys.readouterr().out
    assert json.loads((run / "table.json").read_text()) == table
    # another rho is another bayesncl run: refused, naming that run and not ncl
    assert main(["demo", "--run-dir", str(run), "--resume", *TINY, "method.rho=0.6"]) == 2
    assert error_line(capsys) == (
        f"bayesncl: error: --resume: {run / 'bayesncl'} holds a finished run with other settings "
        "(method.rho: 0.5 -> 0.6; run's -> now); resume with the same options and key=value "
        "overrides, or use --overwrite"
    )
