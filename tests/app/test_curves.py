"""Training curves: log.csv read back exactly, one line per run with the logged values, the gate
panels only for gated runs, and ``bayesncl curves``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bayesncl.app.cli import main
from bayesncl.app.report.curves import read_log, read_steps, run_label, training_curves_figure
from bayesncl.runs.logs import write_log
from bayesncl.runs.messages import RunDirError


def _rows(rho: float | str, nce: list[float]) -> list[dict[str, object]]:
    return [
        {
            "epoch": i + 1,
            "step": 3 * (i + 1),
            "loss": v + 0.5,
            "info_nce": v,
            "kl": 2.0 - i if rho != "" else 0.0,
            "gate_open": 0.4 - 0.1 * i if rho != "" else 1.0,
            "rho": rho,
            "rows_all_closed": 0.0,
            "online_acc": 10.0 * (i + 1),
            "lr": 0.1,
            "epoch_time_s": 1.5,
        }
        for i, v in enumerate(nce)
    ]


def _run(path: Path, rho: float | str, nce: list[float]) -> Path:
    path.mkdir(parents=True)
    write_log(path, _rows(rho, nce))
    return path


def test_read_log_round_trips_write_log(tmp_path: Path) -> None:
    run = _run(tmp_path / "ncl", "", [5.5, 5.25])
    rows = read_log(run)
    assert read_log(run / "log.csv") == rows
    assert [r["epoch"] for r in rows] == [1.0, 2.0]
    assert [r["info_nce"] for r in rows] == [5.5, 5.25]
    assert [r["online_acc"] for r in rows] == [10.0, 20.0]
    assert all(math.isnan(r["rho"]) for r in rows)  # an ungated run logs no rho


def test_the_lr_column_has_six_significant_digits(tmp_path: Path) -> None:
    rows = _rows("", [5.5, 5.25, 5.0])
    for r, lr in zip(rows, [0.1 + 0.2, 0.123456789, 3.0000000000000004e-05], strict=True):
        r["lr"] = lr
    write_log(tmp_path, rows)
    lines = (tmp_path / "log.csv").read_text().splitlines()
    at = lines[0].split(",").index("lr")
    assert [line.split(",")[at] for line in lines[1:]] == ["0.3", "0.123457", "3e-05"]
    assert [r["lr"] for r in read_log(tmp_path)] == [0.3, 0.123457, 3e-05]


def test_figure_draws_the_logged_values(tmp_path: Path) -> None:
    ncl = read_log(_run(tmp_path / "ncl", "", [5.5, 5.25, 5.0]))
    gated = read_log(_run(tmp_path / "bnc", 0.3, [5.6, 5.3, 5.1]))
    fig = training_curves_figure({"ncl": ncl, "bayesncl": gated})
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [
        "InfoNCE (nats)",
        "online probe accuracy (%)",
        "KL(Bern(α) ‖ Bern(ρ)), sum over dims",
        "gate open rate (α > threshold) vs ρ (dashed)",
    ]
    nce_lines = {ln.get_label(): list(ln.get_ydata()) for ln in axes[0].lines}
    assert nce_lines == {"ncl": [5.5, 5.25, 5.0], "bayesncl": [5.6, 5.3, 5.1]}
    assert list(axes[0].lines[0].get_xdata()) == [1.0, 2.0, 3.0]
    assert [list(ln.get_ydata()) for ln in axes[1].lines] == [[10.0, 20.0, 30.0]] * 2
    # the ungated run is absent from the KL and gate panels; rho is a dashed line at 0.3
    assert [ln.get_label() for ln in axes[2].lines] == ["bayesncl"]
    assert list(axes[2].lines[0].get_ydata()) == [2.0, 1.0, 0.0]
    solid, dashed = axes[3].lines
    assert list(solid.get_ydata()) == pytest.approx([0.4, 0.3, 0.2])
    assert dashed.get_linestyle() == "--" and list(dashed.get_ydata()) == [0.3, 0.3]
    assert solid.get_color() == dashed.get_color() == axes[0].lines[1].get_color()


def test_step_rows_are_a_thin_line_of_the_runs_colour(tmp_path: Path) -> None:
    run = _run(tmp_path / "bnc", 0.3, [5.6, 5.3])
    assert read_steps(run) == []  # no steps.csv (fewer than 25 steps): epoch markers only
    rows = [
        {"step": 25, "epoch": 0.5, "info_nce": 5.9, "online_acc": 5.0, "kl": 3.0, "gate_open": 0.5},
        {"step": 50, "epoch": 1.0, "info_nce": 5.7, "online_acc": 8.0, "kl": 2.5, "gate_open": 0.45},
    ]
    write_log(run, rows, "steps.csv")
    steps = read_steps(run)
    assert [r["step"] for r in steps] == [25.0, 50.0] and math.isnan(steps[0]["loss"])
    fig = training_curves_figure({"b": read_log(run)}, steps={"b": steps})
    marked, thin = fig.axes[0].lines
    assert list(thin.get_xdata()) == [0.5, 1.0] and list(thin.get_ydata()) == [5.9, 5.7]
    assert thin.get_color() == marked.get_color() and thin.get_label().startswith("_")  # not in the legend
    assert list(fig.axes[3].lines[1].get_ydata()) == [0.5, 0.45]  # gate panel: epochs, steps, then rho
    assert fig.axes[3].lines[2].get_linestyle() == "--"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["b", "every 25 steps (thin)"]


def test_ungated_runs_get_no_gate_panels(tmp_path: Path) -> None:
    fig = training_curves_figure({"cl": read_log(_run(tmp_path / "cl", "", [6.0]))})
    assert [ax.get_title() for ax in fig.axes] == ["InfoNCE (nats)", "online probe accuracy (%)"]
    # with the held-out panels: an ungated run's 2 + 4 fill two rows of 3 (no empty slot where the
    # gate's panels would be), a gated run's 4 + 4 two rows of 4, the held-out ones on the second
    held = {"heldout_sc": 12.0, "heldout_h_sum": 2.0, "heldout_active_dims": 9.0,
            "heldout_effective_rank": 1.5}
    for rho, shape, first_held in (("", (2, 3), 2), (0.3, (2, 4), 4)):
        rows = [{**r, **held} for r in read_log(_run(tmp_path / f"run{rho}", rho, [6.0]))]
        fig = training_curves_figure({"r": rows})
        grid = fig.axes[0].get_gridspec()
        assert (grid.nrows, grid.ncols) == shape and len(fig.axes) == shape[0] * shape[1]
        assert all(ax.axison and ax.lines for ax in fig.axes)  # every panel drawn, none blank
        assert [ax.get_title() for ax in fig.axes].index("held-out SC (%)") == first_held
    with pytest.raises(ValueError, match="at least one run"):
        training_curves_figure({})


def test_a_finetuning_log_is_titled_by_its_own_statistics(tmp_path: Path) -> None:
    """Fine-tuning logs its classifier's train accuracy under pretraining's name ``online_acc``: its
    panel says what it is (FINETUNE_STATS' title), a pretraining run's keeps the online probe's."""
    from bayesncl.app.report.curves import log_statistics
    from bayesncl.core.methods import FINETUNE_STATS, all_statistics
    from bayesncl.runs.logs import log_columns

    run, cols = tmp_path / "ncl-finetune", log_columns(FINETUNE_STATS)
    run.mkdir()
    write_log(run, [{"epoch": e, "step": 3 * e, "loss": 2.5 - e, "online_acc": 30.0 * e, "lr": 0.4,
                     "epoch_time_s": 1.0} for e in (1, 2)], fields=cols.epoch)  # fmt: skip
    write_log(run, [{"step": 25, "epoch": 0.5, "loss": 2.0, "online_acc": 20.0, "lr": 0.4}], "steps.csv",
              cols.step)  # fmt: skip
    ft, steps = read_log(run), read_steps(run)
    assert list(ft[0]) == ["epoch", "step", "loss", "online_acc", "lr", "epoch_time_s"]
    assert log_statistics(ft)["online_acc"] is log_statistics(steps)["online_acc"] is FINETUNE_STATS[1]
    pre = read_log(_run(tmp_path / "ncl", "", [5.5, 5.25]))
    assert log_statistics(pre) == all_statistics()
    fig = training_curves_figure({"ncl-finetune": ft}, steps={"ncl-finetune": steps})
    assert [ax.get_title() for ax in fig.axes] == ["train accuracy of backbone + head (%)"]
    assert [list(ln.get_ydata()) for ln in fig.axes[0].lines] == [[30.0, 60.0], [20.0]]
    fig = training_curves_figure({"ncl": pre})
    assert [ax.get_title() for ax in fig.axes] == ["InfoNCE (nats)", "online probe accuracy (%)"]
    both = training_curves_figure({"ncl": pre, "ncl-finetune": ft})  # overlaid: both named, one a line
    assert [ax.get_title() for ax in both.axes] == [
        "InfoNCE (nats)", "online probe accuracy (%)\ntrain accuracy of backbone + head (%)",
    ]
    assert main(["curves", str(run)]) == 0 and (run / "training_curves.png").is_file()

def test_a_finetuning_log_written_before_its_own_columns_is_titled_as_one(tmp_path: Path) -> None:
    """Before a run's columns were its own statistics' (issue 45) fine-tuning wrote log.csv and
    steps.csv under the built-in header (LOG_FIELDS, STEP_LOG_FIELDS: info_nce, kl, ... empty), and a
    --resume keeps that header: such a log is a fine-tuning log too (train accuracy), while a
    pretraining log of either layout, a method's without InfoNCE or with few statistics among them,
    keeps the online probe's title."""
    from bayesncl.app.report.curves import log_statistics
    from bayesncl.core.methods import FINETUNE_STATS, all_statistics
    from bayesncl.runs.logs import LOG_FIELDS, STEP_LOG_FIELDS, heldout_fields, log_columns

    run = tmp_path / "ncl-finetune"
    run.mkdir()
    write_log(run, [{"epoch": e, "step": 3 * e, "loss": 2.5 - e, "online_acc": 30.0 * e, "lr": 0.4,
                     "epoch_time_s": 1.0} for e in (1, 2)])  # fmt: skip  (LOG_FIELDS, as before issue 45)
    write_log(run, [{"step": 25, "epoch": 0.5, "loss": 2.0, "online_acc": 20.0, "lr": 0.4}], "steps.csv")
    ft, steps = read_log(run), read_steps(run)
    assert list(ft[0]) == LOG_FIELDS and list(steps[0]) == STEP_LOG_FIELDS
    assert log_statistics(ft)["online_acc"] is log_statistics(steps)["online_acc"] is FINETUNE_STATS[1]
    fig = training_curves_figure({"ncl-finetune": ft}, steps={"ncl-finetune": steps})
    assert [ax.get_title() for ax in fig.axes] == ["train accuracy of backbone + head (%)"]
    assert main(["curves", str(run)]) == 0

    old_ncl = read_log(_run(tmp_path / "ncl", "", [5.5, 5.25]))  # pre-issue-45 layout, ungated, no monitor
    assert log_statistics(old_ncl) == all_statistics()
    spectral = tmp_path / "spectral"  # an old log of a method whose loss is not InfoNCE: info_nce empty
    spectral.mkdir()
    write_log(spectral, [{**r, "info_nce": "", "spectral": 1.0} for r in _rows("", [5.5])])
    assert log_statistics(read_log(spectral)) == all_statistics()
    few = tmp_path / "few"  # a method logging only loss and the probe (held-out monitor off)
    few.mkdir()
    cols = log_columns([FINETUNE_STATS[0], all_statistics()["online_acc"]], heldout_fields(False))
    write_log(few, [{"epoch": 1, "step": 3, "loss": 1.0, "online_acc": 10.0, "lr": 0.1, "epoch_time_s": 1.0}],
              fields=cols.epoch)  # fmt: skip
    assert log_statistics(read_log(few)) == all_statistics()
    fig = training_curves_figure({"few": read_log(few)})
    assert [ax.get_title() for ax in fig.axes] == ["online probe accuracy (%)"]



def test_labels_are_names_unless_they_repeat() -> None:
    assert run_label([Path("a/ncl"), Path("b/bayesncl")]) == ["ncl", "bayesncl"]
    assert run_label([Path("a/ncl"), Path("b/ncl")]) == ["a/ncl", "b/ncl"]


def test_malformed_logs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=f"^{tmp_path} has no log.csv: expected a run dir"):
        read_log(tmp_path)
    log = tmp_path / "log.csv"
    log.write_text("epoch,step,loss,info_nce,kl,gate_open,rho,rows_all_closed,online_acc,lr,epoch_time_s\n")
    with pytest.raises(RunDirError, match="no epoch has finished yet"):
        read_log(log)
    log.write_text("epoch,info_nce\n1,2\n")
    with pytest.raises(RunDirError, match=r"not a bayesncl log \(no column loss; expected epoch,step,loss,"):
        read_log(log)
    log.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    with pytest.raises(RunDirError, match="not UTF-8 text"):
        read_log(log)


