"""Interpretability metrics, retrieval, SEPIN and the features file (docs/metrics.md).

Every vectorised metric is checked against a naive per-dimension loop written the way the
authors' evaluation code is (Cui-Peng-624/BayesNCL, solo/methods/bayesncl_eval_helper_functions.py),
and against small cases computed by hand.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bayesncl import metrics as M
from bayesncl.app.evaluate import metrics_command
from bayesncl.metrics import spectral as EM
from bayesncl.metrics.inputs import EvalError, EvalWarning
from bayesncl.metrics.retrieval import (
    average_precision_at_k,
    rank_dims,
    retrieval_metrics,
    select_top_dims,
)
from bayesncl.runs.features import load_features, save_features

EPS = 1e-5

# ---------------------------------------------------------------------------------------------
# naive references: one Python iteration per dimension, like the authors' loops
# ---------------------------------------------------------------------------------------------


def ref_semantic_consistency(feats: torch.Tensor, labels: torch.Tensor) -> float:
    feats = feats.double()
    feats = feats[:, feats.abs().sum(0) > 0]
    feats = F.normalize(feats, dim=1)
    accs = []
    for i in range(feats.shape[1]):
        sel = labels[feats.abs()[:, i] > EPS]
        if sel.numel() == 0:
            continue
        dist = sel.bincount().double()
        dist = dist / dist.sum()
        accs.append(dist.max().item())
    return 100.0 * float(np.mean(accs)) if accs else 0.0


def _ref_entropy(feats, labels, kind: str, authors_eps: bool) -> float:
    feats = feats.double()
    feats = feats[:, feats.abs().sum(0) > EPS]
    _, inv = torch.unique(labels, return_inverse=True)
    sizes = torch.bincount(inv).double() + (EPS if authors_eps else 0.0)
    ents = []
    for i in range(feats.shape[1]):
        col = feats[:, i].abs()
        if kind == "sum":
            w = torch.bincount(inv, weights=col)
        elif kind == "mean":
            w = torch.bincount(inv, weights=col) / sizes
        else:
            w = torch.bincount(inv, weights=(col > EPS).double())
        total = w.sum()
        if total < EPS:
            continue
        p = w / total
        p = p[p > EPS]
        if p.numel():
            ents.append(float(-(p * p.log()).sum()))
    return float(np.mean(ents)) if ents else 0.0


def ref_orthogonality(feats: torch.Tensor) -> float:
    f = feats.double()
    f = f[:, f.abs().sum(0) > 0]
    d = f.shape[1]
    f = F.normalize(f, dim=0)
    total = 0.0
    for i in range(d):
        for j in range(d):
            if i != j:
                total += abs(float(f[:, i] @ f[:, j]))
    return total / (d * (d - 1))


def ref_effective_rank(feats: torch.Tensor) -> float:
    s = np.linalg.svd(feats.double().numpy(), compute_uv=False)
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def sparse_features(seed: int, n=300, d=40, classes=(0, 2, 3, 7, 9), unit_rows=True):
    """Random sparse non-negative features: dead dims, class-specific dims (classes absent from
    them), values just below/above the 1e-5 threshold, optionally non-unit rows."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor(classes)[torch.randint(0, len(classes), (n,), generator=g)]
    feats = torch.relu(torch.randn(n, d, generator=g, dtype=torch.float64) - 0.8)
    # class-specific dims: only some classes may fire on them
    for k in range(0, d, 3):
        allowed = torch.tensor(classes)[torch.randperm(len(classes), generator=g)[:2]]
        feats[~torch.isin(labels, allowed), k] = 0
    tiny = torch.rand(n, d, generator=g, dtype=torch.float64) < 0.05
    feats[tiny] = torch.where(torch.rand(int(tiny.sum()), generator=g) < 0.5, 5e-6, 2e-5).double()
    feats[:, [k for k in (5, 11) if k < d]] = 0  # dead dims
    if unit_rows:
        feats = F.normalize(feats, dim=1)
    else:
        feats = feats * torch.exp(torch.randn(n, 1, generator=g, dtype=torch.float64))
    return feats, labels


