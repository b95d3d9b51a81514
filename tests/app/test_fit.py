"""The one loop of pretraining and fine-tuning (``app.fit``, issue 45): its declared hooks, a run's
log columns are the statistics it logs (no gate column without a gate; fine-tuning's its own
Statistics), the shared ``rows_all_closed``, and the method resolved once per run."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

import bayesncl.core.engine as engine_module
from bayesncl.app.finetune import FINETUNE_STATS, finetune
from bayesncl.app.fit import Job, Progress, epoch_line, shown
from bayesncl.app.train import pretrain
from bayesncl.config import build_config
from bayesncl.core import methods
from bayesncl.core.engine import Hooks
from bayesncl.core.methods.common import closed_rows
from bayesncl.runs.logs import LOG_FIELDS, STEP_LOG_FIELDS, heldout_fields, log_columns

from ..conftest import TINY, TINY_BASE, tiny_checkpoint

GATE_COLUMNS = {"kl", "gate_open", "rho", "gate_mean_alpha", "rows_all_closed", "heldout_gate_open",
                "heldout_gate_mean_alpha"}  # fmt: skip


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def test_hooks_and_the_progress_bar_are_declared() -> None:
    """The loop's hooks are the fields of a dataclass (no-ops by default), and nothing is attached to
    it or to the progress bar's holder at run time (slots)."""
    assert [f.name for f in dataclasses.fields(Hooks)] == ["stop_requested", "on_sync", "on_step_log"]
    hooks = Hooks()
    assert hooks.stop_requested() is None
    assert hooks.on_sync(1, {}) is None and hooks.on_step_log(1, {}, 0.1) is None
    with pytest.raises(AttributeError):
        hooks.bar = object()  # type: ignore[attr-defined]
    assert "bar" in [f.name for f in dataclasses.fields(Progress)]
    progress = Progress("ncl", 3, methods.get("ncl").stats, enabled=False)
    loader = [1, 2]
    assert progress.epoch(loader, 0) is loader and progress.bar is None  # off: the batches themselves
    with pytest.raises(AttributeError):
        progress.other = 1  # type: ignore[attr-defined]
    assert {f.name for f in dataclasses.fields(Job)} >= {"stats", "build_model", "make_loss_fn", "schedule"}


def test_a_runs_columns_are_its_own_statistics() -> None:
    """An ungated run's log.csv and steps.csv have no gate column; a gated built-in method's are the
    columns every log had before (LOG_FIELDS)."""
    ncl, bnc = (build_config(overrides=[*TINY, f"method.name={m}"]).method for m in ("ncl", "bayesncl"))
    cols = log_columns(methods.get("ncl").logged(ncl), heldout_fields(False))
    assert list(cols.epoch) == [
        "epoch", "step", "loss", "info_nce", "online_acc", "lr", "epoch_time_s", "heldout_sc",
        "heldout_h_sum", "heldout_active_dims", "heldout_effective_rank",
    ]
    assert list(cols.step) == ["step", "epoch", "loss", "info_nce", "online_acc", "lr"]
    gated = log_columns(methods.get("bayesncl").logged(bnc), heldout_fields(True))
    assert list(gated.epoch) == LOG_FIELDS and list(gated.step) == STEP_LOG_FIELDS
    assert set(gated.epoch) >= GATE_COLUMNS
    # a method switched to a gate logs the gate's statistics; one switched off, none
    assert "kl" in [s.name for s in methods.get("ncl").logged(dataclasses.replace(ncl, gate="ste"))]
    ft = log_columns(FINETUNE_STATS)
    assert list(ft.epoch) == ["epoch", "step", "loss", "online_acc", "lr", "epoch_time_s"]
    assert list(ft.step) == ["step", "epoch", "loss", "online_acc", "lr"]


def test_a_run_without_labels_has_no_column_of_a_statistic_that_needs_them() -> None:
    """data.labels=none: the online probe's accuracy is no column of log.csv or steps.csv (it had one,
    always empty), the other statistics are the labelled run's."""
    ncl, bnc = (build_config(overrides=[*TINY, f"method.name={m}"]).method for m in ("ncl", "bayesncl"))
    assert [s.name for s in methods.get("ncl").logged(ncl, labeled=False)] == ["loss", "info_nce"]
    assert [s.name for s in methods.get("ncl").logged(ncl)] == ["loss", "info_nce", "online_acc"]
    cols = log_columns(methods.get("ncl").logged(ncl, labeled=False), heldout_fields(False))
    assert list(cols.epoch) == [
        "epoch", "step", "loss", "info_nce", "lr", "epoch_time_s", "heldout_sc", "heldout_h_sum",
        "heldout_active_dims", "heldout_effective_rank",
    ]
    assert list(cols.step) == ["step", "epoch", "loss", "info_nce", "lr"]
    gated = log_columns(methods.get("bayesncl").logged(bnc, labeled=False), heldout_fields(True))
    assert [c for c in LOG_FIELDS if c not in gated.epoch] == ["online_acc"]
    assert [c for c in STEP_LOG_FIELDS if c not in gated.step] == ["online_acc"]
    step = methods.Step(torch.tensor(1.0), {"info_nce": torch.tensor(2.0)}, None)
    assert {k: v.item() for k, v in methods.statistics(ncl, step, labeled=False).items()} == {
        "loss": 1.0, "info_nce": 2.0,
    }


