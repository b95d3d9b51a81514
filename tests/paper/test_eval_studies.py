"""Issue 26's studies on tiny runs: ``reproduce ncl-mig``, ``ncl-ood``, ``appj``, ncl-fs's transfer
measure (and the Appendix J relation by hand). Seeded studies are never run for real here: a few
steps, 8 px images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bayesncl.app.cli import main
from bayesncl.data import clear_cache
from bayesncl.paper import ncl_studies, studies

from ..conftest import TINY, fmnist_folder

# the tiny settings without the data: each study sets data.name itself
BASE = [o for o in TINY if not o.startswith(("data.name=", "data.train_subset=", "data.test_subset="))]
BASE += ["data.image_size=8", "data.train_subset=64", "data.test_subset=60"]


def _run(root: Path, study: str, *extra: str) -> dict[str, Any]:
    args = ["reproduce", study, "--dataset", "fashion-mnist", "--store", str(root / "store"),
            "--run-dir", str(root / study), *extra]  # fmt: skip
    assert main(args) == 0
    stem = studies.build(study, "fashion-mnist", list(extra)).stem
    return json.loads((root / study / f"{stem}.json").read_text())


@pytest.fixture()
def quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    import bayesncl.app.evaluate as evaluate

    monkeypatch.setattr(evaluate, "write_figures", lambda *a, **k: None)  # pretrain's own figures


@pytest.mark.slow
def test_ncl_mig_tiny(tmp_path: Path, quiet: None):
    out = _run(tmp_path, "ncl-mig", *BASE)
    rows = out["rows"]
    assert set(rows) == {"CL", "NCL", "BayesNCL"} and out["data"] == ["dsprites"]
    for r in rows.values():
        assert 0 <= r["mig"]["mean"] <= 1 and r["mig"]["paper"] in (None, 0.065)
        assert all(0 <= r[f"mig.{f}"]["mean"] <= 1 for f in ("shape", "scale", "orientation", "posX", "posY"))
    assert rows["NCL"]["mig"]["paper"] == 0.065


@pytest.mark.slow
def test_ncl_ood_tiny(tmp_path: Path, quiet: None, monkeypatch: pytest.MonkeyPatch):
    from bayesncl.data import corruptions

    monkeypatch.setattr(ncl_studies, "OOD_CORRUPTIONS", ("contrast", "gaussian_noise"))
    monkeypatch.setattr(ncl_studies, "OOD_SEVERITIES", (1, 3))
    monkeypatch.setattr(corruptions, "DEFAULT_CACHE", tmp_path / "cache")
    out = _run(tmp_path, "ncl-ood", *BASE, "data.name=synthetic")
    rows = out["rows"]
    assert "NCL contrast" in rows and "BayesNCL gaussian_noise" in rows
    for v in ("CL", "NCL", "BayesNCL"):
        per = [rows[f"{v} {c}"] for c in ("contrast", "gaussian_noise")]
        # the severity column is the mean over the corruptions; "mean" the mean over every cell
        assert rows[v]["sev3"]["mean"] == pytest.approx(np.mean([p["sev3"]["mean"] for p in per]))
        cells = [p[f"sev{s}"]["mean"] for p in per for s in (1, 3)]
        assert rows[v]["corruption_mean"]["mean"] == pytest.approx(np.mean(cells))
        assert 0 <= rows[v]["clean_acc1"]["mean"] <= 100
    assert (tmp_path / "ncl-ood" / "ncl-ood.png").read_bytes().startswith(b"\x89PNG")
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 4  # 2 corruptions x 2 severities, made once


@pytest.mark.slow
def test_appj_tiny(tmp_path: Path, quiet: None):
    clear_cache()
    fm = fmnist_folder(tmp_path / "fm")
    try:
        out = _run(tmp_path, "appj", *BASE, f"data.root={fm}")
    finally:
        clear_cache()
    rows = out["rows"]
    assert out["data"] == ["fashion-mnist-bg"] and "NCL H quartile 4" in rows
    for v in ("CL", "NCL", "BayesNCL"):
        rho = rows[v]["spearman"]["mean"]
        assert rho is None or -1 <= rho <= 1
        shares = [rows[f"{v} H quartile {i}"]["bg_share"]["mean"] for i in range(1, 5)]
        assert all(s is None or 0 <= s <= 1 for s in shares)
    assert (tmp_path / "appj" / "appj.png").read_bytes().startswith(b"\x89PNG")
    index = (tmp_path / "appj" / "report" / "index.html").read_text()  # the report shows the figure
    assert '<img class="fig" src="../appj.png" alt="figure of the table">' in index


def test_entropy_background_by_hand():
    from bayesncl.metrics.entropy_background import entropy_background

    i = np.arange(200)
    y, g = i % 4, (i // 4) % 5  # class and place independent, balanced
    # dim 0: class 0 only (H = 0, follows the class: b = 0); dim 1: place 0 only (mass spread evenly over
    # the 4 classes: H = log 4, b = 1); dim 2: class 2 only (H = 0, b = 0)
    f = np.stack([(y == 0), (g == 0), (y == 2)], 1).astype(float)
    r = entropy_background(f, y, g, bins=2)
    assert r["dims"] == 3 and r["spearman"] == pytest.approx(1.0)
    assert r["q1.entropy"] == pytest.approx(0.0) and r["q2.entropy"] == pytest.approx(np.log(4))
    assert r["q1.bg_share"] == pytest.approx(0.0) and r["q2.bg_share"] == pytest.approx(1.0)
    assert r["q1.bg_dims"] == 0.0 and r["q2.bg_dims"] == 1.0


def test_ncl_fs_transfer_measure_on_dsprites(tmp_path: Path) -> None:
    """ncl-fs's transfer measure through a 1-channel encoder (a fashion-mnist model) on generated
    dSprites, labelled by shape: every K gets both cells, and at K = D they are one probe (a transfer
    set that cannot be read: tests/paper/test_reproduce.py, before any training)."""
    from bayesncl.config import build_config

    from ..conftest import tiny_checkpoint

    over = ["data.name=fashion-mnist", "data.image_size=16", f"data.root={fmnist_folder(tmp_path / 'fm')}"]
    ckpt = tiny_checkpoint(tmp_path / "m.pt", over, channels=1, num_classes=10)
    cfg = build_config(overrides=[*TINY, *over])
    out = ncl_studies.MEASURES["fs_transfer"](ckpt, cfg, (("dsprites", 96, 60), (2, 16)))
    assert set(out) == {f"K{k}.transfer_{m}_acc1" for k in (2, 16) for m in ("top", "random")}
    assert all(0.0 <= v <= 100.0 for v in out.values())
    assert out["K16.transfer_top_acc1"] == out["K16.transfer_random_acc1"]
