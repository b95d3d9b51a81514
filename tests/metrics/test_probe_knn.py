"""Linear probe, feature-selection probe and weighted kNN on generated data."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import bayesncl.metrics.knn as knn_module
from bayesncl.metrics.inputs import EvalError
from bayesncl.metrics.knn import knn_accuracy
from bayesncl.metrics.probe import (
    feature_selection_probe,
    linear_probe,
    probe_columns,
    selection_probes,
    stratified_split,
)


def blobs(n_train=600, n_test=300, d=16, classes=5, sep=4.0, seed=0, nonneg=False):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, d, generator=g) * sep
    ytr = torch.arange(n_train) % classes
    yte = torch.arange(n_test) % classes
    xtr = centres[ytr] + torch.randn(n_train, d, generator=g)
    xte = centres[yte] + torch.randn(n_test, d, generator=g)
    if nonneg:
        xtr, xte = torch.relu(xtr), torch.relu(xte)
    return xtr, ytr, xte, yte


def test_probe_separates_blobs():
    xtr, ytr, xte, yte = blobs()
    out = linear_probe(xtr, ytr, xte, yte)
    assert out["acc1"] > 95.0 and out["acc5"] == 100.0
    assert out["acc1_std"] == 0.0 and len(out["per_seed"]) == 1
    assert out["per_seed"][0]["l2"] in (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)
    assert "fast probe" in out["protocol"]


def test_probe_random_labels_is_near_chance():
    xtr, _, xte, _ = blobs(seed=1)
    g = torch.Generator().manual_seed(2)
    ytr = torch.randint(0, 5, (len(xtr),), generator=g)
    yte = torch.randint(0, 5, (len(xte),), generator=g)
    out = linear_probe(xtr, ytr, xte, yte, seeds=[0, 1, 2])
    assert 8.0 < out["acc1"] < 32.0  # chance is 20 %
    assert len(out["per_seed"]) == 3 and out["acc1_std"] >= 0.0


def test_probe_seeds_and_options():
    xtr, ytr, xte, yte = blobs(sep=0.6, seed=3)  # overlapping blobs: accuracy between chance and 100
    out = linear_probe(xtr.numpy(), ytr.numpy(), xte.numpy(), yte.numpy(), seeds=[0, 1], l2_grid=[1e-2, 1e-4])
    accs = [r["acc1"] for r in out["per_seed"]]
    assert out["acc1"] == pytest.approx(np.mean(accs)) and out["acc1_std"] == pytest.approx(np.std(accs))
    assert 30.0 < out["acc1"] < 100.0
    assert linear_probe(xtr, ytr, xte, yte, seeds=4)["per_seed"][0]["seed"] == 4
    single = linear_probe(xtr, ytr, xte, yte, l2_grid=[1e-3])  # no held-out selection needed
    assert single["per_seed"][0]["l2"] == 1e-3
    # three classes: Acc@5 becomes Acc@3 = 100
    keep = ytr < 3, yte < 3
    assert linear_probe(xtr[keep[0]], ytr[keep[0]], xte[keep[1]], yte[keep[1]])["acc5"] == 100.0


@pytest.mark.parametrize(
    "grid,message",
    [
        ([], r"^l2_grid is empty: give at least one non-negative L2 strength, e\.g\. \[1e-3\]$"),
        ([1e-3, -1.0], r"^l2_grid must hold finite non-negative values; got \[0\.001, -1\.0\]$"),
        ([float("nan")], r"^l2_grid must hold finite non-negative values; got \[nan\]$"),
        ([float("inf")], r"^l2_grid must hold finite non-negative values; got \[inf\]$"),
    ],
)
def test_probe_bad_l2_grid(grid, message):
    xtr, ytr, xte, yte = blobs(n_train=20, n_test=10, d=3)
    with pytest.raises(EvalError, match=message):
        linear_probe(xtr, ytr, xte, yte, l2_grid=grid)


def test_probe_unknown_test_class_counts_as_error():
    xtr, ytr, xte, yte = blobs()
    yte = yte.clone()
    yte[:30] = 99
    out = linear_probe(xtr, ytr, xte, yte, l2_grid=[1e-3])
    assert out["acc1"] <= 90.0 + 1e-9


def test_stratified_split_holds_out_each_class():
    labels = torch.tensor([0] * 50 + [1] * 20 + [2] * 1)
    fit, val = stratified_split(labels, 0.1, seed=0)
    assert torch.bincount(labels[val], minlength=3).tolist() == [5, 2, 0]
    assert sorted(torch.cat([fit, val]).tolist()) == list(range(71))


def test_feature_selection_probe_uses_expected_activation():
    # 4 informative dims with large activations and 12 weak noise dims
    xtr, ytr, xte, yte = blobs(d=4, sep=5.0, nonneg=True, seed=5)
    g = torch.Generator().manual_seed(6)
    noise_tr = 0.05 * torch.rand(len(xtr), 12, generator=g)
    noise_te = 0.05 * torch.rand(len(xte), 12, generator=g)
    xtr = torch.cat([noise_tr[:, :6], xtr, noise_tr[:, 6:]], 1)
    xte = torch.cat([noise_te[:, :6], xte, noise_te[:, 6:]], 1)
    out = feature_selection_probe(xtr, ytr, xte, yte, k=4)
    assert sorted(out["dims"]) == [6, 7, 8, 9] and out["k"] == 4
    assert out["acc1"] > 90.0
    for k in (0, 17, 4.0, True):
        msg = f"feature_selection_probe: k={k!r}: expected the number of top dims to keep, an integer with "
        with pytest.raises(EvalError, match="^" + re.escape(msg) + r"1 <= k <= D=16$"):
            feature_selection_probe(xtr, ytr, xte, yte, k=k)
    assert feature_selection_probe(xtr, ytr, xte, yte, k=np.int64(4))["dims"] == out["dims"]


def test_knn_separates_blobs_and_random_labels_are_chance():
    xtr, ytr, xte, yte = blobs(sep=4.0)
    out = knn_accuracy(xtr, ytr, xte, yte)
    assert out["acc1"] > 95.0 and out["acc5"] == 100.0
    g = torch.Generator().manual_seed(7)
    rnd = knn_accuracy(xtr, torch.randint(0, 5, (len(xtr),), generator=g), xte, yte, chunk_size=37)
    assert 8.0 < rnd["acc1"] < 32.0
    assert knn_module.__all__ == ["knn_accuracy"]  # one name, the one bayesncl.metrics exports


def test_knn_weighting_by_hand():
    # query along e0; bank: two class-1 points at cos 0.9, one class-0 point at cos 1.0, k = 3
    c9 = (0.9, float(np.sqrt(1 - 0.81)))
    bank = torch.tensor([[1.0, 0.0], [c9[0], c9[1]], [c9[0], -c9[1]]])
    labels = torch.tensor([0, 1, 1])
    q = torch.tensor([[1.0, 0.0]])
    # exp(1/0.07) = 1.6e6 > 2 exp(0.9/0.07) = 7.7e5 -> class 0; with T = 0.5 the pair wins
    assert knn_accuracy(bank, labels, q, torch.tensor([0]), k=3, topk=(1,))["acc1"] == 100.0
    assert knn_accuracy(bank, labels, q, torch.tensor([1]), k=3, temperature=0.5, topk=(1,))["acc1"] == 100.0
    # k larger than the bank is capped
    assert knn_accuracy(bank, labels, q, torch.tensor([0]), k=200, topk=(1,))["acc1"] == 100.0


def test_probe_knn_bad_inputs():
    xtr, ytr, xte, yte = blobs()
    with pytest.raises(EvalError, match="D=16 but test features have D=8"):
        knn_accuracy(xtr, ytr, xte[:, :8], yte)
    with pytest.raises(EvalError, match="labels has 10 entries but features has 600 rows"):
        linear_probe(xtr, ytr[:10], xte, yte)
    with pytest.raises(EvalError, match="at least 2 classes"):
        linear_probe(xtr, torch.zeros_like(ytr), xte, yte)
    with pytest.raises(EvalError, match="needs train and test labels"):
        knn_accuracy(xtr, None, xte, yte)


def _one_label_dim(n_train: int = 200, n_test: int = 100, d: int = 8, seed: int = 0):
    """2 classes; dim 0 is 1 + the label (1 or 2: it alone carries the label, and its expected
    activation is the largest), dims 1..7 are uniform noise in [0, 0.1·k) (so their ranks by expected
    activation run 7, 6, ..., 1: not index order). Non-negative, as NCL's z̃."""
    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.arange(n) % 2
        noise = torch.rand(n, d - 1, generator=g) * (0.1 * torch.arange(1, d))
        return torch.cat([(1.0 + y)[:, None].float(), noise], 1), y

    (xtr, ytr), (xte, yte) = split(n_train), split(n_test)
    return xtr, ytr, xte, yte


