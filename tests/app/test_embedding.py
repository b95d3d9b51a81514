"""The embedding map (t-SNE of z̃ by class) in evaluate's outputs and the HTML report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bayesncl.app.cli import main

from ..conftest import tiny_checkpoint

pytest.importorskip("openTSNE")


def test_embed_keeps_separated_classes_apart_and_is_deterministic():
    from bayesncl.app.report.embedding import embed

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    f = np.abs(rng.normal(size=(120, 16)) * 0.1 + 3 * np.eye(16)[y * 5])
    rows, xy = embed(f, y, cap=90)
    assert len(rows) == 90 and xy.shape == (90, 2)
    assert np.bincount(y[rows]).tolist() == [30, 30, 30]  # class-stratified cap
    # every point's nearest neighbour in the map has its class
    d = ((xy[:, None] - xy[None]) ** 2).sum(-1) + np.diag(np.full(90, np.inf))
    assert (y[rows][d.argmin(1)] == y[rows]).mean() == 1.0
    assert np.array_equal(embed(f, y, cap=90)[1], xy)
    with pytest.raises(ValueError, match="at least 10 test samples"):
        embed(f[:5], y[:5])


@pytest.mark.slow
def test_evaluate_writes_the_map_and_the_report_shows_it(tmp_path: Path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [])
    assert main(["evaluate", str(ckpt), "--probe", "none", "--no-knn"]) == 0
    assert (tmp_path / "embedding.png").read_bytes().startswith(b"\x89PNG")
    html = (tmp_path / "report" / "index.html").read_text()
    assert "figures/embedding.png" in html


def test_features_with_at_most_one_active_dim_get_a_frame_saying_why(monkeypatch, tmp_path: Path, capsys):
    from bayesncl.app.report import figures
    from bayesncl.app.report.embedding import write_embedding_map

    kept: list = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: kept.append(fig) or path)
    y = np.arange(40) % 4
    for active, dims in ((1, "1 active dimension"), (0, "0 active dimensions")):
        why = f"only {dims} of 16: no map"
        f = np.zeros((40, 16))
        f[:, 3] = active  # one coordinate (or none): t-SNE would draw an empty frame
        out = tmp_path / "e.png"
        assert write_embedding_map(f, y, ["a", "b", "c", "d"], out, label="ncl") == out
        (ax,) = kept[-1].axes
        assert [t.get_text() for t in ax.texts] == [why] and not ax.collections  # no points
        assert ax.get_title().endswith("\nncl") and capsys.readouterr().out == f"embedding map: {why}\n"


def test_umap_panel_beside_tsne_or_a_note_without_umap(monkeypatch, tmp_path: Path, capsys):
    import sys

    from bayesncl.app.report import embedding, figures

    kept: list = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: kept.append(fig) or path)
    monkeypatch.setattr(embedding, "UMAP_PANEL", True)
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 20)
    f = np.abs(rng.normal(size=(60, 16)) * 0.1 + 3 * np.eye(16)[y * 5])
    # umap-learn missing: the t-SNE alone and one line saying why
    monkeypatch.setitem(sys.modules, "umap", None)
    assert embedding.write_embedding_map(f, y, ["a", "b", "c"], tmp_path / "e.png") == tmp_path / "e.png"
    assert len(kept[-1].axes) == 1 and capsys.readouterr().out == embedding.UMAP_MISSING + "\n"
    # installed (a stand-in with umap-learn's interface, so the test does not compile numba): two panels
    calls: list = []

    class FakeUMAP:
        def __init__(self, **kw):
            calls.append(kw)

        def fit_transform(self, x):
            return np.asarray(x)[:, :2] * 2

    monkeypatch.setitem(sys.modules, "umap", type(sys)("umap"))
    sys.modules["umap"].UMAP = FakeUMAP
    embedding.write_embedding_map(f, y, ["a", "b", "c"], tmp_path / "e.png")
    tsne_ax, umap_ax = kept[-1].axes
    assert [tsne_ax.get_title(), umap_ax.get_title()] == ["t-SNE", "UMAP"]
    assert calls == [{"n_components": 2, "n_neighbors": 15, "random_state": 0, "n_jobs": 1}]
    rows, _ = embedding.embed(f, y)
    drawn = np.concatenate([c.get_offsets() for c in umap_ax.collections])
    np.testing.assert_allclose(np.sort(drawn[:, 0]), np.sort(f[rows, 0] * 2), rtol=1e-6)  # the same samples
    assert "t-SNE and UMAP of the test features" in kept[-1]._suptitle.get_text()
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_real_umap_keeps_separated_classes_apart(tmp_path: Path):
    pytest.importorskip("umap")
    from bayesncl.app.report.embedding import embed_umap

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 40)
    f = np.abs(rng.normal(size=(120, 16)) * 0.1 + 3 * np.eye(16)[y * 5])
    rows, xy = embed_umap(f, y, cap=90)
    assert len(rows) == 90 and xy.shape == (90, 2)
    d = ((xy[:, None] - xy[None]) ** 2).sum(-1) + np.diag(np.full(90, np.inf))
    assert (y[rows][d.argmin(1)] == y[rows]).mean() == 1.0
    assert np.array_equal(embed_umap(f, y, cap=90)[1], xy)  # seeded: the same map


def test_eval_figures_false_draws_no_figure_and_changes_no_number(tmp_path: Path):
    """``eval.figures=false``: evaluate and the end-of-training evaluation write their numbers, the
    same as with the figures, and no PNG."""
    import json
    import shutil

    import torch

    from bayesncl.app.evaluate import evaluate_model
    from bayesncl.config import build_config
    from bayesncl.core.model import build_model

    from ..conftest import TINY

    ckpt = tiny_checkpoint(tmp_path / "m.pt", [])
    results = {}
    for figures in ("true", "false"):
        d = tmp_path / figures
        d.mkdir()
        shutil.copy(ckpt, d / "m.pt")  # the same weights in both
        assert main(["evaluate", str(d / "m.pt"), "--probe", "none", f"eval.figures={figures}"]) == 0
        results[figures] = json.loads((d / "evaluation.json").read_text())
        pngs = {p.name for p in d.glob("*.png")}
        if figures == "true":  # suppressed_features.png too, where the untrained gate closed a dim
            assert {"embedding.png", "top_activations.png"} <= pngs, pngs
        else:
            assert not pngs, pngs
    assert results["false"] == results["true"] and "knn_acc1" in results["false"]

    cfg = build_config(overrides=[*TINY, "method.name=bayesncl", "eval.figures=false", "eval.probe=none"])
    out = tmp_path / "pretrain-eval"
    out.mkdir()
    metrics = evaluate_model(build_model(cfg, 3, 16, 10), cfg, out, device=torch.device("cpu"))
    assert json.loads((out / "metrics.json").read_text())["n_test"] == metrics["n_test"] == 60
    assert not list(out.glob("*.png"))  # no top_activations.png, no suppressed_features.png
