"""SEPIN about the input x (from augmented views) and about the label y: known answers
(docs/metrics.md, "SEPIN@k")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bayesncl import metrics as M
from bayesncl.metrics.inputs import EvalError


def gaussian_views(n: int = 40000, v: int = 2, seed: int = 0) -> tuple[np.ndarray, list[float]]:
    """(n, v, 4) views: dims 0, 1 = s_k(x) + e (signal a_k per image, noise 1 per view), dim 2 = pure
    per-view noise, dim 3 = an exact copy of dim 0. Returns the views and the analytic I(x; z_k)
    = −½ log(1 − r²) of dims 0 and 1, r² = a²/(a² + 1) the squared correlation of z_k with s_k."""
    g = np.random.default_rng(seed)
    amps = [1.5, 0.5]
    s = g.normal(size=(n, 1, 2)) * np.array(amps)
    z01 = s + g.normal(size=(n, v, 2))
    noise = g.normal(size=(n, v, 1))
    views = np.concatenate([z01, noise, z01[:, :, :1]], axis=2)
    r2 = [a * a / (a * a + 1) for a in amps]
    return views, [-0.5 * math.log(1 - r) for r in r2]


def test_sepin_input_gaussian_known_answer():
    views, (mi0, mi1) = gaussian_views()
    info, sep = M.sepin_input_scores(views[:, :, :3])  # without the copy: three independent dims
    assert mi0 == pytest.approx(0.5 * math.log(1 + 1.5**2))  # the two forms of the same value
    np.testing.assert_allclose(info, [mi0, mi1, 0.0], atol=0.02)
    np.testing.assert_allclose(sep, [mi0, mi1, 0.0], atol=0.02)  # independent dims: SEP = INFO
    assert M.sepin_input_at_k(views[:, :, :3], 1) == pytest.approx(mi0, abs=0.02)
    assert M.sepin_input_at_k(views[:, :, :3], "all") == pytest.approx((mi0 + mi1) / 3, abs=0.02)


def test_sepin_input_copy_and_noise_dims():
    views, (mi0, _) = gaussian_views(n=20000, v=3, seed=1)
    info, sep = M.sepin_input_scores(views)
    assert info[0] == pytest.approx(info[3]) and info[0] == pytest.approx(mi0, abs=0.03)
    assert sep[0] < 1e-3 and sep[3] < 1e-3  # each copy adds nothing about x given the other
    assert info[2] < 0.01 and sep[2] < 0.01  # noise of the augmentation only: nothing about x


def test_sepin_input_closed_form_matches_leave_one_out_log_determinants():
    g = np.random.default_rng(2)
    n, v, d = 300, 4, 5
    views = g.normal(size=(n, 1, d)) @ g.normal(size=(d, d)) + 0.7 * g.normal(size=(n, v, d))
    _, sep = M.sepin_input_scores(views)
    flat = views.reshape(n * v, d)
    st = np.cov(flat.T, bias=True)
    within = views - views.mean(axis=1, keepdims=True)
    sw = np.einsum("nvi,nvj->ij", within, within) / (n * (v - 1))

    def mi(cols: list[int]) -> float:
        idx = np.ix_(cols, cols)
        return 0.5 * (np.linalg.slogdet(st[idx])[1] - np.linalg.slogdet(sw[idx])[1])

    full = mi(list(range(d)))
    naive = [full - mi([j for j in range(d) if j != i]) for i in range(d)]
    np.testing.assert_allclose(sep, naive, atol=1e-4)


def test_label_and_input_names():
    assert M.sepin_scores is M.sepin_label_scores and M.sepin_at_k is M.sepin_label_at_k
    with pytest.raises(EvalError, match=r"shape \(N, V, D\)"):
        M.sepin_input_scores(np.zeros((10, 4)))
    with pytest.raises(EvalError, match="V ≥ 2"):
        M.sepin_input_scores(np.zeros((10, 1, 4)))
    with pytest.raises(EvalError, match="in 1..4"):
        M.sepin_input_at_k(np.random.default_rng(0).normal(size=(10, 2, 4)), 5)
