"""The gate's two rates (issue 44 item 4), named for what they are, for every gate: the open rate
(``gate_open``: the share of α > ``method.threshold``) and the mean gate probability α
(``gate_mean_alpha``), in the training statistics, the held-out monitor, evaluation's facts and the
curves (which still read logs from before ``gate_mean_alpha``, where a soft gate's ``gate_open`` was
mean α)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bayesncl.app.evaluate import _add_run_facts, _evaluation_markdown
from bayesncl.app.heldout import HeldOut
from bayesncl.app.report.curves import older_soft_log, read_log, training_curves_figure, write_training_curves
from bayesncl.config import build_config, dump_yaml
from bayesncl.core import methods
from bayesncl.core.model import ModelOutput, build_model
from bayesncl.runs.logs import write_log

from ..conftest import TINY_BASE

# two rows of D = 4 gates; at threshold 0.5: open 2 of 8 = 0.25, mean α 3.0 / 8 = 0.375, one row of two
# with every gate closed; at 0.35: open 4 of 8 = 0.5 (0.4 and 0.45 open too), no row all closed
ALPHA = torch.tensor([[0.6, 0.4, 0.9, 0.1], [0.3, 0.2, 0.45, 0.05]])


def _output(mask: torch.Tensor) -> ModelOutput:
    z = torch.ones(2, 4)
    return ModelOutput(h=z, p=z, z=z, logits=torch.logit(ALPHA), alpha=ALPHA, mask=mask, z_tilde=z)


def _stats(gate: str, mask: torch.Tensor, threshold: float = 0.5) -> dict[str, float]:
    m = build_config(overrides=[*TINY_BASE, f"method.gate={gate}", f"method.threshold={threshold}"]).method
    step = methods.Step(torch.tensor(1.0), {"info_nce": torch.tensor(1.0), "kl": torch.tensor(0.5)},
                        _output(mask))  # fmt: skip
    return {k: v.item() for k, v in methods.statistics(m, step, labeled=False).items()}


@pytest.mark.parametrize("gate", ["soft", "ste", "gumbel"])
def test_the_open_rate_is_the_share_of_alpha_over_the_threshold_and_mean_alpha_its_mean(gate: str) -> None:
    """Whatever the training mask (the soft gate's is α itself, the Gumbel gate's a noisy sample, here
    every gate open), ``gate_open`` and ``rows_all_closed`` read 1[α > threshold], ``gate_mean_alpha``
    α: the soft gate's ``gate_open`` was 0.375 here (the mask's mean), now 0.25."""
    mask = {"soft": ALPHA, "ste": (ALPHA > 0.5).float(), "gumbel": torch.ones(2, 4)}[gate]
    s = _stats(gate, mask)
    assert s["gate_open"] == pytest.approx(0.25)
    assert s["gate_mean_alpha"] == pytest.approx(0.375)
    assert s["rows_all_closed"] == 0.5
    at = _stats(gate, mask, threshold=0.35)  # the run's method.threshold, not 0.5
    assert (at["gate_open"], at["gate_mean_alpha"], at["rows_all_closed"]) == (0.5, pytest.approx(0.375), 0.0)
    assert list(s) == ["loss", "info_nce", "kl", "gate_open", "gate_mean_alpha", "rows_all_closed"]


def test_a_run_without_a_gate_logs_neither_rate() -> None:
    m = build_config(overrides=[*TINY_BASE, "method.name=ncl"]).method
    z = torch.ones(2, 4)
    out = ModelOutput(h=z, p=z, z=z, logits=None, alpha=None, mask=None, z_tilde=z)
    stats = methods.statistics(m, methods.Step(torch.tensor(1.0), {"info_nce": torch.tensor(1.0)}, out),
                               labeled=False)  # fmt: skip
    assert list(stats) == ["loss", "info_nce"]


def test_evaluation_reports_both_rates() -> None:
    """evaluation.json's facts (metrics.json's too): the open rate from the hard mask 1[α > 0.5] that
    extraction gives, mean α from α."""
    cfg = build_config(overrides=[*TINY_BASE, "method.gate=soft"])
    test = {"mask": (ALPHA > 0.5).float().numpy(), "alpha": ALPHA.numpy(), "labels": np.array([0, 1])}
    result: dict[str, Any] = {}
    _add_run_facts(result, test, cfg)
    assert result["gate_open_rate"] == pytest.approx(0.25)
    assert result["gate_mean_alpha"] == pytest.approx(0.375)
    assert (result["rows_all_closed"], result["n_test"], result["method"]) == (0.5, 2, "bayesncl")
    assert "gating" not in result  # features gated by the hard mask, the default
    assert "Gate (test split): open rate 0.2500 (α > method.threshold), mean α 0.3750, images with every " \
           "gate closed 0.5000." in _evaluation_markdown(result)  # evaluation.md


def test_the_held_out_monitor_logs_both_rates() -> None:
    """The held-out batch of a soft-gated model whose gating head gives every image the α of ALPHA's
    first row (0.6, 0.4, 0.9, 0.1, repeated over D = 16 dims): open 0.5, mean α 0.5 at threshold 0.5;
    at 0.65 open 0.25, mean α still 0.5."""
    for threshold, opened in ((0.5, 0.5), (0.65, 0.25)):
        cfg = build_config(overrides=[*TINY_BASE, "method.gate=soft", f"method.threshold={threshold}"])
        model = build_model(cfg, 3, 16, 10)
        last = model.gating_head.net[-1]
        with torch.no_grad():
            last.weight.zero_()
            last.bias.copy_(torch.logit(ALPHA[0]).repeat(last.out_features // 4))
        x, y = torch.randn(6, 3, 16, 16, generator=torch.Generator().manual_seed(0)), torch.arange(6) % 3
        row = HeldOut(x, y, batch_size=4).measure(model, torch.device("cpu"))
        assert row["heldout_gate_open"] == opened
        assert row["heldout_gate_mean_alpha"] == pytest.approx(0.5, abs=1e-6)


def _log(run: Path, gate: str, rows: list[dict[str, Any]]) -> Path:
    run.mkdir(parents=True)
    write_log(run, rows)
    (run / "config.yaml").write_text(dump_yaml(build_config(overrides=[*TINY_BASE, f"method.gate={gate}"])))
    return run


def test_curves_read_logs_from_before_mean_alpha_and_say_what_a_soft_gates_open_rate_was(
    tmp_path: Path,
) -> None:
    old_row = {"epoch": 1, "step": 3, "loss": 5.5, "info_nce": 5.4, "kl": 2.0, "gate_open": 0.375, "rho": 0.8,
               "rows_all_closed": 0.0, "online_acc": 10.0, "lr": 0.1, "epoch_time_s": 2.0}  # fmt: skip
    old = tmp_path / "old-soft"
    old.mkdir()
    with (old / "log.csv").open("w", newline="") as f:  # the columns a log had before gate_mean_alpha
        w = csv.DictWriter(f, fieldnames=list(old_row), lineterminator="\n")
        w.writeheader()
        w.writerow(old_row)
    (old / "config.yaml").write_text(dump_yaml(build_config(overrides=[*TINY_BASE, "method.gate=soft"])))
    new = _log(tmp_path / "new-soft", "soft", [{**old_row, "gate_open": 0.25, "gate_mean_alpha": 0.375}])
    ste = _log(tmp_path / "old-ste", "ste", [old_row])
    rows = read_log(old)
    assert rows[0]["gate_open"] == 0.375 and "gate_mean_alpha" not in rows[0]
    assert older_soft_log(old, rows) and not older_soft_log(new, read_log(new))
    assert not older_soft_log(ste, read_log(ste))
    assert math.isnan(read_log(ste)[0]["gate_mean_alpha"])  # written now, from a row without it: empty
    fig = training_curves_figure({"old": rows, "new": read_log(new)}, open_is_mean_alpha=["old"])
    titles = [ax.get_title() for ax in fig.axes]
    assert "gate open rate (α > threshold) vs ρ (dashed)\n(mean α for old: a soft gate's log before " \
           "gate_mean_alpha)" in titles
    assert "mean gate probability α vs ρ (dashed)" in titles
    (alpha_ax,) = [ax for ax in fig.axes if ax.get_title().startswith("mean gate probability")]
    drawn = [list(line.get_ydata()) for line in alpha_ax.get_lines() if line.get_linestyle() == "-"]
    assert drawn == [[0.375]]  # the new log's mean α; the old one has none
    assert write_training_curves([old, new], tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


def test_a_mid_epoch_resume_from_a_checkpoint_without_mean_alpha(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped inside epoch 2 by code from before gate_mean_alpha (its last.pt sums no such
    statistic) resumes: epoch 2 logs gate_mean_alpha empty (its first steps were not summed), every
    other statistic as an uninterrupted run's; the weights are the same."""
    import bayesncl.core.engine as engine
    from bayesncl.app.train import pretrain
    from bayesncl.runs.messages import TrainingInterrupted
    from bayesncl.runs.safe_load import load_checkpoint_file

    from ..conftest import assert_same_weights, ctrl_c

    args = [*TINY_BASE, "method.name=bayesncl", "train.precision=fp32", "train.epochs=2",
            "train.monitor_samples=0"]  # 96 images, batch 32: 3 steps an epoch
    straight, run = tmp_path / "straight", tmp_path / "run"
    pretrain(build_config(overrides=args), straight, evaluate=False)
    real, calls = engine.contrastive_loss, {"n": 0}

    def ctrl_c_in_step_5(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:
            ctrl_c()
        return real(*a, **k)

    monkeypatch.setattr(engine, "contrastive_loss", ctrl_c_in_step_5)
    with pytest.raises(TrainingInterrupted, match="stopped in epoch 2 after 2 of its 3 steps"):
        pretrain(build_config(overrides=args), run, evaluate=False)
    monkeypatch.setattr(engine, "contrastive_loss", real)
    ckpt = load_checkpoint_file(run / "last.pt")
    for d in (ckpt["partial"]["sums"], ckpt["partial"]["window"][0], *ckpt["log"], *ckpt["step_log"]):
        d.pop("gate_mean_alpha", None)  # as the older code saved it
    torch.save(ckpt, run / "last.pt")
    pretrain(build_config(overrides=args), run, resume=True, evaluate=False)
    assert_same_weights(straight / "last.pt", run / "last.pt")
    with (run / "log.csv").open() as f:
        resumed = list(csv.DictReader(f))
    with (straight / "log.csv").open() as f:
        ref = list(csv.DictReader(f))
    assert [r["gate_mean_alpha"] for r in resumed] == ["", ""] and 0 < float(ref[1]["gate_mean_alpha"]) < 1
    for key in ("loss", "info_nce", "kl", "gate_open", "rows_all_closed", "online_acc"):
        assert resumed[1][key] == ref[1][key], key
