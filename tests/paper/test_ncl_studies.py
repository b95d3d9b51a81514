"""``bayesncl reproduce`` for the NCL paper's comparisons (ncl-sparsity, ncl-spectral, ncl-supervised,
ncl-dead) on tiny synthetic runs sharing one store: each table's cells come from its measures, the
values are what the runs hold, and a run two studies share is trained once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bayesncl.app.cli import main
from bayesncl.paper import ncl_studies, studies, variants

from ..conftest import TINY as _TINY

TINY = [*_TINY, "data.image_size=8", "data.train_subset=64", "train.epochs=2"]
IDS = ("ncl-sparsity", "ncl-spectral", "ncl-supervised", "ncl-dead")


def test_each_id_builds_its_variants_and_columns() -> None:
    for study_id in IDS:
        s = studies.build(study_id, "fashion-mnist", [])
        assert s.id == study_id and s.rows and s.columns
        assert {v.method for v in s.variants} <= set(__import__("bayesncl").core.methods.METHODS)
    sparsity = studies.build("ncl-sparsity", "fashion-mnist", [])
    assert [v.name for v in sparsity.variants][1:-1] == [f"CL+L1 β={b:g}" for b in ncl_studies.L1_BETAS]
    assert ncl_studies.L1_BETAS[-1] / ncl_studies.L1_BETAS[0] >= 1e3  # ~3 decades
    spectral = studies.build("ncl-spectral", "cifar10", [])
    assert spectral.paper == {"SCL": {"linear_probe_acc1": 88.0}, "NCL-SCL": {"linear_probe_acc1": 88.6},
                              "SCL+L1": {"linear_probe_acc1": 87.2}}  # fmt: skip


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    import bayesncl.app.evaluate as evaluate

    root = tmp_path_factory.mktemp("ncl-studies")
    out: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluate, "write_figures", lambda *a, **k: None)
        mp.setattr(ncl_studies, "L1_BETAS", (0.1,))
        for study_id in IDS:
            args = ["reproduce", study_id, "--dataset", "fashion-mnist", "--seeds", "1", "--store",
                    str(root / "store"), "--run-dir", str(root / study_id), *TINY]  # fmt: skip
            assert main(args) == 0, study_id
            stem = studies.build(study_id, "fashion-mnist", TINY).stem
            out[study_id] = json.loads((root / study_id / f"{stem}.json").read_text())
        yield root, out


def _mean(table: dict[str, Any], row: str, key: str) -> Any:
    return table["rows"][row][key]["mean"]


@pytest.mark.slow
def test_sparsity_table_reads_the_runs(tables: tuple[Path, dict[str, Any]]) -> None:
    root, out = tables
    t = out["ncl-sparsity"]
    assert list(t["rows"]) == ["CL", "CL+L1 β=0.1", "NCL"]
    assert _mean(t, "CL", "sparsity_paper") == pytest.approx(0.0, abs=0.1)  # unconstrained: no exact zeros
    assert _mean(t, "NCL", "sparsity_paper") > 10.0  # ReLU'd features: many exact zeros
    for row in t["rows"]:
        sub = root / "store" / t["runs"][f"{row} seed 0"]
        ours = variants.finished_metrics(sub)["sparsity"]
        assert _mean(t, row, "sparsity_eps") == pytest.approx(100 * ours)
        assert _mean(t, row, "semantic_consistency") is not None


@pytest.mark.slow
def test_spectral_and_supervised_tables(tables: tuple[Path, dict[str, Any]]) -> None:
    _, out = tables
    assert list(out["ncl-spectral"]["rows"]) == ["SCL", "NCL-SCL", "SCL+L1"]
    sup = out["ncl-supervised"]
    for row in ("CE", "NCE"):
        acc = _mean(sup, row, "head_acc1")
        assert 0.0 <= acc <= 100.0 and _mean(sup, row, "linear_probe_acc1") is not None
    assert _mean(sup, "SupCon", "head_acc1") is None  # no classifier of its own: an empty cell


@pytest.mark.slow
def test_dead_dims_per_epoch_and_shared_runs(tables: tuple[Path, dict[str, Any]]) -> None:
    root, out = tables
    t = out["ncl-dead"]
    d = 16  # TINY's model.proj_dim
    for name in ("ReLU", "rep_relu"):
        sub = root / "store" / t["runs"][f"{name} seed 0"]
        active = variants.finished_metrics(sub)["active_dims"]
        assert _mean(t, name, "dead_dims") == pytest.approx(d - active)
        for epoch in (1, 2):
            assert 0 <= _mean(t, f"{name} epoch {epoch}", "dead_dims") <= d
    # ncl-dead's rep_relu run is ncl-sparsity's NCL run: trained once, reused
    assert t["runs"]["rep_relu seed 0"] == out["ncl-sparsity"]["runs"]["NCL seed 0"]
    assert t["runs"]["rep_relu seed 0"] in t["reused"]