def test_selection_probes_top1_finds_the_label_dim_and_random1_is_worse_on_average():
    xtr, ytr, xte, yte = _one_label_dim()
    assert feature_selection_probe(xtr, ytr, xte, yte, k=1)["dims"] == [0]
    assert feature_selection_probe(xtr, ytr, xte, yte, k=8)["dims"] == [0, 7, 6, 5, 4, 3, 2, 1]
    runs = [selection_probes(xtr, ytr, xte, yte, ks=(1,), seed=s)[1] for s in range(16)]
    assert all(r["top_acc1"] == 100.0 for r in runs)  # dim 0 separates the two classes exactly
    # random 1: dim 0 with chance 1/8 (100 %), else a noise dim (about 50 %): about 56 % expected
    hits = [s for s in range(16) if np.random.default_rng(s).choice(8, size=1, replace=False)[0] == 0]
    for s, r in enumerate(runs):
        assert (r["random_acc1"] == 100.0) == (s in hits), s
    mean = float(np.mean([r["random_acc1"] for r in runs]))
    assert 40.0 < mean < 80.0


def test_selection_probes_at_k_equal_d_are_the_same_probe():
    # top-D in rank order (0, 7, 6, ..., 1) and random D (a permutation) are the same set of dims: the
    # probe sees them in index order, so both are bit for bit the probe on all features
    xtr, ytr, xte, yte = _one_label_dim(seed=3)
    xtr[:, 0] += 0.3 * torch.rand(len(xtr), generator=torch.Generator().manual_seed(1))  # not separable
    xte[:, 0] += 0.3 * torch.rand(len(xte), generator=torch.Generator().manual_seed(2))
    full = linear_probe(xtr, ytr, xte, yte, seeds=5)["acc1"]
    for seed in (5, 6):
        out = selection_probes(xtr, ytr, xte, yte, ks=(2, 8), seed=seed)
        assert out[8]["top_acc1"] == out[8]["random_acc1"]
        assert feature_selection_probe(xtr, ytr, xte, yte, k=8, seeds=5)["acc1"] == full
    assert selection_probes(xtr, ytr, xte, yte, ks=(8,), seed=5)[8]["top_acc1"] == full
    # the random dims: default_rng(seed) drawn once per K in the order of ks
    rng = np.random.default_rng(6)
    idx = np.sort(rng.choice(8, size=2, replace=False))
    expected = linear_probe(xtr[:, idx], ytr, xte[:, idx], yte, seeds=6)["acc1"]
    assert selection_probes(xtr, ytr, xte, yte, ks=(2, 8), seed=6)[2]["random_acc1"] == expected


def test_probe_columns_depends_on_the_set_of_columns_only():
    xtr, ytr, xte, yte = blobs(d=6, sep=1.0, seed=2)
    a = probe_columns(xtr, ytr, xte, yte, [4, 0, 2])
    b = probe_columns(xtr, ytr, xte, yte, np.array([0, 2, 4]))
    assert a["acc1"] == b["acc1"] and a["per_seed"] == b["per_seed"]
    assert a["acc1"] == linear_probe(xtr[:, [0, 2, 4]], ytr, xte[:, [0, 2, 4]], yte)["acc1"]
    for bad in ([], [1, 1], [6], [-1]):
        with pytest.raises(EvalError, match=r"^probe columns must be distinct dims in 0\.\.5; got "):
            probe_columns(xtr, ytr, xte, yte, bad)
    msg = "selection_probes: k=7: expected the number of top dims to keep, an integer with 1 <= k <= D=6"
    with pytest.raises(EvalError, match="^" + re.escape(msg) + "$"):
        selection_probes(xtr, ytr, xte, yte, ks=(2, 7))
