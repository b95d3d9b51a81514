"""Memory of ``bayesncl metrics`` with retrieval (issue 46): NCL's own map in row blocks gives the
whole-matrix result, and the extra peak memory of :func:`compute_all` with retrieval stays a small
multiple of the input's size (docs/scaling.md, "Metrics memory")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesncl.metrics import ncl_retrieval
from bayesncl.metrics._numerics import normalize_rows
from bayesncl.metrics.ncl_retrieval import ncl_map, normalized_top_columns

SRC = Path(__file__).resolve().parents[2] / "src"


def _features(n: int, d: int, classes: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    f = (torch.randn(n, d, generator=g) + torch.randn(classes, d, generator=g)[y] - 1.0).clamp_min(0)
    return f, y


def _whole_matrix_top_columns(f: torch.Tensor, k: int) -> torch.Tensor:
    """The former ncl_map's selection: the whole matrix normalised in float64, its column sums sorted."""
    full = normalize_rows(f.to(torch.float64))
    return full[:, torch.sort(full.sum(0), descending=True, stable=True)[1][:k]]


@pytest.mark.parametrize("block_bytes", [1 << 12, 1 << 16, None])
def test_blocked_top_columns_equal_the_whole_matrix(block_bytes: int | None) -> None:
    f, _ = _features(700, 48, 5)
    f[3] *= 1e30  # a row whose float32 norm overflows: normalised by its max first, in every block
    f[:, 7] = 0.0  # a dead column ties at 0 with others: ranked by index in both
    for k in (1, 10, 48):
        got = normalized_top_columns(f, k, block_bytes)
        assert torch.equal(got, _whole_matrix_top_columns(f, k))


def test_blocked_ncl_map_equals_the_whole_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    f, y = _features(600, 40, 6, seed=1)
    whole = {k: ncl_map(f, y, k) for k in (4, 40)}  # 600 x 40 x 8 bytes: one block
    monkeypatch.setattr(ncl_retrieval, "_NORM_BLOCK_BYTES", 1 << 12)  # 12 rows a block, 50 blocks
    assert {k: ncl_map(f, y, k) for k in (4, 40)} == whole
    assert 0 < whole[4] < whole[40] <= 100


CHILD = r"""
import json, resource, sys
import torch
from bayesncl.metrics import ncl_retrieval, retrieval
from bayesncl.metrics.registry import compute_all
n, d = int(sys.argv[1]), int(sys.argv[2])
# the 50,000 x 2,048 case's layout at this size: a float64 row block ~1/12 of the float64 matrix,
# a similarity block of ~1/75 of N x N
ncl_retrieval._NORM_BLOCK_BYTES = n * d * 8 // 12
retrieval._BLOCK_ELEMENTS = n * n // 75
g = torch.Generator().manual_seed(0)
y = torch.randint(0, 10, (n,), generator=g)
f = (torch.randn(n, d, generator=g) + torch.randn(10, d, generator=g)[y] - 1.0).clamp_min(0)
compute_all(f[:50], y[:50], retrieval_dims=[8])  # warm up: the code paths' own allocations
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = compute_all(f, y, retrieval_dims=[64])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"extra_kib": peak - base, "input_kib": f.numel() * 4 / 1024, "map": out["ncl_map"]["64"]}))
"""


def test_metrics_with_retrieval_extra_peak_memory_is_bounded() -> None:
    """4,000 x 1,024 float32 (16 MiB): compute_all with retrieval (SC, entropies, spectrum, our
    retrieval, NCL's map) adds at most 2x the input to the child's peak RSS (measured here: 1.0x;
    the former NCL map, two float64 copies of F: 3.5x)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", CHILD, "4000", "1024"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["extra_kib"] <= 2.0 * got["input_kib"], got
    assert np.isfinite(got["map"])