@pytest.mark.slow
def test_a_run_without_labels_logs_and_draws_only_what_it_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pretraining run with data.labels=none: log.csv, steps.csv and the curves have no online_acc
    (no probe accuracy without labels), every other column filled as a labelled run's."""
    from bayesncl.app.report.curves import read_log, training_curves_figure

    monkeypatch.setattr(engine_module, "STEP_LOG_EVERY", 3)  # a steps.csv row at each epoch's end
    cfg = build_config(overrides=[*TINY_BASE, "train.epochs=2", "method.name=ncl", "data.labels=none",
                                  "train.monitor_samples=0"])  # fmt: skip
    pretrain(cfg, tmp_path / "run", evaluate=False)
    expected = log_columns(methods.get("ncl").logged(cfg.method, labeled=False), heldout_fields(False))
    assert _header(tmp_path / "run" / "log.csv") == list(expected.epoch)
    assert "online_acc" not in expected.epoch and "info_nce" in expected.epoch
    assert _header(tmp_path / "run" / "steps.csv") == ["step", "epoch", "loss", "info_nce", "lr"]
    rows = read_log(tmp_path / "run")
    assert [r["epoch"] for r in rows] == [1.0, 2.0] and all(r["info_nce"] > 0 for r in rows)
    fig = training_curves_figure({"ncl": rows})
    assert [ax.get_title() for ax in fig.axes] == ["InfoNCE (nats)"]


def test_the_epoch_line_and_the_bar_show_the_short_statistics() -> None:
    stats = methods.get("bayesncl").stats
    means = {"loss": 5.4321, "info_nce": 5.42, "kl": 8.857, "gate_open": 0.04, "gate_mean_alpha": 0.5,
             "rows_all_closed": 0.0, "online_acc": 0.1}  # fmt: skip
    assert epoch_line("ncl", 3, 2, stats, means, 32.14, 65.0) == (
        "ncl epoch 2/3: loss 5.43 InfoNCE 5.42 KL 8.86 open 0.04 α 0.50 | 32.1 s, ETA 0:01:05"
    )
    assert shown(stats, {"loss": 1.0}, digits=3) == {"loss": "1.000"}  # what a run logs only
    ft = shown(FINETUNE_STATS, {"loss": 2.3, "online_acc": 0.1156})
    assert ft == {"loss": "2.30", "train acc": "11.6 %"}


def test_the_bar_never_shows_a_count_behind_its_means(capsys: pytest.CaptureFixture[str]) -> None:
    """The running means go on the bar at its own refresh, beside the batches done: a postfix set
    after step k is never drawn beside a count below k (show() redrew at once, beside tqdm's count
    of its last refresh: "0/6 ... loss=5.000" after five steps)."""
    import re

    progress = Progress("ncl", 1, methods.get("ncl").stats, enabled=True)
    for k, _ in enumerate(progress.epoch(list(range(6)), 0), 1):
        progress.show({"loss": float(k), "info_nce": float(k)})
    assert progress.bar is not None and "loss=6.000" in progress.bar.postfix  # set, drawn at the refresh
    progress.bar.close()
    frames = re.findall(r"(\d+)/6 [^\r\n]*?loss=(\d+)\.000", capsys.readouterr().err)
    assert all(int(n) >= int(k) for n, k in frames), frames


def test_rows_all_closed_is_one_definition_for_training_and_evaluation() -> None:
    """closed_rows takes the open gates as a tensor (training's statistic) or an array (evaluate's,
    in float64 as before: the share of test images whose mask sums to 0)."""
    from bayesncl.app.evaluate import _add_run_facts

    rng = np.random.default_rng(0)
    mask = (rng.random((997, 6)) > 0.8).astype(np.float32)
    result: dict[str, object] = {}
    cfg = build_config(overrides=TINY)
    _add_run_facts(result, {"mask": mask, "labels": np.zeros(997, dtype=np.int64)}, cfg)
    assert result["rows_all_closed"] == float((mask.sum(1) == 0).mean()) > 0  # bit for bit, as before
    opened = torch.from_numpy(mask > 0)
    assert closed_rows(opened).tolist() == closed_rows(mask > 0).tolist() == (mask.sum(1) == 0).tolist()


@pytest.mark.slow
def test_the_method_is_resolved_once_per_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No lookup of the method by name per step or per epoch: a 3-epoch run looks it up as often as a
    1-epoch run (the run's Method is passed along)."""
    calls: list[str] = []
    real = methods.get
    from bayesncl.core.methods import registry

    counted = lambda name: calls.append(name) or real(name)  # noqa: E731
    monkeypatch.setattr(methods, "get", counted)
    monkeypatch.setattr(registry, "get", counted)  # the loss's own lookup (registry.terms) counts too
    counts = []
    for epochs in (1, 3):
        calls.clear()
        cfg = build_config(overrides=[*TINY_BASE, f"train.epochs={epochs}", "method.name=bayesncl"])
        pretrain(cfg, tmp_path / f"e{epochs}", evaluate=False)
        counts.append(len(calls))
    assert counts[0] == counts[1], counts


@pytest.mark.slow
def test_finetunings_logs_are_its_statistics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fine-tuning logs FINETUNE_STATS through pretraining's machinery: log.csv and steps.csv have
    their columns only (cross-entropy and train accuracy in %), the epoch line shows them."""
    monkeypatch.setattr(engine_module, "STEP_LOG_EVERY", 3)  # a steps.csv row at each epoch's end
    src = tiny_checkpoint(tmp_path / "run.pt", ["method.name=bayesncl"])
    small = ["train.epochs=2", "train.warmup_epochs=1", "train.batch_size=32", "train.progress=false"]
    finetune(src, tmp_path / "ft", small)
    cols = log_columns(FINETUNE_STATS)
    assert _header(tmp_path / "ft" / "log.csv") == list(cols.epoch)
    assert _header(tmp_path / "ft" / "steps.csv") == list(cols.step)
    with (tmp_path / "ft" / "log.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert all(0 <= float(r["online_acc"]) <= 100 and float(r["loss"]) > 0 for r in rows)