def test_cli_default_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _run(tmp_path / "x" / "ncl", "", [5.5, 5.0])
    b = _run(tmp_path / "y" / "bayesncl", 0.5, [5.6, 5.1])
    assert main(["curves", str(a)]) == 0
    assert capsys.readouterr().out == f"wrote {a / 'training_curves.png'}\n"
    assert (a / "training_curves.png").read_bytes().startswith(b"\x89PNG")
    monkeypatch.chdir(tmp_path)
    assert main(["curves", str(a), str(b / "log.csv")]) == 0
    assert (tmp_path / "training_curves.png").read_bytes().startswith(b"\x89PNG")
    assert main(["curves", str(a), "--out", str(tmp_path / "c.jpg")]) == 2
    err = capsys.readouterr().err
    assert err == f"bayesncl: error: --out {tmp_path / 'c.jpg'}: expected a .png file path\n"


def test_curves_of_a_path_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped run dir was "<path> is not a file", as if it were a folder or a device."""
    assert main(["curves", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == (
        f"bayesncl: error: {tmp_path}/nowhere does not exist: expected a run dir (or its log.csv) with at "
        "least one finished epoch\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_one_shared_legend_names_each_run_once(tmp_path: Path) -> None:
    """Per-panel legends covered the lines of a 24-run report; one legend under the panels
    names each run once (held-out style once) and no panel has its own."""
    runs = {f"run-{i}": read_log(_run(tmp_path / f"r{i}", 0.3, [5.6, 5.3])) for i in range(12)}
    for rows in runs.values():
        for r in rows:
            r["heldout_gate_open"] = 0.25
    fig = training_curves_figure(runs, "Training curves of 12 runs")
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [*runs, "held-out batch (dotted, ×)"]
    assert fig.get_suptitle() == "Training curves of 12 runs"


def test_seeds_of_a_variant_share_its_colour_and_each_seed_has_a_marker(tmp_path: Path) -> None:
    """A 24-run figure (the mechanism study's: 8 variants x 3 seeds) cycled 20 colours, so a few runs
    could not be told apart. Labels ending in a seed, as reproduce names them: a variant's seeds share
    its colour, seed s has marker MARKERS[s], and the legend names each variant once, then the seeds."""
    from bayesncl.app.report.curves import MARKERS, run_styles

    labels = [f"{v} | p={p} | seed={s}" for p in (0, 0.9) for v in ("CL", "NCL") for s in range(3)]
    styles, seeds = run_styles(labels)
    assert [c for c, _, _ in styles] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [m for _, m, _ in styles] == ["o", "s", "^"] * 4 and seeds == {0: "o", 1: "s", 2: "^"}
    assert [n for _, _, n in styles][:4] == ["CL | p=0", "_CL | p=0", "_CL | p=0", "NCL | p=0"]
    assert run_styles(["NCL seed 0", "NCL seed 1"])[0] == [(0, "o", "NCL"), (0, "s", "_NCL")]
    # one seed per variant, or a label without a seed: a colour and a legend entry each, as before
    assert run_styles(["NCL seed 0", "CL seed 0"]) == ([(0, "o", "NCL seed 0"), (1, "o", "CL seed 0")], {})
    mixed = ["a seed 1", "a seed 2", "b"]
    assert run_styles(mixed) == ([(0, "o", "a seed 1"), (1, "o", "a seed 2"), (2, "o", "b")], {})
    assert run_styles(["x seed 12", "x seed 0"])[1] == {0: "o", 12: MARKERS[2]} and MARKERS[2] == "^"
    rows = read_log(_run(tmp_path / "r", 0.3, [5.6, 5.3]))
    fig = training_curves_figure(dict.fromkeys(labels, rows), "Training curves of 12 runs")
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "CL | p=0", "NCL | p=0", "CL | p=0.9", "NCL | p=0.9", "seed 0", "seed 1", "seed 2"
    ]
    lines = fig.axes[0].lines
    assert [ln.get_marker() for ln in lines] == ["o", "s", "^"] * 4
    assert lines[0].get_color() == lines[2].get_color() != lines[3].get_color()


def test_a_flat_series_is_labelled_with_its_values_not_an_offset(tmp_path: Path) -> None:
    """CE's held-out SC stays at 10 %: matplotlib labelled that axis 0.000, 0.002 ... with "+1e1" above."""
    rows = read_log(_run(tmp_path / "ce", "", [5.5, 5.25, 5.0]))
    for r in rows:
        r["online_acc"] = 10.0 + 1e-9 * r["epoch"]
    fig = training_curves_figure({"ce": rows})
    fig.canvas.draw()
    ax = fig.axes[1]
    assert ax.yaxis.get_offset_text().get_text() == ""
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "10.0" in labels and ax.get_ylim() == pytest.approx((9.0, 11.0)), labels  # flat at 10, ± 1


def test_a_series_flat_within_one_percent_is_drawn_flat(tmp_path: Path) -> None:
    """CL's held-out SC (11.000 ± 0.0005 over 100 epochs) was drawn as jagged noise filling the panel."""
    rows = read_log(_run(tmp_path / "cl", "", [5.5, 5.25, 5.0]))
    for r, wobble in zip(rows, (0.0, 5e-4, -5e-4), strict=True):
        r["online_acc"] = 11.0 + wobble
    fig = training_curves_figure({"cl": rows})
    lo, hi = fig.axes[1].get_ylim()
    assert lo == pytest.approx(11.0 - 1.1, abs=1e-3) and hi == pytest.approx(11.0 + 1.1, abs=1e-3)
    lo, hi = fig.axes[0].get_ylim()  # InfoNCE falls by 10 %: matplotlib's own limits, around the data
    assert 4.9 < lo <= 5.0 and 5.5 <= hi < 5.6


def test_each_seed_of_a_variant_keeps_its_step_line(tmp_path: Path) -> None:
    """The step rows were looked up by the legend label, which is the variant's once its seeds are
    grouped ("NCL", "_NCL"): reproduce's curves of a variant's seeds drew no step line at all."""
    rows = read_log(_run(tmp_path / "r", 0.3, [5.6, 5.3]))
    steps = {f"NCL seed {s}": [{"step": 25, "epoch": 0.5, "info_nce": 6.0 + s}] for s in (0, 1)}
    fig = training_curves_figure({"NCL seed 0": rows, "NCL seed 1": rows}, steps=steps)
    thin = [ln for ln in fig.axes[0].lines if ln.get_label() == "_steps"]
    assert [list(ln.get_ydata()) for ln in thin] == [[6.0], [7.0]]
