"""The NCL authors' selected-dims probe (metrics.authors_selection): ranking and probe on hand-made data."""

from __future__ import annotations

import numpy as np
import pytest

from bayesncl.metrics.authors_selection import (
    authors_selection_probe,
    authors_selection_probes,
    expected_activation_rank,
)
from bayesncl.metrics.inputs import EvalError


def test_expected_activation_rank_by_hand() -> None:
    p = np.array([[3.0, 4.0, -1.0], [0.0, -2.0, 2.0]])
    # normalize(relu(p)) rows: [0.6, 0.8, 0], [0, 0, 1] -> column sums 0.6, 0.8, 1.0
    assert expected_activation_rank(p).tolist() == [2, 1, 0]
    assert expected_activation_rank(np.zeros((2, 3))).tolist() == [0, 1, 2]  # ties: lower index first


def separable(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two classes; dims 5, 6 carry the label with large positive activations (the top two by expected
    activation); the other six are small noise (dims 0, 1: what the first epoch reads)."""
    g = np.random.default_rng(seed)
    y = g.integers(0, 2, n)
    p = 0.05 * g.normal(size=(n, 8))
    p[:, 5] += np.where(y == 1, 3.0, 1.0)
    p[:, 6] += np.where(y == 0, 3.0, 1.0)
    return p.astype(np.float32), y


def test_top_k_dims_carry_the_label_random_ones_do_not() -> None:
    ptr, ytr = separable(1024, 0)
    pte, yte = separable(400, 1)
    top = authors_selection_probe(ptr, ytr, pte, yte, 2, seed=0, epochs=5)
    assert top["dims"] == [6, 5] or top["dims"] == [5, 6]
    assert top["acc1"] == 100.0 and top["acc5"] == 100.0  # two classes: Acc@C
    noise = authors_selection_probe(ptr, ytr, pte, yte, 2, dims=[0, 1], seed=0, epochs=5)
    assert noise["dims"] == [0, 1] and 35 < noise["acc1"] < 65  # chance
    both = authors_selection_probes(ptr, ytr, pte, yte, [2, 8], seed=0, epochs=5)
    assert both[2]["top_acc1"] == 100.0 and both[8]["top_acc1"] == both[8]["random_acc1"] == 100.0


def test_authors_selection_probe_refuses_bad_k() -> None:
    ptr, ytr = separable(256, 0)
    with pytest.raises(EvalError, match="1 <= k <= D=8"):
        authors_selection_probe(ptr, ytr, ptr, ytr, 9)
    with pytest.raises(EvalError, match="2 dims given for k=3"):
        authors_selection_probe(ptr, ytr, ptr, ytr, 3, dims=[0, 1])
    # fewer train samples than a batch: one step an epoch on all of them (the top dims still found)
    small = authors_selection_probe(ptr[:100], ytr[:100], ptr, ytr, 2, epochs=30)
    assert sorted(small["dims"]) == [5, 6] and small["acc1"] == 100.0


def test_evaluate_runs_the_authors_form_when_asked(tmp_path) -> None:
    import json

    from bayesncl.app.cli import main

    from ..conftest import tiny_checkpoint

    ckpt = tiny_checkpoint(tmp_path / "m.pt", ["method.name=ncl"])
    assert main(["evaluate", str(ckpt), "--probe", "fast", "--no-knn", "eval.selection_probe=authors"]) == 0
    fs = json.loads((tmp_path / "evaluation.json").read_text())["feature_selection_probe"]
    assert fs["form"] == "authors" and fs["k"] == 16 and 0 <= fs["acc1"] <= fs["acc5"] <= 100
    assert main(["evaluate", str(ckpt), "--probe", "fast", "--no-knn"]) == 0
    assert json.loads((tmp_path / "evaluation.json").read_text())["feature_selection_probe"]["form"] == "fast"
