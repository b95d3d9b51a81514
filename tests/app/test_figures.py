"""Figures: the right dims and images are chosen, and a PNG is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.app.report.figures import (
    most_active_dims,
    suppressed_features_figure,
    top_activations_figure,
    top_samples,
)


def _feats() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    f = np.zeros((20, 5), dtype=np.float32)
    f[:, 3] = np.arange(20)  # strongest dim, row 19 largest
    f[:10, 1] = 1.0  # second
    f[4, 0] = 0.5  # weakest active dim; dim 2 and 4 never fire
    z = rng.random((20, 5)).astype(np.float32)
    mask = np.ones((20, 5), dtype=np.float32)
    mask[:, 2] = 0  # gate always closed on dim 2
    mask[7, 4] = 0
    return {
        "features": f,
        "z": z,
        "mask": mask,
        "labels": np.arange(20) % 2,
        "indices": np.arange(20)[::-1].copy(),  # features row i is image 19 - i
    }


def test_most_active_dims_ranks_by_expected_activation() -> None:
    f = _feats()["features"]
    assert most_active_dims(f, 10).tolist() == [3, 1, 0]  # never-firing dims are skipped
    assert most_active_dims(f, 2).tolist() == [3, 1]


def test_top_samples_are_the_largest_rows() -> None:
    f = _feats()["features"]
    assert top_samples(f, [3], 3).tolist() == [[19, 18, 17]]


def test_figures_written(tmp_path: Path) -> None:
    feats = _feats()
    images = torch.arange(20, dtype=torch.uint8).view(20, 1, 1, 1).expand(20, 1, 8, 8).contiguous()
    p = top_activations_figure(feats, images, ["even", "odd"], tmp_path / "top.png", n_images=4)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    q = suppressed_features_figure(feats, images, ["even", "odd"], tmp_path / "s.png", n_images=4)
    assert q.exists() and not list(tmp_path.glob(".*tmp*"))


def test_nothing_to_draw_is_a_clear_error(tmp_path: Path) -> None:
    feats = _feats()
    feats["features"] = np.zeros_like(feats["features"])
    images = torch.zeros(20, 1, 8, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="no active dimension"):
        top_activations_figure(feats, images, ["a", "b"], tmp_path / "x.png")
    feats.pop("mask")
    with pytest.raises(ValueError, match="needs a gated method"):
        suppressed_features_figure(feats, images, ["a", "b"], tmp_path / "y.png")


def test_retrieval_table() -> None:
    from bayesncl.app.report import format_retrieval

    md = format_retrieval({"64": {"P@1": 50.0, "P@3": 40.0, "P@5": 30.0, "P@10": 20.0, "mAP@10": 12.345}})
    assert md.splitlines()[0] == "| K | P@1 | P@3 | P@5 | P@10 | mAP@10 |"
    assert md.splitlines()[2] == "| 64 | 50.00 | 40.00 | 30.00 | 20.00 | 12.35 |"
