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


def _packed_run(sub: Path, cfg: Any, active: int, heldout: dict[int, int]) -> None:
    """A finished run as ``long_queue.sh pack`` keeps it (config.yaml, log.csv, metrics.json; no
    checkpoint): ``active`` dims on the test split, ``heldout``: epoch -> the held-out monitor's active
    dims (the epochs it logged)."""
    import csv

    from bayesncl.config import dump_yaml
    from bayesncl.runs.logs import LOG_FIELDS

    sub.mkdir(parents=True)
    (sub / "config.yaml").write_text(dump_yaml(cfg))
    (sub / "metrics.json").write_text(json.dumps({"active_dims": active, "semantic_consistency": 50.0}))
    with open(sub / "log.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LOG_FIELDS)
        w.writeheader()
        for epoch in range(1, cfg.train.epochs + 1):
            w.writerow({"epoch": epoch, "step": 2 * epoch, "epoch_time_s": 1.0,
                        "heldout_active_dims": heldout.get(epoch, "")})  # fmt: skip


def test_dead_dims_refuse_runs_whose_held_out_monitor_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ncl-dead's per-epoch rows are the held-out monitor of each run's log.csv. A stored run is reused
    whatever its train.monitor_every (out of its name) and, in the checks, its train.monitor_samples
    (REUSE_IGNORES): one logged every 2 epochs gave the rows of epoch 1 no value, silently, and one of
    another monitor_samples other values. Each is refused before anything is written, naming what
    differs and the key=value that takes the run's; with them the table reads the runs' logs."""
    import dataclasses

    import bayesncl.app.train as train
    from bayesncl.paper.reproduce import study_configs

    from ..conftest import ERROR, expect, resumable_checkpoint

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "dead"
    configs = study_configs(studies.build("ncl-dead", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)
    subs = {}
    for (name, _), cfg in configs.items():
        every2 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, monitor_every=2))
        assert variants.variant_hash(every2) == variants.variant_hash(cfg)  # the same run in the store
        subs[name] = store / variants.variant_hash(cfg)
        _packed_run(subs[name], every2, active=10 if name == "ReLU" else 13, heldout={2: 12})
    args = ["reproduce", "ncl-dead", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir",
            str(table), *TINY]  # fmt: skip
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    expect("P21", err, tmp_path)
    assert err == (
        f"{ERROR}ReLU seed 0: the stored run {subs['ReLU']} logged its held-out monitor with other settings "
        "(train.monitor_every: 2 -> 1; run's -> now), and ncl-dead reads the per-epoch dead dims (log.csv's "
        "heldout_active_dims) from it: give train.monitor_every=2 (the run's), or move "
        f"{subs['ReLU']} out of the store (its run is then trained again), or use another --store\n"
    )
    assert not table.exists() and sorted(p.name for p in subs["ReLU"].iterdir()) == [
        "config.yaml", "log.csv", "metrics.json"
    ]  # fmt: skip
    # with the runs' monitor: their logs make the rows (D = 16), and the packed runs get no report
    assert main([*args, "train.monitor_every=2"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads((table / "ncl-dead.json").read_text())["rows"]
    assert list(rows) == ["ReLU", "rep_relu", "ReLU epoch 2", "rep_relu epoch 2"]
    assert [rows[r]["dead_dims"]["mean"] for r in rows] == [6.0, 3.0, 4.0, 4.0]
    assert "warning" not in out + err and not (table / "report").exists()
    assert (
        "HTML report: not written: the table was made from packed runs (relu-s0, rep-relu-s0: stored "
        "results without a checkpoint or features); a report needs each run's last.pt or "
        "features_test.npz: `bayesncl report RUN_DIR` makes it where the runs were trained (the store "
        "that holds their checkpoints)\n"
    ) in out
    # another held-out batch: other values in the same rows
    cfg = configs["rep_relu", 0]
    (subs["rep_relu"] / "config.yaml").write_text((subs["rep_relu"] / "config.yaml").read_text().replace(
        "monitor_samples: 2000", "monitor_samples: 500"))  # fmt: skip
    assert main([*args, "train.monitor_every=2"]) == 2
    assert "rep_relu seed 0: the stored run " in (err := capsys.readouterr().err) and (
        "(train.monitor_samples: 500 -> 2000; run's -> now)" in err
        and "give train.monitor_samples=500 (the run's), or move" in err
    )
    # an unfinished run to continue: continuing it with another monitor would mix the two in its log.csv
    for f in ("metrics.json", "config.yaml"):
        (subs["rep_relu"] / f).unlink()
    resumable_checkpoint(subs["rep_relu"] / "last.pt", cfg)  # logged every epoch (cfg's monitor_every=1)
    assert main([*args, "train.monitor_every=2"]) == 2
    assert capsys.readouterr().err == (
        f"{ERROR}rep_relu seed 0: the store's folder {subs['rep_relu']} holds an unfinished run (last.pt) "
        "that logged its held-out monitor with other settings (train.monitor_every: 1 -> 2; run's -> now), "
        "and ncl-dead reads the per-epoch dead dims (log.csv's heldout_active_dims) from it: give "
        f"train.monitor_every=1 (the run's), or move {subs['rep_relu']} out of the store (its run is then "
        "trained from the start), or use another --store\n"
    )
    # and no monitor at all: no per-epoch row could have a value
    assert main([*args, "train.monitor_samples=0"]) == 2
    expect("P22", capsys.readouterr().err, tmp_path)


def test_a_cell_with_a_pipe_is_escaped_in_the_markdown_table() -> None:
    """ncl-sparsity's and ncl-supervised's header "sparsity % (|x|<1e-5)" split its cell in two in
    their .md (8 cells under a 6-column separator: a broken table). A pipe in a header or row label
    is written as \\|."""
    from bayesncl.paper.ncl_studies import SPARSITY
    from bayesncl.paper.reproduce import format_study
    from bayesncl.paper.studies import Study, Variant, rows_of

    variants = [Variant("CL | p=0", "cl")]
    study = Study("x", "t", "x", variants, [], [SPARSITY[0]], rows_of(variants))
    md = format_study(study, {"CL | p=0": {"sparsity_paper": {"mean": 1.0, "std": 0.5, "paper": None}}})
    head, sep, row = md.splitlines()
    assert head == r"| row | sparsity % (\|x\|<1e-5) |" and sep == "|---|---:|"
    assert row == r"| CL \| p=0 | 1.00 ± 0.50 |"