def h2(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


# ---------------------------------------------------------------------------------------------
# SC and semantic entropies
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("unit_rows", [True, False])
def test_semantic_metrics_match_naive_loops(seed, unit_rows):
    feats, labels = sparse_features(seed, unit_rows=unit_rows)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        f = feats.to(dtype)
        got = M.semantic_metrics(f, labels)
        assert got["semantic_consistency"] == pytest.approx(ref_semantic_consistency(feats, labels), abs=1e-9)
        for kind in ("sum", "mean", "freq"):
            exact = _ref_entropy(feats, labels, kind, authors_eps=False)
            assert got[f"semantic_entropy_{kind}"] == pytest.approx(exact, abs=tol)
            # the authors add 1e-5 to the class sizes in H_mean: a difference below 1e-6 nats
            authors = _ref_entropy(feats, labels, kind, authors_eps=True)
            assert got[f"semantic_entropy_{kind}"] == pytest.approx(authors, abs=max(tol, 1e-6))
    # the single-metric functions agree with the joint one
    assert M.semantic_consistency(feats, labels) == got["semantic_consistency"]
    assert M.semantic_entropy_sum(feats, labels) == pytest.approx(got["semantic_entropy_sum"], abs=1e-5)
    assert M.semantic_entropy_mean(feats.numpy(), labels.numpy()) == pytest.approx(
        got["semantic_entropy_mean"], abs=1e-5
    )
    assert M.semantic_entropy_freq(feats, labels) == pytest.approx(got["semantic_entropy_freq"], abs=1e-9)


def test_scatter_fallback_and_negative_labels(monkeypatch):
    # Many classes x many rows switches the one-hot product to a float64 scatter-add.
    import bayesncl.metrics.semantic as impl

    feats, labels = sparse_features(7, unit_rows=False)
    dense = M.semantic_metrics(feats.float(), labels)
    monkeypatch.setattr(impl, "_MAX_ONEHOT_ELEMENTS", 0)
    scattered = M.semantic_metrics(feats.float(), labels - 5)  # label values do not matter
    for key, val in dense.items():
        assert scattered[key] == pytest.approx(val, abs=1e-5)


def test_sc_threshold_uses_row_normalised_features():
    # Row 0 has norm 1e3: its 5e-3 entry is 5e-6 after normalisation (below the threshold for SC)
    # but 5e-3 > 1e-5 raw (counted by H_freq).
    feats = torch.tensor([[1e3, 5e-3], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    assert M.semantic_consistency(feats, labels) == pytest.approx(ref_semantic_consistency(feats, labels))
    assert M.semantic_consistency(feats, labels) == pytest.approx(100.0)
    assert M.semantic_entropy_freq(feats, labels) == pytest.approx(h2(0.5) / 2)


def test_one_hot_class_features_are_perfectly_consistent():
    labels = torch.arange(6).repeat_interleave(5)
    feats = F.one_hot(labels, 6).float()
    out = M.compute_all(feats, labels)
    assert out["semantic_consistency"] == pytest.approx(100.0)
    for key in ("semantic_entropy_sum", "semantic_entropy_mean", "semantic_entropy_freq"):
        assert out[key] == pytest.approx(0.0, abs=1e-12)
    assert out["active_dims"] == 6 and out["activation_ratio"] == 1.0
    assert out["sparsity"] == pytest.approx(1 - 1 / 6)
    assert out["orthogonality"] == pytest.approx(0.0, abs=1e-12)
    assert out["effective_rank"] == pytest.approx(6.0, rel=1e-9)  # six equal singular values


def test_dense_positive_features_give_majority_share():
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    feats = torch.rand(100, 16, generator=g) + 0.5
    assert M.semantic_consistency(feats, labels) == pytest.approx(50.0)
    assert M.sparsity(feats) == 0.0


def test_hand_computed_4x3_entropies():
    feats = torch.tensor([[1.0, 0, 2], [5, 0, 0], [0, 0, 1], [2, 4, 0]])
    labels = torch.tensor([0, 0, 0, 1])
    # dim 0: class sums (6, 2), class means (2, 2), firing counts (2, 1); dims 1, 2: one class only
    out = M.semantic_metrics(feats, labels)
    assert out["semantic_entropy_sum"] == pytest.approx(h2(0.75) / 3, abs=1e-7)
    assert out["semantic_entropy_mean"] == pytest.approx(h2(0.5) / 3, abs=1e-7)
    assert out["semantic_entropy_freq"] == pytest.approx(h2(2 / 3) / 3, abs=1e-7)
    # SC: dim 0 fires for labels (0, 0, 1) -> 2/3; dims 1 and 2 are pure
    assert out["semantic_consistency"] == pytest.approx(100 * (2 / 3 + 1 + 1) / 3)
    per_dim = M.semantic_consistency_per_dim(feats, labels)
    np.testing.assert_allclose(per_dim, [2 / 3, 1, 1])


def test_single_class_and_signed_features():
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(50, 8, generator=g)  # CL-like signed features: |F| is used
    labels = torch.full((50,), 3)
    out = M.compute_all(feats, labels)
    assert out["semantic_consistency"] == pytest.approx(100.0)
    assert out["semantic_entropy_sum"] == out["semantic_entropy_mean"] == out["semantic_entropy_freq"] == 0.0
    labels2 = torch.randint(0, 4, (50,), generator=g)
    assert M.semantic_consistency(feats, labels2) == pytest.approx(ref_semantic_consistency(feats, labels2))


def test_all_zero_features_are_defined_and_flagged():
    feats = np.zeros((20, 8), dtype=np.float32)
    labels = np.arange(20) % 4
    with pytest.warns(EvalWarning, match="no active dimensions"):
        out = M.compute_all(feats, labels)
    assert out == {
        "semantic_consistency": 0.0,
        "semantic_entropy_sum": 0.0,
        "semantic_entropy_mean": 0.0,
        "semantic_entropy_freq": 0.0,
        "cluster_entropy": 0.0,
        "active_dims": 0,
        "activation_ratio": 0.0,
        "sparsity": 1.0,
        "nonneg_ratio": 1.0,
        "effective_rank": 0.0,
        "orthogonality": 0.0,
        "note": "no active dimensions",
    }
    with pytest.warns(EvalWarning):
        assert M.semantic_consistency(feats, labels) == 0.0
    # every entry is 1e-6 <= 1e-5: dims are active, nothing fires for H_freq, but after row
    # normalisation (1e-6 / sqrt(8e-12) = 0.35) every entry fires for SC
    # (H_mean: the class means sum to 4e-6 < 1e-5, so it is skipped too, as in the authors' code)
    with pytest.warns(EvalWarning, match="no dimension qualifies for semantic_entropy_mean"):
        out = M.compute_all(np.full((20, 8), 1e-6, dtype=np.float32), labels)
    assert out["active_dims"] == 8 and out["sparsity"] == 1.0
    assert out["semantic_consistency"] == pytest.approx(25.0)
    assert out["semantic_entropy_sum"] == pytest.approx(math.log(4))
    assert out["semantic_entropy_mean"] == out["semantic_entropy_freq"] == 0.0
    assert out["note"] == (
        "no dimension qualifies for semantic_entropy_mean, semantic_entropy_freq; reported as 0.0"
    )


def test_huge_features_from_the_cli_give_the_scale_free_values(tmp_path, capsys):
    # every entry 1e38 (float32): row norms and class sums overflow float32; each dim fires for
    # both classes equally, so SC_k = 1/2 and p = (1/2, 1/2) for every entropy
    from bayesncl.app.cli import main

    np.savez(tmp_path / "huge.npz", features=np.full((4, 3), 1e38, np.float32), labels=np.array([0, 0, 1, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy "invalid value encountered in divide"
        assert main(["metrics", str(tmp_path / "huge.npz"), "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    result = json.loads(out.out)
    assert result["semantic_consistency"] == 50.0
    assert result["semantic_entropy_sum"] == result["semantic_entropy_freq"] == math.log(2)
    assert result["semantic_entropy_mean"] == math.log(2)
    assert result["effective_rank"] == pytest.approx(1.0) and result["orthogonality"] == pytest.approx(1.0)


def test_huge_rows_and_a_zero_row_by_hand():
    # rows (1e38, 0), (1e38, 1e38), (0, 0), labels 0, 1, 1. dim 0 fires for rows 0 (class 0) and 1
    # (class 1): SC_0 = 1/2, H = ln 2; dim 1 fires for row 1 only: SC_1 = 1, H = 0. The zero row
    # fires nowhere but counts in the class size of class 1 (H_mean: A/|c| = (1e38, 0.5e38) on dim 0).
    feats = np.array([[1e38, 0.0], [1e38, 1e38], [0.0, 0.0]], np.float32)
    labels = np.array([0, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = M.compute_all(feats, labels)
        per_dim = M.semantic_consistency_per_dim(feats, labels)
    np.testing.assert_array_equal(per_dim, [0.5, 1.0])
    assert out["semantic_consistency"] == 75.0
    assert out["semantic_entropy_sum"] == pytest.approx(math.log(2) / 2, rel=1e-12)
    h_mean_0 = -(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3)
    assert out["semantic_entropy_mean"] == pytest.approx(h_mean_0 / 2, rel=1e-6)
    assert out["active_dims"] == 2 and out["sparsity"] == 0.5
    # the same with the huge values replaced by 1: identical
    unit = M.compute_all((feats > 0).astype(np.float32), labels)
    assert {k: pytest.approx(v, rel=1e-6) for k, v in unit.items()} == out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_metric_is_invariant_to_the_scale_of_the_features(dtype):
    rng = np.random.default_rng(3)
    feats = rng.random((60, 12)).astype(dtype)
    feats[feats < 0.4] = 0  # every entry is 0 or >= 0.4: no entry crosses eps = 1e-5 when scaled
    feats[5] = 0  # a zero row
    labels = np.arange(60) % 4
    big = (feats * (dtype(1e38) / feats.max())).astype(dtype)
    assert np.isfinite(big).all() and big.max() == pytest.approx(1e38, rel=1e-6)
    cases = [(feats, "x1")] + [(big, "1e38")]
    if dtype is np.float64:
        cases.append((feats * 1e300, "1e300"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = [
            {
                **M.compute_all(f, labels, retrieval_dims=[4, 12]),
                "sepin": M.sepin_at_k(f, labels, 4),
                "knn": M.knn_accuracy(f[:40], labels[:40], f[40:], labels[40:], k=5),
                "probe": M.linear_probe(f[:40], labels[:40], f[40:], labels[40:])["acc1"],
                "fs_probe": M.feature_selection_probe(f[:40], labels[:40], f[40:], labels[40:], 4)["dims"],
            }
            for f, _ in cases
        ]
    ref = results[0]
    assert ref["active_dims"] == 12 and 0 < ref["semantic_consistency"] < 100
    for (_, name), got in zip(cases[1:], results[1:], strict=True):
        assert _flat(got).keys() == _flat(ref).keys(), name
        for key, value in _flat(ref).items():
            assert _flat(got)[key] == pytest.approx(value, rel=1e-6), (name, key)
    # scaling by a power of two is exact: bit-identical results
    assert M.compute_all(feats * dtype(2.0**120), labels, retrieval_dims=[4]) == M.compute_all(
        feats, labels, retrieval_dims=[4]
    )


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def test_normalize_rows_keeps_zero_rows_and_rescales_overflowing_ones():
    from bayesncl.metrics._numerics import normalize_rows, row_norms

    x = torch.tensor([[1.5e38, 2e38], [0.0, 0.0], [3.0, 4.0]])  # row 0: the squares overflow float32
    assert not torch.isfinite(torch.linalg.vector_norm(x[0]))
    torch.testing.assert_close(normalize_rows(x), torch.tensor([[0.6, 0.8], [0.0, 0.0], [0.6, 0.8]]))
    norms = row_norms(x).flatten()
    assert norms.dtype == torch.float64 and norms[1:].tolist() == [0.0, 5.0]
    assert norms[0].item() == pytest.approx(2.5e38, rel=1e-7)


# ---------------------------------------------------------------------------------------------
# activity, sparsity, spectrum, orthogonality
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_other_metrics_match_references(seed):
    feats, labels = sparse_features(seed, n=120, d=24)
    f32 = feats.float()
    a = feats.abs().numpy()
    assert M.active_dims(f32) == int((a.mean(0) > 0).sum()) == 22
    assert M.activation_ratio(f32) == pytest.approx(22 / 24)
    assert M.sparsity(feats) == pytest.approx(1 - (a > EPS).mean())
    assert M.orthogonality(f32) == pytest.approx(ref_orthogonality(feats), abs=1e-6)
    assert M.effective_rank(f32) == pytest.approx(ref_effective_rank(feats), rel=1e-6)
    assert math.exp(M.spectral_entropy(feats)) == pytest.approx(M.effective_rank(feats), rel=1e-12)
    out = M.compute_all(f32, labels)
    assert list(out) == list(M.METRIC_KEYS)
    assert out["orthogonality"] == pytest.approx(M.orthogonality(f32), abs=1e-12)
    assert out["effective_rank"] == pytest.approx(M.effective_rank(f32), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_wide_features_take_the_n_by_n_path(monkeypatch, dtype):
    # D > N: the spectrum comes from the N x N Gram FFᵀ and the orthogonality error is summed in
    # blocks; both equal the D x D Gram path (and the SVD / pairwise references).
    g = torch.Generator().manual_seed(11)
    f = torch.rand(12, 40, generator=g, dtype=torch.float64).to(dtype)
    f[:, 5] = 0  # a dead column: 39 active > 12 rows
    f[f < 0.3] = 0
    active = EM.active_mask(f)
    gram_dd = EM._gram_active(f, active)
    h_dd = EM._spectral_entropy_from_gram(gram_dd)
    h_nn = EM._spectral_entropy_from_gram(EM._gram_rows(f))
    s = torch.linalg.svdvals(f.double())
    p = s / s.sum()
    assert h_nn == pytest.approx(h_dd, abs=1e-9)
    assert h_nn == pytest.approx(float(-(p * p.log()).sum()), abs=1e-9)
    ortho_dd = EM._orthogonality_from_gram(gram_dd)
    assert EM._orthogonality_blocked(f, active) == pytest.approx(ortho_dd, abs=1e-12)
    assert ortho_dd == pytest.approx(ref_orthogonality(f), abs=1e-12)
    # blocks of 3 columns and 3 rows: diagonal blocks, off-diagonal parts and the row loop
    monkeypatch.setattr(EM, "_GRAM_CHUNK_BYTES", 8 * 39 * 3)
    assert EM._orthogonality_blocked(f, active) == pytest.approx(ortho_dd, abs=1e-12)
    monkeypatch.undo()

    # the public metrics never build the D x D Gram for wide features
    def no_dxd(*_args):
        raise AssertionError("D x D Gram built for D > N")

    monkeypatch.setattr(EM, "_gram_active", no_dxd)
    labels = torch.arange(12) % 3
    out = M.compute_all(f, labels)
    assert out["effective_rank"] == pytest.approx(math.exp(h_dd), rel=1e-9)
    assert out["orthogonality"] == pytest.approx(ortho_dd, abs=1e-12)
    assert M.effective_rank(f) == out["effective_rank"] and M.orthogonality(f) == out["orthogonality"]
    assert M.spectral_entropy(f) == pytest.approx(h_dd, abs=1e-9)


def test_authors_orthogonality_scale_and_erank_epsilon():
    # The authors' printed orthogonality is Σ|C − I| / (d(d−1)) averaged again over d² entries,
    # i.e. ours / d² (their diagonal is ~0); their erank adds 1e-6 inside the log.
    feats, _ = sparse_features(4, n=80, d=12)
    f = feats.float()
    f = f[:, f.abs().sum(0) > 0]
    d = f.shape[1]
    fn = F.normalize(f, dim=0)
    authors = ((fn.T @ fn - torch.eye(d)).abs() / (d * (d - 1))).mean().item()
    assert authors * d * d == pytest.approx(M.orthogonality(feats), rel=1e-4)
    s = torch.linalg.svdvals(f)
    s = s / s.sum()
    authors_erank_entropy = float(-(s * torch.log(s + 1e-6)).sum())
    assert authors_erank_entropy == pytest.approx(M.spectral_entropy(feats), abs=1e-3)


# ---------------------------------------------------------------------------------------------
# SEPIN
# ---------------------------------------------------------------------------------------------


def factorial_features(m: float = 2.0, sigma: float = 1.0, duplicate: bool = False):
    """Full factorial design: label y ∈ {0, 1}, within-class signs s, t ∈ {±1}, every
    combination 25 times, so all sample covariances between the columns are exactly 0.

    z0 = m(2y − 1) + σ s  (informative), z1 = t (pure noise); optionally z2 = z0 (duplicate)."""
    y, s, t = np.meshgrid([0, 1], [-1, 1], [-1, 1], indexing="ij")
    y, s, t = (np.repeat(v.ravel(), 25) for v in (y, s, t))
    cols = [m * (2 * y - 1) + sigma * s, t.astype(float)]
    if duplicate:
        cols.append(cols[0].copy())
    return np.stack(cols, axis=1), y


def test_sepin_known_answer():
    feats, y = factorial_features(m=2.0, sigma=1.0)
    info, sep = M.sepin_scores(feats, y)
    expected = 0.5 * math.log(1 + 2.0**2 / 1.0**2)  # Gaussian MI of z0 with y; z0 ⟂ z1
    np.testing.assert_allclose(info, [expected, 0.0], atol=1e-5)
    np.testing.assert_allclose(sep, [expected, 0.0], atol=1e-5)
    assert M.sepin_at_k(feats, y, 1) == pytest.approx(expected, abs=1e-5)
    assert M.sepin_at_k(feats, y, "all") == pytest.approx(expected / 2, abs=1e-5)
    assert M.sepin_at_k(feats, y) == M.sepin_at_k(feats, y, 2)


def test_sepin_duplicate_dims_are_not_separated():
    feats, y = factorial_features(duplicate=True)
    info, sep = M.sepin_scores(feats, y)
    assert info[0] == pytest.approx(info[2]) and info[0] > 0.5
    assert sep[0] < 1e-4 and sep[2] < 1e-4  # each copy adds nothing given the other
    assert M.sepin_at_k(feats, y, 2) < 1e-4


def test_sepin_matches_leave_one_out_log_determinants():
    g = np.random.default_rng(0)
    y = g.integers(0, 4, 400)
    feats = g.normal(size=(400, 6)) + np.eye(4)[y] @ g.normal(size=(4, 6))
    feats[:, 5] = 0.0  # a constant dim: INFO = SEP = 0
    _, sep = M.sepin_scores(feats, y)

    def gaussian_mi(x):
        xc = x - x.mean(0)
        st = xc.T @ xc / len(x)
        means = np.stack([xc[y == c].mean(0) for c in range(4)])
        sb = (means.T * (np.bincount(y) / len(x))) @ means
        return 0.5 * (np.linalg.slogdet(st)[1] - np.linalg.slogdet(st - sb)[1])

    live = feats[:, :5]
    full = gaussian_mi(live)
    loo = [full - gaussian_mi(np.delete(live, i, axis=1)) for i in range(5)]
    np.testing.assert_allclose(sep[:5], loo, atol=1e-5)
    assert sep[5] == 0.0


def test_sepin_bad_k():
    feats, y = factorial_features()
    for k in (0, 3, -1, 1.5, "top"):
        with pytest.raises(EvalError, match="SEPIN k"):
            M.sepin_at_k(feats, y, k)


# ---------------------------------------------------------------------------------------------
# retrieval
# ---------------------------------------------------------------------------------------------


def dense_retrieval(feats: torch.Tensor, labels: torch.Tensor, k: int) -> dict[str, float]:
    f = F.normalize(feats.double(), dim=1)
    order = torch.argsort(f.sum(0), descending=True, stable=True)[:k]
    x = F.normalize(f[:, order], dim=1).float()
    sims = x @ x.T
    sims.fill_diagonal_(-float("inf"))
    idx = torch.topk(sims, 10, dim=1).indices
    rel = (labels[idx] == labels[:, None]).double()
    out = {f"P@{t}": 100 * float(rel[:, :t].mean()) for t in (1, 3, 5, 10)}
    ap = []
    for row in rel:
        hits, total = 0, 0.0
        for j in range(10):
            if row[j]:
                hits += 1
                total += hits / (j + 1)
        ap.append(total / hits if hits else 0.0)
    out["mAP@10"] = 100 * float(np.mean(ap))
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64, None])
def test_chunked_retrieval_equals_dense(chunk):
    feats, labels = sparse_features(5, n=150, d=32, unit_rows=False)
    feats = feats.float()
    got = retrieval_metrics(feats, labels, dims=(8, 32), chunk_size=chunk)
    assert list(got) == ["8", "32"]
    for k in (8, 32):
        ref = dense_retrieval(feats, labels, k)
        for key, val in ref.items():
            assert got[str(k)][key] == pytest.approx(val, abs=1e-9), (k, key)


def test_retrieval_keeps_duplicates_as_neighbours():
    g = torch.Generator().manual_seed(0)
    base = torch.rand(30, 12, generator=g)
    feats = torch.cat([base, base])  # row i and row i + 30 are identical
    labels = torch.arange(30).repeat(2)  # each pair has its own label
    out = retrieval_metrics(feats, labels, dims=(12,), chunk_size=4)["12"]
    # P@1 = 100: every query's nearest is its duplicate; P@10 = 10: the query itself is never a neighbour
    assert out["P@1"] == 100.0 and out["P@10"] == pytest.approx(10.0)
    assert out["mAP@10"] == 100.0


def test_average_precision_by_hand():
    rel = torch.tensor([[1, 0, 1, 0, 0, 0, 0, 0, 0, 1], [0] * 10, [0, 1] + [0] * 8], dtype=torch.bool)
    ap = average_precision_at_k(rel, 10)
    np.testing.assert_allclose(ap.numpy(), [(1 + 2 / 3 + 3 / 10) / 3, 0.0, 0.5])


def test_dimension_ranking_by_expected_activation():
    feats = torch.tensor([[0.0, 3.0, 4.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # normalised rows: (0, .6, .8, 0), (0, 0, 1, 0), (1, 0, 0, 0) -> sums (1, .6, 1.8, 0)
    assert rank_dims(feats).tolist() == [2, 0, 1, 3]  # tie-free; dim 3 last
    assert select_top_dims(feats, 2).tolist() == [2, 0]


def test_retrieval_bad_dims():
    feats, labels = sparse_features(0, n=40, d=8)
    for k in (0, -3, 9):
        with pytest.raises(EvalError, match=r"retrieval dim K=.* out of range: need 0 < K <= D=8"):
            retrieval_metrics(feats, labels, dims=(k,))
    with pytest.raises(EvalError, match="out of range"):
        M.compute_all(feats, labels, retrieval_dims=[16])
    with pytest.raises(EvalError, match="at least 11 samples"):
        retrieval_metrics(feats[:10], labels[:10], dims=(4,))


def test_retrieval_dims_single_integer_or_sequence():
    feats, labels = sparse_features(0, n=40, d=8)
    one = retrieval_metrics(feats, labels, dims=4)
    assert one == retrieval_metrics(feats, labels, dims=[4]) and list(one) == ["4"]
    assert retrieval_metrics(feats, labels, dims=np.int64(4)) == one
    assert M.compute_all(feats, labels, retrieval_dims=4)["retrieval"] == one
    for dims in ("4", 4.0, True, None):
        msg = "retrieval dims must be a positive integer K or a sequence of them; got "
        with pytest.raises(EvalError, match=f"^{msg}{re.escape(repr(dims))}$"):
            retrieval_metrics(feats, labels, dims=dims)
    with pytest.raises(EvalError, match=r"^retrieval dim must be an integer; got 4\.0$"):
        M.compute_all(feats, labels, retrieval_dims=[4.0])


# ---------------------------------------------------------------------------------------------
# features file and bad inputs
# ---------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    feats, labels = sparse_features(0, n=50, d=16)
    path = tmp_path / "run" / "features_test.npz"
    meta = {"method": "bayesncl", "dataset": "cifar10", "split": "test", "class_names": ["a", "b"]}
    save_features(path, features=feats, labels=labels, indices=np.arange(50), mask=feats > 0, meta=meta)
    assert sorted(p.name for p in path.parent.iterdir()) == ["features_test.npz"]  # no temp file left
    fs = load_features(path)
    assert fs.features.dtype == np.float32 and fs.labels.dtype == np.int64
    np.testing.assert_allclose(fs.features, feats.float().numpy())
    assert fs.meta == meta and fs.h is None and fs.mask.shape == (50, 16)
    np.testing.assert_array_equal(fs.indices, np.arange(50))


def test_save_features_that_cannot_be_written_names_the_target(tmp_path):
    arrays = {"features": np.ones((2, 2), np.float32), "labels": np.array([0, 1])}
    (tmp_path / "notes.pt").write_text("x")
    target = tmp_path / "notes.pt" / "deeper" / "x.npz"
    with pytest.raises(EvalError) as e:
        save_features(target, **arrays)
    blocker = tmp_path / "notes.pt"
    assert str(e.value) == f"features file {target} cannot be written: {blocker} is a file, not a directory"
    long_name = tmp_path / ("y" * 300 + ".npz")  # the temporary file cannot be created either
    with pytest.raises(EvalError) as e:
        save_features(long_name, **arrays)
    assert str(e.value) == f"features file {long_name} cannot be written: file name too long (in {tmp_path})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.pt"]


def test_metrics_command_and_table(tmp_path):
    feats, labels = sparse_features(1, n=60, d=16)
    plain = tmp_path / "plain.npz"
    np.savez(plain, features=feats.float().numpy(), labels=labels.numpy())
    out = metrics_command(plain, retrieval_dims=[4, 16], as_json=True)
    assert set(out) == set(M.METRIC_KEYS) | {"retrieval", "ncl_map", "source"}
    assert out["source"] == {"path": str(plain), "num_samples": 60, "dim": 16}
    assert set(out["retrieval"]["4"]) == {"P@1", "P@3", "P@5", "P@10", "mAP@10"}
    json.dumps(out, allow_nan=False)
    table = M.format_metrics_table(out)
    assert "| Semantic consistency (SC) |" in table and "| 16 |" in table
    zero = tmp_path / "zero.npz"
    np.savez(zero, features=np.zeros((12, 4), np.float32), labels=np.zeros(12, np.int64))
    out = metrics_command(zero, None, False)
    assert out["note"] == "no active dimensions"
    assert "Note: no active dimensions" in M.format_metrics_table(out)


def _npz(**arrays):
    return lambda p: np.savez(p, **arrays)


Z32, I3 = np.zeros((3, 2)), np.zeros(3, int)
NAN_ROWS = np.array([[1.0, np.nan], [np.inf, 0], [0, 0]])
OBJECTS = np.array([{}, {}, {}], dtype=object)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("hello"), r"is not a features file: .*\.npz"),
        (lambda p: np.save(p, Z32), r"single \.npy array of shape \(3, 2\)"),
        (_npz(feats=Z32, y=I3), r"missing 'features' and 'labels' \(found 'feats', 'y'\)"),
        (_npz(features=Z32), r"missing 'labels' \(found 'features'\)"),
        (_npz(features=Z32, labels=np.zeros(4, int)), "labels has 4 entries but features has 3 rows"),
        (_npz(features=np.zeros(3), labels=I3), r"must be a 2-D array \(N, D\); got a 1-D array"),
        (_npz(features=NAN_ROWS, labels=I3), "NaN or inf in 2 of 3 rows"),
        (_npz(features=Z32, labels=OBJECTS), "holds Python objects"),
    ],
)
def test_bad_files_raise_one_line(tmp_path, make, message):
    path = tmp_path / "bad.npz"
    make(path)
    if not path.exists():  # np.save appends .npy
        path = tmp_path / "bad.npz.npy"
    with pytest.raises(EvalError, match=message) as info:
        metrics_command(path, None, False)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_arrays_raise():
    feats = np.ones((5, 3))
    with pytest.raises(EvalError, match="labels has 4 entries but features has 5 rows"):
        M.semantic_consistency(feats, np.zeros(4, int))
    with pytest.raises(EvalError, match="1-D array of shape"):
        M.sparsity(np.ones(5))
    feats[2, 1] = np.nan
    with pytest.raises(EvalError, match=r"NaN or inf in 1 of 5 rows \(first: row 2\)"):
        M.active_dims(feats)
    with pytest.raises(EvalError, match="needs labels"):
        M.semantic_entropy_sum(np.ones((5, 3)), None)
    with pytest.raises(EvalError, match="non-integer"):
        M.semantic_consistency(np.ones((3, 3)), np.array([0.5, 1, 2]))
    with pytest.raises(EvalError, match="not found"):
        load_features("/nonexistent/features.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.semantic_consistency(np.ones((3, 3)), np.array([0.0, 1.0, 1.0])) == pytest.approx(200 / 3)
