"""reproduce's error-bar figures: a log axis ticks the swept values, a long title wraps to the
figure's width, the band is ± 1 std, one legend sits under the panels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bayesncl.app.report import figures, plots


def _draw(monkeypatch, tmp_path: Path, panels: list, title: str, seeds: int = 2) -> Any:
    kept: list[Any] = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: kept.append(fig) or path)
    plots.write_error_bar_figure(panels, tmp_path / "f.png", title, seeds)
    return kept[0]


def test_log_axis_ticks_the_swept_values(monkeypatch, tmp_path: Path) -> None:
    points = [(0.1, 45.7, 1.67), (0.25, 38.0, 5.54), (0.5, 36.28, 4.83), (1.0, 38.41, 3.13)]
    panel = ("SC %", "gate lr / backbone lr", "SC (%)", "log", [("B", points, [])])
    fig = _draw(monkeypatch, tmp_path, [panel], "T")
    (ax,) = fig.axes
    assert ax.get_legend() is None and [t.get_text() for t in fig.legends[0].get_texts()] == ["B"]
    assert list(ax.get_xticks()) == [0.1, 0.25, 0.5, 1.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.1", "0.25", "0.5", "1"]
    band = ax.collections[-1].get_paths()[0].vertices[:, 1]  # the ± 1 std band
    assert band.min() == pytest.approx(36.28 - 4.83) and band.max() == pytest.approx(45.7 + 1.67)


def test_a_long_title_wraps_on_one_panel(monkeypatch, tmp_path: Path) -> None:
    title = "NCL feature selection: linear probe on the top-K dims by expected activation vs K random dims"
    panel = ("P", "K", "LP@1 (%)", "linear", [("NCL", [(8, 60.0, 1.0)], [])])
    fig = _draw(monkeypatch, tmp_path, [panel], title)
    lines = fig.get_suptitle().split("\n")
    assert len(lines) > 2 and " ".join(lines) == f"{title} (mean ± std over 2 seeds)"
    assert max(map(len, lines)) <= int(fig.get_figwidth() * 10)
    assert lines[-1] == "(mean ± std over 2 seeds)"  # the spread whole, on a line of its own
    # two panels (ncl-fs): the title on one line, the spread under it, not "... over 3" / "seeds"
    title = "NCL paper: feature selection (top-K by expected activation vs random K)"
    fig = _draw(monkeypatch, tmp_path, [panel, panel], title, seeds=3)
    assert fig.get_suptitle() == f"{title}\n(mean ± std over 3 seeds)"
    fig = _draw(monkeypatch, tmp_path, [panel, panel], "Fig. 3", seeds=3)  # short: one line
    assert fig.get_suptitle() == "Fig. 3 (mean ± std over 3 seeds)"


def test_a_reference_row_is_a_dashed_line_with_its_band(monkeypatch, tmp_path: Path) -> None:
    """ncl-sparsity draws CL and NCL (not swept over β) as horizontal lines beside CL+L1 against β."""
    swept = ("CL+L1", [(1e-3, 0.1, 0.05), (1.0, 24.0, 2.0)], [])
    panel = ("sparsity", "β", "%", "log", [swept, ("NCL", [(None, 58.0, 1.5)], [])])
    fig = _draw(monkeypatch, tmp_path, [panel], "T")
    (ax,) = fig.axes
    ref = [ln for ln in ax.get_lines() if ln.get_label() == "NCL"]
    assert len(ref) == 1 and ref[0].get_linestyle() == "--"
    assert list(ref[0].get_ydata()) == [58.0, 58.0]
    assert sorted(t.get_text() for t in fig.legends[0].get_texts()) == ["CL+L1", "NCL"]
    assert list(ax.get_xticks()) == [1e-3, 1.0]  # the reference adds no tick
    (band,) = ax.patches  # ± 1 std across the panel
    assert band.get_y() == pytest.approx(56.5) and band.get_y() + band.get_height() == pytest.approx(59.5)


def test_whole_number_x_values_get_whole_number_ticks(monkeypatch, tmp_path: Path) -> None:
    """appj's entropy quartiles 1-4 (and epochs) ticked 1.0, 1.5, 2.0, ...; fractional x keep theirs."""
    points = [(float(i), 0.1 * i, 0.01) for i in (1, 2, 3, 4)]
    quartiles = ("b", "quartile", "share", "linear", [("NCL", points, [])])
    (ax,) = _draw(monkeypatch, tmp_path, [quartiles], "T").axes
    shown = [t for t in ax.get_xticks() if 1 <= t <= 4]
    assert shown == [1.0, 2.0, 3.0, 4.0]
    rho = ("b", "ρ", "SC", "linear", [("B", [(0.1, 1.0, 0.1), (0.2, 2.0, 0.1), (0.3, 3.0, 0.1)], [])])
    (ax,) = _draw(monkeypatch, tmp_path, [rho], "T").axes
    assert any(not float(t).is_integer() for t in ax.get_xticks())
