"""dSprites (generated), MIG (Chen et al. 2018) and the NCL repository's retrieval ``map``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bayesncl.app.cli import main
from bayesncl.metrics import EvalError

from ..conftest import error_line, expect, tiny_checkpoint

DS = ["data.name=dsprites", "data.train_subset=96", "data.test_subset=60"]


# ----------------------------------------------------------------------------- dSprites
def test_dsprites_grid_and_factor_order():
    from bayesncl.data import dsprites as d

    assert d.NUM_IMAGES == 737_280 and d.FACTOR_SIZES == (3, 6, 40, 32, 32)
    assert np.allclose(d.FACTOR_VALUES[1], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert d.FACTOR_VALUES[2][0] == 0 and d.FACTOR_VALUES[2][-1] == pytest.approx(2 * np.pi)
    # the released order: posY fastest, shape slowest
    assert d.grid_factors(np.array([0, 1, 32, 32 * 32, d.NUM_IMAGES - 1])).tolist() == [
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [0, 0, 1, 0, 0], [2, 5, 39, 31, 31]
    ]


def test_dsprites_render_binary_and_geometry():
    from bayesncl.data import dsprites as d

    # square, scale 1, no rotation, centred-ish: half-side R = 0.15 * 64 = 9.6 px -> a 19 or 20 px square
    im = d.render(np.array([[0, 5, 0, 16, 16], [1, 5, 0, 16, 16], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]]))
    assert im.dtype == np.uint8 and set(np.unique(im)) <= {0, 255}
    rows, cols = np.nonzero(im[0])
    assert 19 <= np.ptp(rows) + 1 <= 20 and 19 <= np.ptp(cols) + 1 <= 20
    assert (im[0] > 0).sum() > (im[1] > 0).sum() > 0  # the ellipse (R x R/2) is about half the square
    assert np.all(np.nonzero(im[3])[0] < 32) and np.all(np.nonzero(im[3])[1] < 32)  # pos 0: top left
    # orientation 2π (the last of 40) draws what orientation 0 draws, up to a pixel's rounding
    turned = d.render(np.array([[0, 5, 39, 16, 16]]))[0]
    assert (turned != im[0]).sum() <= 4


def test_dsprites_splits_deterministic_disjoint_and_factors():
    from bayesncl.config import build_config
    from bayesncl.data import dataset_info
    from bayesncl.data.dsprites import factors_of, split_indices
    from bayesncl.data.sources import load_split

    cfg = build_config(overrides=DS).data
    train, test = load_split(cfg, "train"), load_split(cfg, "test")
    assert train.images.shape == (96, 1, 64, 64) and test.images.shape == (60, 1, 64, 64)
    assert np.array_equal(train.labels, train.factors[:, 0])  # the label is the shape
    tr, te = split_indices("train", (96, 60)), split_indices("test", (96, 60))
    assert not set(tr) & set(te) and np.array_equal(tr, split_indices("train", (96, 60)))
    assert np.array_equal(factors_of(cfg, "test"), test.factors)
    info = dataset_info(cfg)
    assert (info.channels, info.image_size, info.class_names) == (1, 64, ("square", "ellipse", "heart"))
    assert len(split_indices("test", (0, 0))) == 10_000


def test_extract_carries_factors_and_metrics_report_mig(tmp_path: Path, capsys):
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [*DS, "data.image_size=16"], channels=1, num_classes=3)
    out = tmp_path / "f.npz"
    assert main(["extract", str(ckpt), "--out", str(out), "--factors"]) == 0
    with np.load(out) as z:
        factors, idx = z["factors"], z["indices"]
        meta = json.loads(str(z["meta"]))
    from bayesncl.config import build_config
    from bayesncl.data.dsprites import factors_of

    assert meta["factor_names"] == ["shape", "scale", "orientation", "posX", "posY"]
    assert np.array_equal(factors, factors_of(build_config(overrides=DS).data, "test")[idx])
    capsys.readouterr()
    assert main(["metrics", str(out), "--json", "--mig"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert 0 <= res["mig"] <= 1 and set(res["mig_per_factor"]) == set(meta["factor_names"])


# ----------------------------------------------------------------------------- MIG by hand
def _grid2() -> tuple[np.ndarray, np.ndarray]:
    a, b = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    return a, b


def test_mig_perfect_code_is_one():
    from bayesncl.metrics.disentanglement import mig

    a, b = _grid2()
    codes = np.stack([3.0 * a, -b, np.zeros(4)], 1)  # one dim per factor (any scale), one dead dim
    assert mig(codes, np.stack([a, b], 1))["mig"] == pytest.approx(1.0)


def test_mig_mixed_codes_by_hand():
    from bayesncl.metrics.disentanglement import mig

    a, b = _grid2()
    # z = (a, a xor b): a captured alone (gap log 2 / log 2 = 1); b shares nothing with either dim (0)
    r = mig(np.stack([a, a ^ b], 1).astype(float), np.stack([a, b], 1), names=["a", "b"])
    assert r["mig_per_factor"] == pytest.approx({"a": 1.0, "b": 0.0}) and r["mig"] == pytest.approx(0.5)
    # z = (a + b, a): I(a+b; a) = I(a+b; b) = H(a+b) - H(a+b | a) = 1.5 - 1 bits = 0.5 bit, I(a; a) = 1 bit
    # gaps: a (1 - 0.5) / 1 = 0.5, b (0.5 - 0) / 1 = 0.5
    r = mig(np.stack([a + b, a], 1).astype(float), np.stack([a, b], 1))
    assert r["mig"] == pytest.approx(0.5) and r["mig"] < 1


def test_mig_discretisation_matches_disentanglement_lib():
    from bayesncl.metrics.disentanglement import discrete_mutual_info, histogram_discretize

    rng = np.random.default_rng(0)
    z = rng.normal(size=(500, 3))
    z[:, 2] = 1.5  # a constant column: one bin
    got = histogram_discretize(z)
    for j in range(3):  # their utils.histogram_discretize: digitize on histogram(...)[1][:-1] (codes 1..20)
        want = np.digitize(z[:, j], np.histogram(z[:, j], 20)[1][:-1])
        assert np.array_equal(got[:, j] + 1, want)
    assert got.min() == 0 and got[:, 0].max() == 19 and np.unique(got[:, 2]).size == 1
    # a naive I(x; y) from probabilities
    x, y = rng.integers(0, 4, 300), rng.integers(0, 3, 300)
    pxy = np.array([[np.mean((x == i) & (y == j)) for j in range(3)] for i in range(4)])
    px, py = pxy.sum(1), pxy.sum(0)
    cells = [(i, j) for i in range(4) for j in range(3) if pxy[i, j]]
    naive = sum(pxy[i, j] * np.log(pxy[i, j] / (px[i] * py[j])) for i, j in cells)
    assert discrete_mutual_info(x, y) == pytest.approx(naive)


def test_mig_bad_inputs():
    from bayesncl.metrics.disentanglement import mig

    with pytest.raises(EvalError, match="MIG needs factor labels"):
        mig(np.ones((4, 2)), None)
    with pytest.raises(EvalError, match="at least 2 code dimensions"):
        mig(np.ones((4, 1)), np.zeros((4, 1), dtype=int))
    a, b = _grid2()
    three = np.stack([a, b, np.zeros(4, int)], 1)
    r = mig(np.stack([a, b], 1).astype(float), three, names=["a", "b", "colour"])
    assert r["mig"] == pytest.approx(1.0) and "colour" in r["mig_note"]


def test_bad_input_rows_for_factors(tmp_path: Path, capsys):
    from bayesncl.runs.features import save_features

    save_features(tmp_path / "plain.npz", features=np.abs(np.random.default_rng(0).normal(size=(20, 4))),
                  labels=np.arange(20) % 2)
    assert main(["metrics", str(tmp_path / "plain.npz"), "--mig"]) == 2
    expect("V6", error_line(capsys), tmp_path)
    ckpt = tiny_checkpoint(tmp_path / "m.pt", [])
    assert main(["extract", str(ckpt), "--factors", "--out", str(tmp_path / "f.npz")]) == 2
    expect("V5", error_line(capsys), tmp_path)
    assert not (tmp_path / "f.npz").exists()


# ----------------------------------------------------------------------------- NCL's map
def _ncl_map_reference(f: np.ndarray, y: np.ndarray, k: int) -> float:
    """Their loop, transcribed: normalise, rank dims by column sums, top-K slice, squared distances."""
    g = f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)
    g = g[:, np.argsort(-g.sum(0), kind="stable")[:k]]
    total = 0.0
    for i in range(len(g)):
        order = np.argsort(((g - g[i]) ** 2).sum(1), kind="stable")
        correct = sum(1 for j in range(1, 11) if order[j] != i and y[order[j]] == y[i])
        total += correct / 10
    return 100 * total / len(g)


def test_ncl_map_matches_their_loop_and_differs_from_ours():
    from bayesncl.metrics import retrieval_metrics
    from bayesncl.metrics.ncl_retrieval import ncl_map

    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 80)
    f = np.abs(rng.normal(size=(80, 12)) + 0.8 * np.eye(12)[y * 3])
    for k in (1, 4, 12):
        assert ncl_map(f, y, k) == pytest.approx(_ncl_map_reference(f, y, k))
    assert ncl_map(f, y, 4) != pytest.approx(retrieval_metrics(f, y, dims=[4])["4"]["mAP@10"])
    # 20 identical copies per class: every neighbour shares the label, but their loop counts the query
    # itself as a miss where a tie puts it at ranks 1..10 (the copies 1..10 of each class, stable order):
    # (10 queries x 9/10 + 10 x 10/10) / 20 = 95 %
    sep = np.repeat(np.eye(4), 20, axis=0)
    assert ncl_map(sep, np.repeat(np.arange(4), 20), 4) == pytest.approx(95.0)
    with pytest.raises(EvalError, match="out of range"):
        ncl_map(f, y, 13)


def test_compute_all_reports_ncl_map_beside_retrieval():
    from bayesncl.metrics import compute_all

    rng = np.random.default_rng(2)
    f, y = np.abs(rng.normal(size=(40, 8))), rng.integers(0, 3, 40)
    out = compute_all(f, y, retrieval_dims=[4, 8])
    assert set(out["ncl_map"]) == {"4", "8"} and set(out["retrieval"]["4"]) == {"P@1", "P@3", "P@5", "P@10",
                                                                                 "mAP@10"}
