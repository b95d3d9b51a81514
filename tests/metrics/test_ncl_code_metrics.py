"""The NCL code's two logged numbers without a counterpart before (issue 47, item 6d): the share of
non-negative entries (``non_neg_ratio``) and main_eval's cluster entropy, on hand-computed cases and
against a plain per-dimension loop written from the definition (docs/metrics.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import bayesncl.metrics as M
from bayesncl.metrics.registry import NCL_CODE_METRICS, column

# 4 samples x 3 dims, classes 0, 0, 1, 1: dim 0 fires on class 0 only, dim 1 on one sample of each
# class, dim 2 is never positive (NCL's cluster entropy leaves it out; two zeros, two negatives)
F = np.array([[1.0, 1.0, -1.0], [1.0, 0.0, -1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
Y = np.array([0, 0, 1, 1])


def test_nonneg_ratio_by_hand() -> None:
    assert M.nonneg_ratio(F) == pytest.approx(10 / 12)  # 12 entries, two of them < 0 (zeros count)
    assert M.nonneg_ratio(np.abs(F)) == 1.0 and M.nonneg_ratio(-np.ones((2, 3))) == 0.0
    assert M.compute_all(F, Y)["nonneg_ratio"] == pytest.approx(10 / 12)


def test_cluster_entropy_by_hand() -> None:
    # dim 0: S = {0, 1}, both class 0: p = (1, 0), H = -ln(1 + 1e-5); dim 1: S = {0, 2}: p = (1/2, 1/2),
    # H = -ln(1/2 + 1e-5) (their eps inside the log: H of a pure dim is -1e-5, not 0)
    expected = (-math.log(1 + 1e-5) - math.log(0.5 + 1e-5)) / 2
    assert M.cluster_entropy(F, Y) == pytest.approx(expected, abs=1e-12)
    assert M.compute_all(F, Y)["cluster_entropy"] == pytest.approx(expected, abs=1e-12)
    # SC keeps dim 2 (it fires, negatively): 100 * mean(1, 1/2, 1); the cluster entropy does not
    assert M.semantic_consistency(F, Y) == pytest.approx(100 * 2.5 / 3)


def _ncl_loop(f: torch.Tensor, y: torch.Tensor, eps: float = 1e-5) -> float:
    """PKU-ML/non_neg main_eval.py's cluster_acc loop, as its text defines it, one dimension at a time."""
    f = f[:, torch.relu(f).sum(0) > 0]
    f = f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)
    ents = []
    for i in range(f.shape[1]):
        sel = y[f[:, i].abs() > eps]
        if len(sel) == 0:
            continue
        dist = sel.bincount().double()
        dist = dist / dist.sum()
        ents.append(float(-(dist * (dist + eps).log()).sum()))
    return sum(ents) / len(ents)


@pytest.mark.parametrize("signed", [False, True])
def test_cluster_entropy_matches_a_plain_loop(signed: bool) -> None:
    rng = np.random.default_rng(0)
    f = rng.standard_normal((300, 24)).astype(np.float32)
    f = f if signed else np.maximum(f, 0.0)
    f[:, 3] = -np.abs(f[:, 3])  # a never-positive dim
    f[:, 5] = 0.0  # a dead dim
    y = rng.integers(0, 7, 300)
    ref = _ncl_loop(torch.from_numpy(f).double(), torch.from_numpy(y))
    assert M.cluster_entropy(f, y) == pytest.approx(ref, abs=1e-9)


def test_no_qualifying_dim_is_0_with_a_note() -> None:
    neg = -np.ones((6, 4), dtype=np.float32)
    with pytest.warns(M.EvalWarning, match="no dimension qualifies for cluster_entropy"):
        assert M.cluster_entropy(neg, np.arange(6) % 2) == 0.0
    with pytest.warns(M.EvalWarning):
        out = M.compute_all(neg, np.arange(6) % 2)
    assert out["cluster_entropy"] == 0.0 and out["nonneg_ratio"] == 0.0
    assert out["note"] == "no dimension qualifies for cluster_entropy; reported as 0.0"


def test_registry_rows() -> None:
    assert set(NCL_CODE_METRICS) <= set(M.METRIC_KEYS)
    assert column("nonneg_ratio") == ("non-neg", "nonneg_ratio", "{:.3f}")
    assert column("cluster_entropy") == ("clu. ent", "cluster_entropy", "{:.3f}")
    table = M.format_metrics_table(M.compute_all(F, Y))
    assert "| Non-negative entries (NCL's non_neg_ratio) | 0.8333 | fraction |" in table
    assert "| Cluster entropy (NCL's main_eval) | 0.3466 | nats |" in table
