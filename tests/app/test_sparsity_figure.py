"""The per-sample activation sparsity figure (the NCL paper's Fig. 1 c, d): hand counts, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bayesncl.app.report.sparsity import active_per_sample, sparsity_figure, sparsity_histogram


def test_counts_equal_hand_counts() -> None:
    f = np.array([
        [0.0, 0.5, 0.0, 0.0],   # 1 active
        [1.0, 1.0, 1.0, 1.0],   # 4
        [1e-6, -2.0, 0.0, 3.0],  # 2: 1e-6 is at most 1e-5, -2 counts by magnitude
        [0.0, 0.0, 0.0, 0.0],   # 0
        [0.0, 2e-5, 0.0, 0.0],  # 1
    ])  # fmt: skip
    assert active_per_sample(f).tolist() == [1, 4, 2, 0, 1]
    assert sparsity_histogram(f).tolist() == [1, 2, 1, 0, 1]  # rows with 0, 1, 2, 3, 4 active dims
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        active_per_sample(np.zeros(4))


def test_figure_of_several_runs_is_written_with_their_shares(monkeypatch, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    dense = np.ones((10, 8))
    sparse = np.zeros((10, 8))
    sparse[:6, 0] = 1.0  # 6 images with one active dim, 4 with none
    out = sparsity_figure({"CL": dense, "NCL": sparse}, tmp_path / "sparsity.png", title="t")
    assert out.read_bytes().startswith(b"\x89PNG")
    kept: list = []
    monkeypatch.setattr(plt, "close", lambda fig: kept.append(fig))  # the figure, still readable
    sparsity_figure({"CL": dense, "NCL": sparse}, tmp_path / "s.png")
    (ax,) = kept[-1].axes
    cl, ncl = (p.get_data().values for p in ax.patches)  # the two step outlines, in the runs' order
    assert cl.tolist() == [0.0] * 8 + [100.0] and ncl.tolist() == [40.0, 60.0] + [0.0] * 7
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["CL (mean 8.0 of 8 dims)", "NCL (mean 0.6 of 8 dims)"]
    with pytest.raises(ValueError, match="at least one run"):
        sparsity_figure({}, tmp_path / "x.png")
