"""``bayesncl reproduce ID --seeds 2`` for every ID at tiny scale, sharing one store of runs.

The module's fixtures train Table 1's runs once; every later study that needs them must reuse
them (pretrain is counted), and each table's JSON must keep mean, std, the per-seed values and
the paper's value of every cell. The sweeps are shortened (module constants of
``bayesncl.paper.studies``) to keep the file fast; each still holds the recipe's value, so a sweep
also shows reuse of Table 1's runs."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bayesncl.app.cli import main
from bayesncl.config import build_config
from bayesncl.paper import studies, variants
from bayesncl.paper.reproduce import cell

from ..conftest import ERROR, error_line, expect, resumable_checkpoint
from ..conftest import TINY as _TINY

# smaller still than the shared tiny settings: 8 px images, 2 steps an epoch (about 50 runs here)
TINY = [*_TINY, "data.image_size=8", "data.train_subset=64"]
SHIPPED_TRANSFER_DATA = dict(studies.TRANSFER_DATA)  # before the module's bench fixture patches it


class Bench:
    """The shared store, and a counter of pretrain calls (``resume`` flags)."""

    def __init__(self, root: Path) -> None:
        self.root, self.store, self.calls = root, root / "store", []

    def run(self, study: str, *extra: str) -> tuple[dict[str, Any], list[bool], str]:
        """``reproduce STUDY --seeds 2``: (its JSON, the pretrain calls it made, its stdout)."""
        before = len(self.calls)
        tiny = [o for o in TINY if not (study == "5" and o.startswith("model.backbone="))]  # table 5's own
        tiny += ["data.train_subset=32"] if study == "5" else []  # ResNet-50: one step an epoch
        args = ["reproduce", study, "--dataset", "fashion-mnist", "--seeds", "2", "--store", str(self.store),
                "--run-dir", str(self.root / study), *tiny, *extra]  # fmt: skip
        assert main(args) == 0
        stem = studies.build(study, "fashion-mnist", tiny).stem
        out = json.loads((self.root / study / f"{stem}.json").read_text())
        return out, self.calls[before:], ""


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    import bayesncl.app.evaluate as evaluate
    import bayesncl.app.train as train

    b = Bench(tmp_path_factory.mktemp("reproduce"))
    real = train.pretrain

    def counted(cfg: Any, run_dir: Any, **kwargs: Any) -> Any:
        b.calls.append(bool(kwargs.get("resume")))
        return real(cfg, run_dir, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train, "pretrain", counted)
        mp.setattr(evaluate, "write_figures", lambda *a, **k: None)  # pretrain's own figures: not tested here
        mp.setattr(studies, "GATE_LR_RATIOS", (0.25, 1.0))
        mp.setattr(studies, "WIDTH_FACTORS", (0.5, 1.0))
        mp.setattr(studies, "RHOS", (0.3, 0.6))  # 0.3: the recipe's
        mp.setattr(studies, "LAMS", (3e-4, 1e-3))
        mp.setattr(studies, "TABLE5_METHODS", ("ncl",))
        mp.setattr(studies, "FINETUNE_CPU_EPOCHS", 1)
        # ncl-fs's transfer set: the runs' own data and sizes (TINY), so it repeats the in-domain probes
        mp.setattr(studies, "TRANSFER_DATA", {"synthetic": ("synthetic", 64, 60)})
        yield b


@pytest.fixture(scope="module")
def table1(bench: Bench) -> dict[str, Any]:
    out, calls, _ = bench.run("1")
    assert calls == [False] * 10  # 5 methods x 2 seeds, each trained once
    return out


def check_cells(out: dict[str, Any], rows: int, columns: int) -> None:
    """Every cell: mean/std of its two per-seed values (ddof 1) and the paper's value."""
    assert out["seeds"] == [0, 1]
    assert len(out["rows"]) == rows
    for label, cells in out["rows"].items():
        assert len(cells) == columns, label
        for key, c in cells.items():
            assert set(c) == {"mean", "std", "values", "paper"}, (label, key)
            assert len(c["values"]) == 2
            if None not in c["values"]:
                a, b = c["values"]
                assert c["mean"] == pytest.approx((a + b) / 2)
                assert c["std"] == pytest.approx(abs(a - b) / math.sqrt(2))


def test_cell_is_mean_and_sample_std() -> None:
    assert cell([1.0, 3.0]) == {"mean": 2.0, "std": pytest.approx(math.sqrt(2)), "values": [1.0, 3.0]}
    c = cell([4.0, None, float("nan")])  # missing or undefined values are left out
    assert (c["mean"], c["std"], len(c["values"])) == (4.0, None, 3)
    assert cell([None, None])["mean"] is None


def test_variant_hash_is_the_resolved_config_and_seed() -> None:
    a = build_config(overrides=[*TINY, "seed=0"])
    assert variants.variant_hash(a) == variants.variant_hash(
        build_config(overrides=[*TINY, "seed=0", "train.progress=true", "train.checkpoint_every=5",
                                "eval.retrieval_dims=8", "data.num_workers=1"])  # fmt: skip
    )
    assert variants.variant_hash(a) != variants.variant_hash(build_config(overrides=[*TINY, "seed=1"]))
    rho = build_config(overrides=[*TINY, "method.rho=0.5"])
    assert variants.variant_hash(a) != variants.variant_hash(rho)
    # a method.name's preset resolves to the same config as its parts given one by one
    assert variants.variant_hash(build_config(overrides=[*TINY, "method.name=ncl"])) == variants.variant_hash(
        build_config(overrides=[*TINY, "method.name=ncl", "method.gate=none"])
    )
    assert len(variants.variant_hash(a)) == 12 and int(variants.variant_hash(a), 16) >= 0


def test_named_overrides_are_those_in_a_runs_name_last_value_first_place() -> None:
    given = ["data.name=synthetic", "train.epochs=3", "data.root=/d", "eval.batch_size=8",
             "data.crop_interpolation=bicubic", "train.progress=false", "train.epochs=5", "method.rho=0.3"]
    named = ["train.epochs=5", "data.crop_interpolation=bicubic", "method.rho=0.3"]
    assert variants.named_overrides(given) == named
    assert variants.named_overrides([]) == []


@pytest.mark.slow
def test_table1_cells_runs_and_rerun(bench: Bench, table1: dict[str, Any]) -> None:
    check_cells(table1, rows=5, columns=4)
    assert table1["rows"]["CL"]["activation_ratio"]["mean"] == pytest.approx(1.0)  # CL: every dim active
    assert len(table1["trained"]) == 10 and table1["reused"] == []
    link = bench.root / "1" / "bayesncl-ste-s1"  # the table's folder links to its stored runs
    assert link.resolve() == bench.store / table1["runs"]["BayesNCL (STE) seed 1"]
    index = (bench.root / "1" / "report" / "index.html").read_text()  # the HTML report: seed 0 of each
    assert all(f"{v}-s0" in index for v in ("cl", "ncl", "ncl-topk", "bayesncl-ste", "bayesncl-gs"))
    assert "-s1" not in index
    # the page says what it is: the table's ID, its header, that it shows seed 0, and links the table
    assert "<h1>bayesncl report: Table 1</h1>" in index and "<title>bayesncl report: Table 1</title>" in index
    assert 'The table: <a href="../table1.md">table1.md</a>' in index
    assert 'alt="figure of the table"' not in index  # Table 1 draws none
    assert "This page: seed 0 of each variant (the table holds the seeds&#39; mean ± std)." in index
    # the paper has no Fashion-MNIST numbers: the title says so instead of promising them
    assert all(c["paper"] is None for r in table1["rows"].values() for c in r.values())
    title = (bench.root / "1" / "table1.md").read_text().splitlines()[0]
    given = variants.named_overrides(TINY)  # and the overrides that name its runs, as given
    assert f" on synthetic (with the fashion-mnist recipe) ({' '.join(given)}): " in title  # TINY: data.name
    assert table1["overrides"] == given
    assert table1["dataset"] == "fashion-mnist" and table1["data"] == ["synthetic"]
    assert title.endswith("ours (mean ± std (ddof 1) over seeds 0..1); the paper reports no values for this "
                          "setting.")
    out, calls, _ = bench.run("1")
    assert calls == [] and len(out["reused"]) == 10
    assert out["rows"] == table1["rows"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "study", ["2", "3", "7", "fig3", "ncl-fs", "ncl-sepin", "ncl-finetune", "convergence"]
)
def test_studies_of_table1s_runs_train_nothing(bench: Bench, table1: dict[str, Any], study: str) -> None:
    out, calls, _ = bench.run(study)
    assert calls == []
    assert set(out["reused"]) <= set(table1["trained"]) and out["trained"] == []
    built = studies.build(study, "fashion-mnist", TINY)
    check_cells(out, rows=len(built.rows), columns=len(built.columns))
    if built.panels:
        assert (bench.root / study / f"{built.stem}.png").read_bytes().startswith(b"\x89PNG")
    rows = out["rows"]
    if study == "2":
        for r in rows.values():
            assert all(0 <= v <= 100 for v in r["knn_acc1"]["values"])
        # retrieval on the top-K dims (K = min(64, D) = 16 here): NCL and BayesNCL, not CL (as the paper)
        assert rows["CL"]["sel.P@1"]["values"] == [None, None]
        assert all(0 <= v <= 100 for r in ("NCL", "BayesNCL") for v in rows[r]["sel.mAP@10"]["values"])
    elif study == "3":
        assert set(rows) == {"NCL epoch 1", "BayesNCL epoch 1"}
        values = [v for r in rows.values() for c in r.values() for v in c["values"]]
        assert all(-1 <= v <= 1 for v in values if v is not None)
    elif study == "7":
        assert all(v > 0 for r in rows.values() for c in r.values() for v in c["values"])
    elif study == "fig3":  # D=16: K = 2, 4, ..., 16; at K = D every dim is used
        assert "NCL K=2" in rows and "BayesNCL K=16" in rows
        assert all(0 <= v <= 100 for r in rows.values() for c in r.values() for v in c["values"])
    elif study == "ncl-fs":  # at K = D the top-K and the random K are the same dims: the same probe
        for v in ("CL", "NCL"):
            full = rows[f"{v} K=16"]
            assert full["top_acc1"]["values"] == full["random_acc1"]["values"]  # exactly: the same columns
            assert full["transfer_top_acc1"]["values"] == full["transfer_random_acc1"]["values"]
        # the "transfer" set is the runs' own data (the fixture's TRANSFER_DATA): the same images through the
        # same encoder, ranked and probed alike (the random dims: one seeded draw per K), so every transfer
        # cell repeats its in-domain twin
        for label, r in rows.items():
            for key in ("top_acc1", "random_acc1"):
                assert r[f"transfer_{key}"]["values"] == pytest.approx(r[key]["values"]), (label, key)
        note = "transfer: the same two probes on synthetic (train 64, test 60;"
        assert any(note in n for n in out["notes"])
    elif study == "ncl-sepin":
        keys = {"sepin@1", "sepin@10", "sepin@all"}
        assert set(rows["CL"]) == keys | {k.replace("sepin", "sepin_x") for k in keys}
        assert all(v >= 0 for r in rows.values() for c in r.values() for v in c["values"])
    elif study == "convergence":  # one checkpoint (epoch 1) per tiny run
        assert set(rows) == {"CL epoch 1", "NCL epoch 1", "BayesNCL epoch 1"}
        assert rows["NCL epoch 1"]["gate_open"]["mean"] is None  # no gate
        assert 0 <= rows["BayesNCL epoch 1"]["gate_open"]["mean"] <= 1
        assert rows["CL epoch 1"]["active_dims"]["mean"] == 16  # CL: every one of the D = 16 dims fires
        assert all(0 <= r[k]["mean"] <= 100 for r in rows.values() for k in ("semantic_consistency",
                                                                             "linear_probe_acc1"))
    elif study == "ncl-finetune":  # each stored run fine-tuned into a folder of its own, then reused
        for r in rows.values():
            for a1, a5 in zip(r["ft_acc1"]["values"], r["ft_acc5"]["values"], strict=True):
                assert 0 <= a1 <= a5 <= 100
        tuned = sorted(bench.store.glob("*/finetune-*/finetune.json"))
        assert len(tuned) == 6  # CL, NCL, BayesNCL x 2 seeds
        again, calls, _ = bench.run(study)
        assert again["rows"] == rows and sorted(bench.store.glob("*/finetune-*/finetune.json")) == tuned


@pytest.mark.slow
def test_sweeps_reuse_the_recipes_run(bench: Bench, table1: dict[str, Any]) -> None:
    full = {table1["runs"][f"BayesNCL (STE) seed {s}"] for s in (0, 1)}
    tables = {}
    for study, new in (("4", 8), ("15", 2), ("fig4a", 4), ("fig4b", 8)):
        out, calls, _ = bench.run(study)
        assert calls == [False] * new, study
        assert full <= set(out["reused"]), study
        built = studies.build(study, "fashion-mnist", TINY)
        check_cells(out, rows=len(built.rows), columns=len(built.columns))
        tables[study] = out
    check_soft_rows(bench, tables["4"])
    # fig4b: the λ lines at the paper's ρ = 0.8 and the recipe's 0.3, the ρ sweep at the recipe's λ: the
    # two sweeps meet at the recipe's cell (one row), which is Table 1's run
    assert list(out["rows"]) == ["rho=0.8 lambda=0.0003", "rho=0.8 lambda=0.001", "rho=0.3 lambda=0.0003",
                                 "rho=0.3 lambda=0.001", "rho=0.6 lambda=0.001"]
    assert out["runs"]["rho=0.3 lambda=0.001 seed 0"] == table1["runs"]["BayesNCL (STE) seed 0"]
    assert 0 <= out["rows"]["rho=0.8 lambda=0.001"]["gate_open_rate"]["mean"] <= 1
    assert "gate_mean_alpha" in out["rows"]["rho=0.8 lambda=0.001"]
    # Tables 9/10: every metric of Table 4's runs, trained nothing
    full, calls, _ = bench.run("9")
    assert calls == [] and len(full["reused"]) == 10
    built = studies.build("9", "fashion-mnist", TINY)
    check_cells(full, rows=6, columns=len(built.columns))
    assert {"semantic_entropy_freq", "lp3_acc5", "sel.mAP@10", "effective_rank"} <= set(full["rows"]["full"])
    assert all(v is not None for c in full["rows"]["no detach"].values() for v in c["values"])
    check_soft_rows(bench, full)
    hard, soft = full["rows"]["soft gate (eval: hard mask)"], full["rows"]["soft gate (eval: α)"]
    for key in ("gate_open_rate", "gate_mean_alpha", "knn_acc1"):  # the same gate and h either way
        assert soft[key]["values"] == hard[key]["values"] and None not in hard[key]["values"]
    assert 0 <= hard["gate_open_rate"]["mean"] <= 1 and 0 < hard["gate_mean_alpha"]["mean"] < 1
    assert 0 <= full["rows"]["soft gate (eval: α)"]["sel.P@1"]["mean"] <= 100


def check_soft_rows(bench: Bench, out: dict[str, Any]) -> None:
    """Tables 4 and 9/10: the soft-gated run twice, the metrics of its features gated by the hard mask
    1[α > 0.5] (metrics.json) and by α, each what normalize(normalize(z) ⊙ gate) gives by hand, and
    not the same; the probe on h (not gated) the same in both rows."""
    import torch
    import torch.nn.functional as F

    from bayesncl.app.evaluate import extract_split
    from bayesncl.metrics import compute_all
    from bayesncl.metrics.registry import METRICS

    rows = out["rows"]
    assert [r for r in rows if r.startswith("soft")] == ["soft gate (eval: hard mask)", "soft gate (eval: α)"]
    hard, soft = rows["soft gate (eval: hard mask)"], rows["soft gate (eval: α)"]
    assert soft["lp3_acc1"]["values"] == hard["lp3_acc1"]["values"]
    for seed in (0, 1):
        sub = bench.store / out["runs"][f"soft gate seed {seed}"]
        model, cfg, _ = variants.load_stored(sub, build_config(overrides=TINY))
        assert cfg.method.gate == "soft" and not cfg.eval.use_soft_gating
        test = extract_split(model, cfg, "test", next(model.parameters()).device, keys=("z", "alpha"))
        unit = F.normalize(torch.from_numpy(test["z"]).double(), dim=1)
        alpha = torch.from_numpy(test["alpha"]).double()
        metrics = {m.key for m in METRICS} & set(hard)  # the table's metric columns
        assert "semantic_consistency" in metrics and "semantic_entropy_freq" in metrics
        by_hand = {}
        for name, cells, gate in (("hard", hard, (alpha > 0.5).double()), ("α", soft, alpha)):
            by_hand[name] = compute_all(F.normalize(unit * gate, dim=1).numpy(), test["labels"])
            for key in metrics:
                expected = pytest.approx(by_hand[name][key], rel=1e-3, abs=1e-3)
                assert cells[key]["values"][seed] == expected, (name, key)
        # the two gatings are different features (the tiny runs' SC is 10 % either way: not a vacuous match)
        assert any(by_hand["hard"][m.key] != pytest.approx(by_hand["α"][m.key], rel=1e-3) for m in METRICS)


@pytest.mark.slow
def test_a_run_is_measured_when_it_finishes_and_its_small_files_make_the_table(
    bench: Bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table stopped while its second run trains keeps the first run's measures beside it
    (reproduce.json), and a run's small files (what benchmarks/long_queue.sh commits: config.yaml,
    log.csv, metrics.json, reproduce.json; no checkpoint, no features) make the same table in another
    store, training nothing."""
    import shutil

    import bayesncl.paper.reproduce as rp

    monkeypatch.setattr(studies, "ABLATIONS", studies.ABLATIONS[:2])  # full, soft gate
    args = ["reproduce", "4", "--dataset", "fashion-mnist", "--seeds", "1", *TINY, "method.rho=0.31"]
    real, started = rp._train, []

    def second_stopped(h: str, *a: Any) -> None:  # Ctrl-C as the second run starts training
        started.append(h)
        if len(started) == 2:
            raise KeyboardInterrupt
        real(h, *a)

    monkeypatch.setattr(rp, "_train", second_stopped)
    before = len(bench.calls)
    assert main([*args, "--store", str(bench.store), "--run-dir", str(tmp_path / "a")]) == 130  # Ctrl-C
    assert bench.calls[before:] == [False]  # the first run trained, the second did not
    first = bench.store / started[0]
    assert {"base[]", "probe3[]", "soft_eval[]"} <= set(json.loads((first / "reproduce.json").read_text()))
    assert not (bench.store / started[1] / "reproduce.json").exists()
    monkeypatch.setattr(rp, "_train", real)
    main([*args, "--store", str(bench.store), "--run-dir", str(tmp_path / "a")])
    assert bench.calls[before:] == [False, False]  # the first run reused, the second trained
    whole = json.loads((tmp_path / "a" / "table4.json").read_text())
    assert (whole["reused"], whole["trained"]) == ([started[0]], [started[1]])
    small = tmp_path / "small"
    for h in whole["runs"].values():
        (small / h).mkdir(parents=True)
        for f in ("config.yaml", "log.csv", "metrics.json", "reproduce.json"):
            shutil.copy(bench.store / h / f, small / h / f)
    before = len(bench.calls)
    main([*args, "--store", str(small), "--run-dir", str(tmp_path / "b")])
    again = json.loads((tmp_path / "b" / "table4.json").read_text())
    assert len(bench.calls) == before and again["reused"] == sorted(set(whole["runs"].values()))
    # a measure not cached beside them needs their weights, which small files lack: ncl-ood trained its
    # new runs for 30 min and then failed on the first restored one; now all are named before any training
    for h in whole["runs"].values():
        cache = json.loads((small / h / "reproduce.json").read_text())
        assert rp.needs_weights(small / h, [("base", ()), ("dead", ()), ("flops", ())]) is False
        assert rp.needs_weights(small / h, [("probe3", ())]) is False  # cached
        assert rp.needs_weights(small / h, [("soft_eval", ())]) is False
        del cache["probe3[]"], cache["soft_eval[]"]
        (small / h / "reproduce.json").write_text(json.dumps(cache))
        assert rp.needs_weights(small / h, [("probe3", ())]) is True
        # the evaluation by α reads the weights of a soft-gated run only
        soft = h == whole["runs"]["soft gate seed 0"]
        assert rp.needs_weights(small / h, [("soft_eval", ())]) is soft
    capsys.readouterr()
    assert main([*args, "--store", str(small), "--run-dir", str(tmp_path / "c")]) == 2
    assert len(bench.calls) == before and not (tmp_path / "c").exists()
    line = error_line(capsys, silent=True)
    first = small / whole["runs"]["full seed 0"]
    assert line.startswith(
        f"{ERROR}table 4 measures its runs from their weights, but 2 finished run(s) have no last.pt (small "
        f"files only, as a packed store restores them): full seed 0 ({first}), soft gate seed 0 ("
    ), line
    assert line.endswith("; move them out of the store (their runs are then trained again), or use another "
                         "--store")
    # --plan: the same plan, those runs marked, nothing trained or written (what to set aside, by hash)
    plan = rp.reproduce("4", "fashion-mnist", tmp_path / "d", [*TINY, "method.rho=0.31"], seeds=1,
                        store=small, plan_only=True)
    lacking = sorted(whole["runs"][f"{v} seed 0"] for v in ("full", "soft gate"))
    assert plan == {"train": [], "resume": [], "reuse": sorted(set(whole["runs"].values())),
                    "needs_weights": lacking}
    assert main([*args, "--store", str(small), "--run-dir", str(tmp_path / "d"), "--plan"]) == 0
    out = capsys.readouterr().out
    assert f"  full seed 0: reuse {first.name} (no last.pt: the table reads its weights)\n" in out
    assert f"without --plan table 4 refuses 2 run(s) that lack weights it reads: {' '.join(lacking)}; " in out
    assert len(bench.calls) == before and not (tmp_path / "d").exists()
    assert again["rows"] == whole["rows"] and len(whole["rows"]) == 3  # the soft gate's two rows


@pytest.mark.slow
def test_table5_warns_on_cpu_before_training(bench: Bench, table1: dict[str, Any]) -> None:
    with pytest.warns(UserWarning) as warned:
        out, calls, _ = bench.run("5")
    (cpu,) = [w for w in warned if "ResNet-50" in str(w.message)]
    expect("P8", str(cpu.message), bench.root)
    assert calls == [False, False]
    check_cells(out, rows=1, columns=4)


@pytest.mark.slow
def test_an_interrupted_run_continues(
    bench: Bench, table1: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    sub = bench.store / table1["runs"]["CL seed 0"]
    (sub / "metrics.json").unlink()  # killed after its last checkpoint, before the evaluation
    capsys.readouterr()
    out, calls, _ = bench.run("2")
    assert calls == [True]  # resumed, not retrained
    assert "to train 0, to continue 1, reused 5" in capsys.readouterr().out
    assert out["continued"] == [sub.name]
    # the study's notes (what its protocol is) close its Markdown, not only the plan printed on stdout
    md = (bench.root / "2" / "table2.md").read_text()
    assert md.endswith(
        "\n\nNotes:\n- LP@1/LP@5: the fast probe on frozen h, mean of 3 probe seeds per run (the paper: 3 "
        "seeds)\n- retrieval: P@1/5/10 and mAP@10 (%) on the top-16 dims of z̃ by expected activation (the "
        "paper's K per dataset); not for CL, as in the paper (selecting dims of CL is meaningless)\n"
    )


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--dataset", "fashion-mnist", "--run-dir", str(tmp_path / "t"), *TINY]
    assert main(["reproduce", "66", *base]) == 2
    expect("P1", error_line(capsys), tmp_path)
    assert main(["reproduce", "mechanism", "--dataset", "fashion-mnist-bg", "--plan"]) == 2
    assert error_line(capsys) == (
        f"{ERROR}--plan: the mechanism study has no plan (it names each run as it reaches it); "
        "--list-weightless lists the runs it would refuse for want of their weights"
    )
    # table 6 probes the encoders it is given: no run of its own to plan or list (it said "its runs")
    assert main(["reproduce", "6", "--dataset", "fashion-mnist-bg", "--plan", "enc.pt"]) == 2
    assert error_line(capsys) == (
        f"{ERROR}--plan: table 6 has no plan: it trains none, it probes the encoders given"
    )
    assert main(["reproduce", "6", "--dataset", "fashion-mnist-bg", "--list-weightless"]) == 2
    assert error_line(capsys) == (
        f"{ERROR}--list-weightless: table 6 has no runs to list: it trains none, it probes the encoders given"
    )
    assert main(["reproduce", "1", *base, "--plan", "--list-weightless"]) == 2
    assert error_line(capsys) == (
        f"{ERROR}--plan and --list-weightless: give one (--list-weightless prints only the hashes)"
    )
    assert main(["reproduce", "6", *base]) == 2  # table 6 exists: it needs a dataset with places
    expect("P2", error_line(capsys), tmp_path)
    for n in ("0", "-1"):
        assert main(["reproduce", "1", "--seeds", n, *base]) == 2
        err = error_line(capsys)
        expect("P3", err, tmp_path)
        assert err.startswith(f"{ERROR}--seeds {n}: ")
    assert main(["reproduce", "1", *base, "seed=3"]) == 2
    expect("P4", error_line(capsys), tmp_path)
    assert main(["reproduce", "5", *base, "model.backbone=resnet18"]) == 2
    expect("P5", error_line(capsys), tmp_path)
    assert main(["reproduce", "15", *base, "method.gate_lr_ratio=0.5"]) == 2
    expect("P6", error_line(capsys), tmp_path)
    assert main(["reproduce", "fig4a", *base, "model.proj_dim=0"]) == 2  # the sweep's base out of range
    assert "model.proj_dim=0: expected >= 1" in error_line(capsys)
    assert not (tmp_path / "t").exists()


def test_table3_refuses_stored_runs_without_its_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Table 7 trains with the default train.checkpoint_every (10): no epoch-0001.pt, which Table 3's
    dynamics read; said before any training, not a failure after it."""
    base = ["--dataset", "fashion-mnist", "--store", str(tmp_path / "store"),
            *(o for o in TINY if not o.startswith("train.checkpoint_every="))]  # fmt: skip
    assert main(["reproduce", "7", "--run-dir", str(tmp_path / "t7"), *base]) == 0
    capsys.readouterr()
    assert main(["reproduce", "3", "--run-dir", str(tmp_path / "t3"), *base]) == 2
    expect("P7", error_line(capsys), tmp_path)
    assert not (tmp_path / "t3").exists()


def test_table3_refuses_an_unfinished_stored_run_without_its_checkpoints_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unfinished stored run (last.pt, no metrics.json) that another table began with a larger
    train.checkpoint_every lacks the epoch-NNNN.pt of the epochs it has done; Table 3 continued it (its
    continuation writes only the epochs left) and failed only in the measure, after that training. It
    is refused before any training, as a finished one is (P7); with them kept it passes."""
    import bayesncl.app.train as train
    from bayesncl.paper.reproduce import study_configs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    tiny = [*TINY, "train.epochs=2"]
    study = studies.build("3", "fashion-mnist", tiny)
    assert study.checkpoints == (1, 2)
    cfg = study_configs(study, "fashion-mnist", tiny, 1)["NCL", 0]
    store, table = tmp_path / "store", tmp_path / "t3"
    sub = store / variants.variant_hash(cfg)
    resumable_checkpoint(sub / "last.pt", cfg, epoch=1)  # stopped after epoch 1, without epoch-0001.pt
    args = ["reproduce", "3", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *tiny]  # fmt: skip
    assert main(args) == 2
    assert error_line(capsys) == (
        f"{ERROR}table 3 needs epoch-NNNN.pt of epochs 1 but {sub}, an unfinished run this command would "
        "continue, has none (another table began it with a larger train.checkpoint_every): run table 3 "
        f"before the tables that share its runs, or move {sub} out of the store (its run is then trained "
        "from the start), or use another --store"
    )
    assert not table.exists() and sorted(p.name for p in sub.iterdir()) == ["last.pt"]
    runs = {sub: ("NCL seed 0", cfg)}
    # --plan marks it (the plan refused it) and --list-weightless names it
    marked = {sub: "no epoch-NNNN.pt of epoch(s) 1: the table reads them"}
    assert variants.check_dirs(table, store, "table 3", runs, checkpoints=(1, 2), plan=True) == marked
    assert main([*args, "--list-weightless"]) == 0
    assert capsys.readouterr() == (f"{sub.name}\n", "")
    (sub / "epoch-0001.pt").write_bytes(b"")  # kept (read only by the measure): the run is continued
    assert variants.check_dirs(table, store, "table 3", runs, checkpoints=(1, 2)) == {}
    assert variants.check_dirs(table, store, "table 3", runs, checkpoints=(1, 2), plan=True) == {}
    assert not table.exists() and sorted(p.name for p in sub.iterdir()) == ["epoch-0001.pt", "last.pt"]


def _small_run(sub: Path, cfg: Any, cache: dict[str, Any] | None = None, weights: bool = False) -> Path:
    """A finished stored run of ``cfg`` as a packed store restores it (config.yaml, metrics.json and,
    given ``cache``, reproduce.json; no checkpoint), or with a ``last.pt`` (``weights``: an empty file,
    which the checks before any training do not read)."""
    from bayesncl.config import dump_yaml

    sub.mkdir(parents=True)
    (sub / "config.yaml").write_text(dump_yaml(cfg))
    (sub / "metrics.json").write_text(json.dumps({"semantic_consistency": 50.0}))
    if cache is not None:
        (sub / "reproduce.json").write_text(json.dumps(cache))
    if weights:
        (sub / "last.pt").write_bytes(b"")
    return sub


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_list_weightless_names_exactly_the_runs_the_table_refuses_for_want_of_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reproduce ID --list-weightless`` prints the hash of each run the table would refuse for want of
    its weights, one a line, and nothing else, writing nothing: a finished run without last.pt whose
    reproduce.json lacks a measure that reads them. A packed run whose reproduce.json caches every
    measure, a run with its last.pt and a run to train are not listed (long_queue.sh's hard-coded
    `again` lists moved any listed run without last.pt, cached or not: retrained for nothing)."""
    import bayesncl.app.train as train
    from bayesncl.paper.reproduce import study_configs, weightless_runs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    study = studies.build("2", "fashion-mnist", TINY)
    configs = study_configs(study, "fashion-mnist", TINY, 2)
    store, table = tmp_path / "store", tmp_path / "t2"
    h = {key: variants.variant_hash(cfg) for key, cfg in configs.items()}
    every = {f"{n}{list(p)}": {"x": 1.0} for n, p in study.measures}  # every measure of the table cached
    probe3 = {"probe3[]": {"lp3_acc1": 50.0}}  # retrieval_sel, which reads the weights, not yet
    _small_run(store / h["CL", 0], configs["CL", 0], probe3)  # refused: no weights for retrieval_sel
    _small_run(store / h["NCL", 0], configs["NCL", 0], every)  # reused from its cache
    _small_run(store / h["BayesNCL", 0], configs["BayesNCL", 0], weights=True)  # measured from its last.pt
    _small_run(store / h["BayesNCL", 1], configs["BayesNCL", 1])  # refused: no cache, no weights
    before = _files(store)
    args = ["reproduce", "2", "--dataset", "fashion-mnist", "--seeds", "2", "--store", str(store),
            "--run-dir", str(table), *TINY]  # fmt: skip
    assert main([*args, "--list-weightless"]) == 0
    assert capsys.readouterr() == (f"{h['CL', 0]}\n{h['BayesNCL', 1]}\n", "")  # the table's order
    assert weightless_runs("2", "fashion-mnist", table, TINY, seeds=2, store=store) == [h["CL", 0],
                                                                                          h["BayesNCL", 1]]
    assert _files(store) == before and not table.exists()
    # the same runs the table refuses, and --plan marks
    assert main(args) == 2
    line = error_line(capsys, silent=True)
    assert "table 2 measures its runs from their weights, but 2 finished run(s) have no last.pt" in line
    assert f"CL seed 0 ({store / h['CL', 0]}), BayesNCL seed 1 ({store / h['BayesNCL', 1]}); " in line
    assert main([*args, "--plan"]) == 0
    out = capsys.readouterr().out
    assert f"  CL seed 0: reuse {h['CL', 0]} (no last.pt: the table reads its weights)\n" in out
    assert f"  NCL seed 0: reuse {h['NCL', 0]}\n" in out
    assert f"  BayesNCL seed 0: reuse {h['BayesNCL', 0]}\n" in out
    lacking = " ".join(sorted([h["CL", 0], h["BayesNCL", 1]]))
    assert f"without --plan table 2 refuses 2 run(s) that lack weights it reads: {lacking}; " in out
    assert _files(store) == before and not table.exists()
    # an empty store: nothing to list (the runs are to train)
    assert main(["reproduce", "2", "--dataset", "fashion-mnist", "--store", str(tmp_path / "empty"),
                 "--run-dir", str(table), *TINY, "--list-weightless"]) == 0  # fmt: skip
    assert capsys.readouterr() == ("", "") and not (tmp_path / "empty").exists()


def test_table3_plan_marks_runs_without_their_checkpoints_and_a_packed_run_is_refused_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Table 3 (and convergence) read each run's epoch-NNNN.pt. ``--plan`` refused a run without them
    (variants._need_checkpoints), so the plan of a store with one was an error; it marks it now, as it
    marks a run without last.pt, and --list-weightless names both. Without --plan a packed run (small
    files only: no last.pt, no checkpoint) was refused as one "another table trained with a larger
    train.checkpoint_every"; it is refused as a run without its weights, with the others. A run whose
    reproduce.json caches what the table reads needs neither."""
    import bayesncl.app.train as train
    from bayesncl.paper.reproduce import needs_weights, reproduce, study_configs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    study = studies.build("3", "fashion-mnist", TINY)
    assert study.checkpoints == (1,)
    configs = study_configs(study, "fashion-mnist", TINY, 1)
    store, table = tmp_path / "store", tmp_path / "t3"
    packed = _small_run(store / variants.variant_hash(configs["NCL", 0]), configs["NCL", 0], {})
    other = _small_run(store / variants.variant_hash(configs["BayesNCL", 0]), configs["BayesNCL", 0],
                       weights=True)  # its last.pt, but no epoch-0001.pt: trained by another table
    before = _files(store)
    args = ["reproduce", "3", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *TINY]  # fmt: skip
    assert main([*args, "--plan"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert f"  NCL seed 0: reuse {packed.name} (no last.pt: the table reads its weights)\n" in out
    assert f"  BayesNCL seed 0: reuse {other.name} (no epoch-NNNN.pt of epoch(s) 1: the table reads them)\n" \
        in out
    assert (f"without --plan table 3 refuses 2 run(s) that lack weights it reads: "
            f"{' '.join(sorted([packed.name, other.name]))}; move them out of the store") in out  # fmt: skip
    plan = reproduce("3", "fashion-mnist", table, TINY, store=store, plan_only=True)
    assert plan["needs_weights"] == plan["reuse"] == sorted([packed.name, other.name])
    capsys.readouterr()
    assert main([*args, "--list-weightless"]) == 0
    assert capsys.readouterr() == (f"{packed.name}\n{other.name}\n", "")
    assert _files(store) == before and not table.exists()
    # without --plan: the run with its last.pt as before (P7), the packed run as one without its weights
    assert main(args) == 2
    assert error_line(capsys).startswith(f"{ERROR}table 3 needs epoch-NNNN.pt of epochs 1 but the stored run "
                                         f"{other} has none (another table trained it with a larger ")
    (other / "epoch-0001.pt").write_bytes(b"")
    assert main(args) == 2
    assert error_line(capsys) == (
        f"{ERROR}table 3 measures its runs from their weights, but 1 finished run(s) have no last.pt (small "
        f"files only, as a packed store restores them): NCL seed 0 ({packed}); move them out of the store "
        "(their runs are then trained again), or use another --store"
    )
    # its dynamics cached (packed after table 3 measured it): reused, no checkpoint needed; so the other
    (other / "epoch-0001.pt").unlink()
    ((name, params),) = study.measures
    for sub in (packed, other):
        (sub / "reproduce.json").write_text(json.dumps({f"{name}{list(params)}": {"e1.AF-GV": 0.5}}))
    assert main([*args, "--list-weightless"]) == 0
    assert capsys.readouterr() == ("", "")
    runs = {packed: ("NCL seed 0", configs["NCL", 0]), other: ("BayesNCL seed 0", configs["BayesNCL", 0])}
    def weights(sub: Path) -> bool:
        return needs_weights(sub, study.measures)

    assert variants.check_dirs(table, store, "table 3", runs, checkpoints=(1,), needs_weights=weights) == {}
    assert not table.exists()


def test_every_tables_folders_are_checked_as_the_mechanism_studys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """reproduce and reproduce mechanism share variants.check_dirs: a stored run trained with other
    settings is refused before a word on stdout, named with what differs, as is a folder of the run
    dir's own where a table links a stored run."""
    import dataclasses

    import bayesncl.app.train as train
    from bayesncl.config import dump_yaml
    from bayesncl.paper.reproduce import study_configs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "t1"
    cfg = study_configs(studies.build("1", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)["NCL", 0]
    sub = store / variants.variant_hash(cfg)
    sub.mkdir(parents=True)
    edited = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, proj_dim=8))
    (sub / "config.yaml").write_text(dump_yaml(edited))
    (sub / "metrics.json").write_text("{}")
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *TINY]  # fmt: skip
    assert main(args) == 2
    assert error_line(capsys, silent=True) == (
        f"{ERROR}NCL seed 0: the stored run {sub} was trained with other settings (model.proj_dim: 8 -> 16; "
        f"stored -> now): move {sub} out of the store (its run is then trained again), or use another "
        "--store"
    )
    sub.rename(tmp_path / "moved")
    (table / "ncl-s0").mkdir(parents=True)  # a folder of its own where the table's link goes
    assert main(args) == 2
    assert error_line(capsys) == (
        f"{ERROR}run dir {table} holds folders of its own where table 1 links its stored runs (ncl-s0): they "
        "would stay there unlinked, beside a table of other runs; move them away, or choose another --run-dir"
    )
    assert sorted(p.name for p in table.iterdir()) == ["ncl-s0"] and list(store.iterdir()) == []


def test_an_interrupted_reproduce_says_rerun_not_resume(capsys: pytest.CaptureFixture[str]) -> None:
    """reproduce has no --resume: the saved run continues when the same command runs again."""
    from bayesncl.app.errors import run_command
    from bayesncl.runs.messages import TrainingInterrupted

    def stop() -> int:
        raise TrainingInterrupted("stopped in epoch 1 after 3 of its 9 steps; state saved to r/{x}/last.pt; "
                                  "{resume} continues from that step")  # fmt: skip

    assert run_command(stop, "reproduce") == 130
    assert capsys.readouterr().err == (
        "bayesncl: interrupted: stopped in epoch 1 after 3 of its 9 steps; state saved to r/{x}/last.pt; "
        "the same command continues from that step\n"
    )
    assert run_command(stop, "pretrain") == 130
    assert capsys.readouterr().err.endswith("; --resume continues from that step\n")
    assert str(TrainingInterrupted("a; {resume} b")) == "a; --resume b"  # what a Python caller reads


def test_the_plans_rate_is_a_stored_runs_fastest_epoch(tmp_path: Path) -> None:
    """A run whose first epochs ran on loaded cores (100 s, 50 s) and its last on idle ones (2 s): the
    plan's images/s is one epoch's images over the fastest epoch, 10 steps x 32 / 2 s = 160."""
    from bayesncl.config import dump_yaml
    from bayesncl.paper.reproduce import _logged_rate
    from bayesncl.runs.logs import LOG_FIELDS, write_log

    cfg = build_config(overrides=[*TINY, "train.batch_size=32"])
    (tmp_path / "config.yaml").write_text(dump_yaml(cfg))
    rows = [{f: 0.0 for f in LOG_FIELDS} | {"epoch": e, "step": 10 * e, "epoch_time_s": t}
            for e, t in ((1, 100.0), (2, 50.0), (3, 2.0))]
    write_log(tmp_path, rows)
    rate = _logged_rate(tmp_path)
    assert rate is not None and rate[1] == pytest.approx(160.0)


def test_ncl_fs_transfer_set_by_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """ncl-fs measures its transfer columns on studies.TRANSFER_DATA's set for the runs' data.name;
    without one (synthetic, image folders) the columns stay empty and a note says why; the paper's
    cells are the NCL paper's ImageNet-100 ones."""
    monkeypatch.setattr(studies, "TRANSFER_DATA", SHIPPED_TRANSFER_DATA)  # not the bench fixture's, if active
    fs = studies.build("ncl-fs", "fashion-mnist", TINY)  # TINY trains on synthetic: no transfer set
    assert [m for m, _ in fs.measures] == ["selection", "retrieval", "nclmap"]
    assert [c.key for c in fs.columns][-2:] == ["transfer_top_acc1", "transfer_random_acc1"]
    assert any("transfer columns empty: no transfer set for data.name=synthetic" in n for n in fs.notes)
    fm = studies.build("ncl-fs", "fashion-mnist", [])  # the recipe: D = 256, generated dSprites (shape)
    assert ("fs_transfer", (("dsprites", 10_000, 5_000), (8, 16, 32, 64, 128, 256))) in fm.measures
    # in domain left, transfer right: CL, NCL x top-K, random K in each, a series named alike in both
    assert [p.title for p in fm.panels] == ["in domain", "transfer: dsprites"]
    assert [s.label for s in fm.panels[1].series] == [s.label for s in fm.panels[0].series]
    assert [s.points[0][2] for s in fm.panels[1].series] == ["transfer_top_acc1", "transfer_random_acc1"] * 2
    assert len(fs.panels) == 1  # no transfer set: no transfer panel
    assert dict(studies.build("ncl-fs", "cifar10", []).measures)["fs_transfer"][0] == ("cifar100", 0, 0)
    assert dict(studies.build("ncl-fs", "cifar100", []).measures)["fs_transfer"][0] == ("cifar10", 0, 0)
    paper = studies.build("ncl-fs", "imagenet100", []).paper
    assert paper["NCL K=2048"] == {"ncl_map": 14.2, "transfer_top_acc1": 19.9}
    assert paper["NCL K=512"] == {"top_acc1": 68.9, "ncl_map": 14.2, "transfer_top_acc1": 19.8}
    assert paper["CL K=512"] == {"random_acc1": 66.2} and paper["CL K=2048"] == {"ncl_map": 10.9}
    assert fm.paper == {}


def test_ncl_fs_checks_its_transfer_set_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transfer set that cannot be read stops ``reproduce ncl-fs`` in one line before any run trains:
    a study's ``extra_data`` is checked with its runs' own data."""
    import bayesncl.app.train as train

    monkeypatch.setattr(studies, "TRANSFER_DATA", {"synthetic": ("imagefolder", 0, 0)})
    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    assert [d.name for _, d in studies.build("ncl-fs", "fashion-mnist", TINY).extra_data] == ["imagefolder"]
    dirs = ["--run-dir", f"{tmp_path}/t", "--store", f"{tmp_path}/store", f"data.root={tmp_path}/none"]
    assert main(["reproduce", "ncl-fs", "--dataset", "fashion-mnist", *TINY, *dirs]) == 2
    expect("P9", error_line(capsys), tmp_path)
    assert not (tmp_path / "t").exists() and not (tmp_path / "store").exists()


def test_ncl_fs_transfer_set_is_read_where_its_check_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before training reads ncl-fs's transfer set under the command's data.root; the measure
    read it under the stored run's recorded one (data.root is not part of a run's identity: a stored run
    may have trained where the data lay elsewhere), failing after the check had passed. Both read the
    command's now."""
    import bayesncl.app.evaluate as evaluate
    from bayesncl.paper.ncl_studies import MEASURES

    from ..conftest import image_folder, tiny_checkpoint

    monkeypatch.setattr(studies, "TRANSFER_DATA", {"synthetic": ("imagefolder", 0, 0)})
    here = image_folder(tmp_path / "here")
    sub = tmp_path / "store" / "run"
    sub.mkdir(parents=True)
    tiny_checkpoint(sub / "last.pt", ["method.name=ncl", f"data.root={tmp_path / 'gone'}"])  # trained there
    command = [*TINY, "data.image_size=16", f"data.root={here}"]
    ((_, checked),) = studies.build("ncl-fs", "fashion-mnist", command).extra_data
    assert (checked.name, checked.root) == ("imagefolder", str(here))
    read, extract = [], evaluate.extract_split

    def reading(model: Any, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(cfg.data)
        return extract(model, cfg, *args, **kwargs)

    monkeypatch.setattr(evaluate, "extract_split", reading)
    cfg = build_config(overrides=[*command, "method.name=ncl"])
    out = MEASURES["fs_transfer"](sub, cfg, (("imagefolder", 0, 0), (2, 4)))
    assert [(d.name, d.root) for d in read] == [("imagefolder", checked.root)] * 2  # train and test splits
    assert set(out) == {f"K{k}.transfer_{m}_acc1" for k in (2, 4) for m in ("top", "random")}
    assert all(0 <= v <= 100 for v in out.values())


def test_transfer_config_keeps_the_runs_geometry() -> None:
    from bayesncl.paper.studies import transfer_config

    cfg = build_config(overrides=["data.name=fashion-mnist", "data.train_subset=500", "data.test_subset=70"])
    t = transfer_config(cfg, "dsprites", 100, 50)
    assert (t.data.name, t.data.train_subset, t.data.test_subset) == ("dsprites", 100, 50)
    assert t.data.image_size == 28 and t.data.labels == "auto"  # fashion-mnist's native 28 px, labelled
    assert t.model == cfg.model and cfg.data.name == "fashion-mnist"  # the run's config is not altered


def test_every_measure_of_a_stored_run_reads_the_commands_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored run records the data.root it trained with (not part of its name); a store moved to a
    machine where the data lies elsewhere was reused ("reusing ...") and then failed in every measure
    but ncl-fs's transfer, naming the old root. Each measure, and the mechanism study's dynamics, now
    reads the data under the command's data.root (variants.measure_overrides): the old root is gone."""
    import shutil

    from bayesncl.config import dump_yaml
    from bayesncl.data import clear_cache
    from bayesncl.data import corruptions as corruption_cache
    from bayesncl.paper.mechanism import final_dynamics
    from bayesncl.paper.reproduce import MEASURES
    from bayesncl.runs.features import load_features

    from ..conftest import fmnist_folder, tiny_checkpoint

    monkeypatch.setattr(corruption_cache, "DEFAULT_CACHE", tmp_path / "cache")
    clear_cache()
    gone, here = tmp_path / "gone", tmp_path / "here"
    data = ["data.name=fashion-mnist-bg", "data.train_subset=64", "data.test_subset=40", f"data.root={gone}"]
    runs: dict[str, Path] = {}
    for method in ("ncl", "ce"):  # ce: a method with its own classifier, for the "head" measure
        sub = runs[method] = tmp_path / "store" / method
        sub.mkdir(parents=True)
        tiny_checkpoint(sub / "last.pt", [*data, f"method.name={method}"])  # trained where the data lay then
        shutil.copy(sub / "last.pt", sub / "epoch-0001.pt")
        trained = build_config(overrides=[*TINY, *data, f"method.name={method}"])
        (sub / "config.yaml").write_text(dump_yaml(trained))
        (sub / "metrics.json").write_text(json.dumps({"sparsity": 0.25}))
    fmnist_folder(gone)
    shutil.move(gone, here)  # the data moved (or the store did): the recorded root is no more
    command = [*TINY, *data[:-1], f"data.root={here}"]
    cfgs = {m: build_config(overrides=[*command, f"method.name={m}"]) for m in runs}
    assert variants.identity(cfgs["ce"]) == variants.identity(trained)  # the same run, under one name
    wanted: list[tuple[str, tuple[Any, ...]]] = [
        ("probe3", ()), ("retrieval", (8,)), ("retrieval_sel", (8,)), ("selection", (4, 8)),
        ("sepin", (1, 4)), ("sparsity", ()), ("nclmap", (4,)), ("appj", ()), ("dynamics", ((1,), 32)),
        ("trajectory", ((1,),)), ("ood", (("gaussian_noise",), (1,))),
        ("finetune", ("train.epochs=1", "train.warmup_epochs=0", "train.batch_size=32")),
    ]  # fmt: skip
    sub, cfg = runs["ncl"], cfgs["ncl"]
    got = {}
    for name, params in wanted:  # (an untrained model's correlations may be NaN: a constant dim)
        got[name] = MEASURES[name](sub, cfg, params)
        assert got[name] and all(v is None or isinstance(v, float) for v in got[name].values()), name
    assert set(got["dynamics"]) == {"e1.AF-GV", "e1.GV-SC", "e1.AF-SC"} and not gone.exists()
    accuracies = [got["probe3"]["lp3_acc1"], got["trajectory"]["e1.linear_probe_acc1"],
                  got["ood"]["gaussian_noise.sev1"], got["finetune"]["ft_acc1"]]  # fmt: skip
    assert all(0 <= a <= 100 for a in accuracies), accuracies
    (head,) = MEASURES["head"](runs["ce"], cfgs["ce"], ()).values()
    assert 0 <= head <= 100
    dynamics = final_dynamics(sub, cfg, samples=32)
    assert set(dynamics) == {"dims", "AF-GV", "GV-SC", "AF-SC"} and dynamics["dims"] >= 0
    assert load_features(sub / "features_test.npz").meta["dataset"] == "fashion-mnist-bg"
    clear_cache()


def test_an_unfinished_stored_run_with_other_settings_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored run with a last.pt but no metrics.json is continued by the table; one started with other
    settings (its config edited, or copied in) was refused only when its turn came, possibly hours of
    training later, with pretrain's --resume advice. check_dirs refuses it up front, in one line with
    advice for reproduce; with the command's settings it passes (the table continues it)."""
    import dataclasses

    import bayesncl.app.train as train
    from bayesncl.config import dump_yaml
    from bayesncl.paper.reproduce import study_configs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "t1"
    cfg = study_configs(studies.build("1", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)["NCL", 0]
    sub = store / variants.variant_hash(cfg)
    edited = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, proj_dim=8))
    resumable_checkpoint(sub / "last.pt", edited)  # (its config is what --resume compares, as the check)
    (sub / "config.yaml").write_text(dump_yaml(cfg))
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *TINY]  # fmt: skip
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    expect("P12", err, tmp_path)
    assert f"folder {sub} holds" in err and "(model.proj_dim: 8 -> 16; stored -> now)" in err
    assert not table.exists() and sorted(store.iterdir()) == [sub]
    resumable_checkpoint(sub / "last.pt", cfg)  # its own settings: to be continued, not refused
    assert variants.check_dirs(table, store, "table 1", {sub: ("NCL seed 0", cfg)}) == {}
    assert not table.exists()


def test_a_stored_runs_place_taken_or_without_a_config_is_named_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's entry for a run that is a file was reported as "run dir ... is a file; choose another
    --run-dir"; a finished stored run without config.yaml (nor last.pt) as a bare "config file ... does
    not exist"; a file of the run dir's own where a table links a stored run as a "folder". Each names
    the run and what to do, in one line, before anything is written."""
    import bayesncl.app.train as train
    from bayesncl.paper.reproduce import study_configs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "t1"
    cfg = study_configs(studies.build("1", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)["NCL", 0]
    sub = store / variants.variant_hash(cfg)
    store.mkdir()
    sub.write_text("not a run")
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *TINY]  # fmt: skip
    assert main(args) == 2
    err = error_line(capsys)
    expect("P13", err, tmp_path)
    assert err.startswith(f"{ERROR}NCL seed 0: {sub}, where the store keeps this run, is a file")
    sub.unlink()
    sub.mkdir()
    (sub / "metrics.json").write_text("{}")  # finished, but its config.yaml lost (and no last.pt)
    assert main(args) == 2
    err = error_line(capsys)
    expect("P14", err, tmp_path)
    assert f"NCL seed 0: the stored run {sub} holds metrics.json" in err
    (sub / "config.yaml").write_text("model: [")  # damaged: C8-like reader's line inside, then the advice
    assert main(args) == 2
    err = error_line(capsys)
    assert err.startswith(f"{ERROR}NCL seed 0: the stored run {sub}: its settings cannot be read (config ")
    assert err.endswith(f"; move {sub} out of the store (its run is then trained again), or use another "
                        "--store")  # fmt: skip
    sub.rename(tmp_path / "moved")
    table.mkdir()
    (table / "ncl-s0").write_text("notes")  # a file of its own where the table links NCL seed 0
    assert main(args) == 2
    expect("P15", error_line(capsys), tmp_path)
    assert sorted(p.name for p in table.iterdir()) == ["ncl-s0"] and list(store.iterdir()) == []


def test_a_stored_run_with_a_damaged_metrics_json_or_a_broken_link_is_named_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished stored run whose metrics.json is garbage, empty or no object ended in a JSONDecodeError
    traceback when its turn came (reproduce's base measure, the mechanism study's reuse); a link in the
    store to a folder since moved or deleted passed the checks and failed later with "file exists".
    Each is one line before a word on stdout, naming the run and what to do; nothing is written."""
    import bayesncl.app.train as train
    from bayesncl.config import dump_yaml
    from bayesncl.paper.reproduce import study_configs

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "t1"
    cfg = study_configs(studies.build("1", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)["NCL", 0]
    sub = store / variants.variant_hash(cfg)
    sub.mkdir(parents=True)
    (sub / "config.yaml").write_text(dump_yaml(cfg))
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *TINY]  # fmt: skip
    bad = f"{ERROR}NCL seed 0: the stored run {sub}: its metrics.json cannot be read"
    advice = f"; move {sub} out of the store (its run is then trained again), or use another --store"
    for text, why in (("\x00\x17garbage", "not JSON: Expecting value at character 0"), ("", "it is empty"),
                      ("[1, 2]", "it holds a JSON list, expected an object of metrics")):  # fmt: skip
        (sub / "metrics.json").write_text(text)
        assert main(args) == 2
        err = error_line(capsys, silent=True)
        assert err == f"{bad} ({why}){advice}"
        if text == "":
            expect("P16", err, tmp_path)
    # its last.pt whole, of the command's settings and length: deleting metrics.json evaluates it again
    # (a run with a last.pt and no metrics.json is continued: no epoch left), far cheaper than retraining
    resumable_checkpoint(sub / "last.pt", cfg, epoch=cfg.train.epochs)
    assert main(args) == 2
    assert error_line(capsys, silent=True) == (
        f"{ERROR}NCL seed 0: the stored run {sub}: its metrics.json cannot be read (it holds a JSON list, "
        f"expected an object of metrics); its last.pt is whole: delete {sub / 'metrics.json'} and the run is "
        f"evaluated again from it (no training), or move {sub} out of the store (its run is then trained "
        "again), or use another --store"
    )
    for partial, epoch in ((True, cfg.train.epochs - 1), (False, cfg.train.epochs + 1)):  # more to train,
        resumable_checkpoint(sub / "last.pt", cfg, epoch=epoch, partial=partial)  # or more than trained
        assert main(args) == 2
        assert error_line(capsys, silent=True).endswith(f"expected an object of metrics){advice}")
    (sub / "last.pt").write_bytes(b"")  # damaged: only the move
    assert main(args) == 2
    assert error_line(capsys, silent=True).endswith(f"expected an object of metrics){advice}")
    resumable_checkpoint(sub / "last.pt", cfg, epoch=cfg.train.epochs)
    (sub / "metrics.json").unlink()  # as advised: the table continues the run (evaluates it), no refusal
    assert variants.check_dirs(table, store, "table 1", {sub: ("NCL seed 0", cfg)}) == {}
    (sub / "metrics.json").write_text("[1, 2]")
    (sub / "last.pt").unlink()
    with pytest.raises(ValueError) as raised:  # where it is read without check_dirs before (demo): named too
        variants.finished_metrics(sub)
    assert str(raised.value) == (
        f"the run {sub}: its metrics.json cannot be read (it holds a JSON list, expected an object of "
        f"metrics); move {sub} away (its run is then trained again)"
    )
    sub.rename(tmp_path / "moved")
    sub.symlink_to(tmp_path / "gone", target_is_directory=True)  # the folder it pointed to: moved away
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    expect("P17", err, tmp_path)
    assert f"{sub}, where the store keeps this run, is a link to {tmp_path / 'gone'}, which" in err
    assert not table.exists() and list(store.iterdir()) == [sub] and sub.is_symlink()


def _flip_a_byte(checkpoint: bytes) -> bytes:
    """``checkpoint`` (a torch.save zip archive) with one byte changed in the middle of its first record
    (``data.pkl``, stored uncompressed), so that its CRC-32 no longer matches."""
    import io
    import struct
    import zipfile

    first = zipfile.ZipFile(io.BytesIO(checkpoint)).infolist()[0]
    assert first.filename.endswith("data.pkl") and first.compress_type == zipfile.ZIP_STORED
    at = first.header_offset
    name, extra = struct.unpack("<HH", checkpoint[at + 26 : at + 30])  # the local header's lengths
    at += 30 + name + extra + first.file_size // 2
    return checkpoint[:at] + bytes([checkpoint[at] ^ 0xFF]) + checkpoint[at + 1 :]


def test_a_stored_runs_damaged_checkpoint_is_named_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unfinished stored run whose last.pt is empty, truncated or a folder passed the checks and failed
    at its turn with pretrain's "--resume: .../last.pt is empty, not a checkpoint" (reproduce has no
    --resume); it is refused up front, naming the run, with what to do. A finished stored run whose
    last.pt is missing or truncated failed only once a measure needed the weights, naming neither the
    run nor the store; it is named so there."""
    import shutil

    import bayesncl.app.train as train
    from bayesncl.config import dump_yaml
    from bayesncl.paper.reproduce import measure, study_configs
    from bayesncl.runs.messages import RunDirError

    from ..conftest import tiny_checkpoint

    monkeypatch.setattr(train, "pretrain", lambda *a, **k: pytest.fail("trained"))
    store, table = tmp_path / "store", tmp_path / "t1"
    cfg = study_configs(studies.build("1", "fashion-mnist", TINY), "fashion-mnist", TINY, 1)["NCL", 0]
    sub = store / variants.variant_hash(cfg)
    whole = resumable_checkpoint(tmp_path / "whole.pt", cfg).read_bytes()
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--store", str(store), "--run-dir", str(table),
            *TINY]  # fmt: skip
    restart = f"move {sub} out of the store (its run is then trained from the start), or use another --store"
    damage = {  # what is in last.pt -> why it cannot be read
        "empty": (b"", f"{sub / 'last.pt'} is empty, not a checkpoint"),
        "truncated": (whole[: len(whole) // 2], f"{sub / 'last.pt'} is not a readable PyTorch checkpoint "
                                                 "(truncated or damaged? "),  # (torch's own words follow)
        "a folder": (None, f"{sub / 'last.pt'} is a directory, not a checkpoint file"),
        # a byte changed inside a stored record: torch.load alone would read it (as other values)
        "a bad CRC": (_flip_a_byte(whole), f"{sub / 'last.pt'} is damaged: the checksum of its record "
                                           "whole/data.pkl does not match (a partial copy or a disk error)"),
    }  # fmt: skip
    for what, (content, why) in damage.items():
        shutil.rmtree(sub, ignore_errors=True)
        sub.mkdir(parents=True)
        (sub / "last.pt").mkdir() if content is None else (sub / "last.pt").write_bytes(content)
        assert main(args) == 2, what
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, what
        assert err.startswith(f"{ERROR}NCL seed 0: the store's folder {sub} holds an unfinished run whose "
                              f"last.pt cannot be read ({why}"), err  # fmt: skip
        assert err.endswith(f"), so this command cannot continue it: {restart}\n"), err
        if what == "empty":
            expect("P18", err, tmp_path)
        assert not table.exists() and sorted(p.name for p in sub.iterdir()) == ["last.pt"]
    # a finished stored run, its last.pt missing, then cut short: named where a measure needs its weights
    shutil.rmtree(sub)
    sub.mkdir()
    (sub / "config.yaml").write_text(dump_yaml(cfg))
    (sub / "metrics.json").write_text(json.dumps({"semantic_consistency": 40.0}))
    assert measure(sub, cfg, [])["semantic_consistency"] == 40.0  # its metrics alone: no weights needed
    for why in ("is missing", f"cannot be read ({sub / 'last.pt'} is not a readable PyTorch checkpoint "):
        with pytest.raises(RunDirError) as raised:
            measure(sub, cfg, [("probe3", ())])
        assert str(raised.value).startswith(f"the stored run {sub} is finished but its last.pt {why}"), raised
        assert str(raised.value).endswith(
            f", and measuring it needs that: move {sub} out of the store (its run is then trained again)"
        )
        if why == "is missing":
            expect("P19", str(raised.value), tmp_path)
        good = tiny_checkpoint(tmp_path / "good.pt", []).read_bytes()
        (sub / "last.pt").write_bytes(good[: len(good) // 2])
    assert sorted(p.name for p in sub.iterdir()) == [
        "config.yaml", "last.pt", "metrics.json", "reproduce.json"
    ]  # fmt: skip
    assert list(variants.read_cache(sub)) == ["base[]"]  # (the first call's base cached; no features)


def test_a_table_at_another_rho_lambda_keeps_the_runs_of_methods_that_do_not_read_them() -> None:
    """``headline`` (or Table 1) at the paper's ρ = 0.8, λ = 3e-5: NCL reads neither key, so its runs keep
    their store names (and are reused); BayesNCL's are new runs at that ρ/λ."""
    import bayesncl.paper.reproduce as rp

    at = [*TINY, "method.rho=0.8", "method.lam=3e-5"]
    here = rp.study_configs(studies.build("headline", "fashion-mnist", at), "fashion-mnist", at, 2)
    base = rp.study_configs(studies.build("headline", "fashion-mnist", TINY), "fashion-mnist", TINY, 2)
    for s in (0, 1):
        assert variants.variant_hash(here["NCL", s]) == variants.variant_hash(base["NCL", s])
        assert (here["BayesNCL", s].method.rho, here["BayesNCL", s].method.lam) == (0.8, 3e-5)
        assert variants.variant_hash(here["BayesNCL", s]) != variants.variant_hash(base["BayesNCL", s])
    assert here["NCL", 0].method.rho == base["NCL", 0].method.rho == 0.3  # the recipe's


@pytest.mark.slow
def test_finished_writes_the_table_of_the_finished_runs_and_trains_nothing(
    bench: Bench, table1: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reproduce 1 --finished method.lam=X``: CL, NCL and NCL+TopK read no λ and are Table 1's finished
    runs; both BayesNCL rows are new runs at that λ, not trained: their cells are empty, listed as missing,
    and nothing trains. With no finished run it says so in one line and writes nothing."""
    before = len(bench.calls)
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--seeds", "2", "--store", str(bench.store),
            *TINY, "method.lam=0.0042", "--finished"]  # fmt: skip
    assert main([*args, "--run-dir", str(tmp_path / "a")]) == 0
    assert len(bench.calls) == before  # nothing trained, nothing continued
    out = json.loads((tmp_path / "a" / "table1.json").read_text())
    for row in ("CL", "NCL", "NCL+TopK"):
        assert out["rows"][row] == table1["rows"][row]
    for row in ("BayesNCL (STE)", "BayesNCL (GS)"):
        assert all(c["mean"] is None and c["values"] == [None, None] for c in out["rows"][row].values())
    assert sorted(out["missing"]) == sorted(f"{r} seed {s}" for r in ("BayesNCL (STE)", "BayesNCL (GS)")
                                            for s in (0, 1))  # fmt: skip
    assert not set(out["missing"].values()) & set(table1["runs"].values())
    assert out["trained"] == out["continued"] == []
    md = (tmp_path / "a" / "table1.md").read_text()
    assert "So far: 6 of the 10 run(s) finished (--finished); a cell without its run is –." in md
    assert "| BayesNCL (STE) | – | – | – | – |" in md
    assert not (tmp_path / "a" / "bayesncl-ste-s0").exists() and (tmp_path / "a" / "ncl-s0").is_symlink()
    capsys.readouterr()
    assert main([*args[:-2], "train.epochs=7", "--finished", "--run-dir", str(tmp_path / "b")]) == 2
    line = error_line(capsys, silent=True)
    assert line == (f"{ERROR}--finished: none of the 10 run(s) of table 1 has finished in {bench.store} (run "
                    "it without --finished to train them)")
    assert not (tmp_path / "b").exists() and len(bench.calls) == before
    assert main([*args, "--plan", "--run-dir", str(tmp_path / "c")]) == 2
    assert error_line(capsys, silent=True) == (
        f"{ERROR}--finished and --plan: give one (--finished writes the table of the runs finished)")


def test_the_default_run_dir_names_the_overrides_so_two_settings_keep_two_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--run-dir`` a table goes to ``runs/<stem>-<dataset>`` followed by its overrides (``method.``
    left off; a key given twice at its last value; a number in one spelling), leaving out those that
    change neither runs nor table (data.root, train.progress, train.compile); so ``headline`` at two ρ/λ
    writes two run dirs, both sharing the store ``runs/variants``, and the plan says where the table
    goes. An unusual character becomes ``_`` and adds a hash of the values as given (so ``a/b`` and ``a_b``
    keep two names); an overlong name is hashed, whatever the order."""
    from bayesncl.paper.reproduce import _prepare, default_run_dir

    assert default_run_dir("table1", "cifar100", []) == Path("runs/table1-cifar100")
    assert default_run_dir("headline", "cifar100", ["method.rho=0.8", "method.lam=3e-5", "data.root=/d",
                                                    "train.progress=false", "train.compile=true",
                                                    "method.rho=0.30"]) == Path(
        "runs/headline-cifar100-lam=3e-05-rho=0.3")  # fmt: skip
    assert default_run_dir("t", "d", ["method.lam=3e-05"]) == default_run_dir("t", "d", ["method.lam=3e-5"])
    train, test = (default_run_dir("t", "d", [f"{s}.batch_size=64"]) for s in ("train", "eval"))
    assert (train.name, test.name) == ("t-d-train.batch_size=64", "t-d-eval.batch_size=64")
    odd = default_run_dir("x", "y", ["model.backbone=a b/../c"])
    digest = hashlib.sha1(b"model.backbone=a b/../c").hexdigest()[:6]
    assert odd == Path(f"runs/x-y-model.backbone=a_b_.._c-{digest}")
    assert default_run_dir("x", "y", ["data.name=a/b"]) != default_run_dir("x", "y", ["data.name=a_b"])
    assert default_run_dir("x", "y", ["data.name=a_b"]) == Path("runs/x-y-data.name=a_b")  # nothing replaced
    many = [f"model.k{i}=resnet18" for i in range(12)]
    long = default_run_dir("x", "y", many)
    assert long.name.startswith("x-y-overrides-") and len(long.name) == len("x-y-overrides-") + 10
    assert long == default_run_dir("x", "y", many[::-1])  # the order does not matter, the values do
    assert long != default_run_dir("x", "y", [*many[1:], "model.k0=r50"])
    monkeypatch.chdir(tmp_path)
    a = _prepare("headline", "fashion-mnist", None, ["method.rho=0.8"], 1, None, plan=True)
    b = _prepare("headline", "fashion-mnist", None, ["method.rho=0.3"], 1, None, plan=True)
    assert a.run_dir == Path("runs/headline-fashion-mnist-rho=0.8")
    assert b.run_dir == Path("runs/headline-fashion-mnist-rho=0.3")
    assert a.store == b.store == Path("runs/variants")
    assert main(["reproduce", "headline", "--dataset", "fashion-mnist", "--plan", "method.rho=0.8"]) == 0
    assert "\n  the table goes to runs/headline-fashion-mnist-rho=0.8\n" in capsys.readouterr().out


@pytest.mark.slow
def test_train_only_passes_over_a_run_another_process_trains_so_processes_split_a_table(
    bench: Bench, table1: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``reproduce 1 --train-only method.lam=X`` while another process trains BayesNCL (STE) seed 0 (a
    pretrain: its run dir's lock) and another reproduce holds BayesNCL (GS) seed 1 (its claim beside the
    run in the store): CL, NCL and NCL+TopK read no λ (Table 1's runs, reused); the plan marks both held
    runs, the other two new runs train, the held ones are passed over untouched, and no table is
    written. Without the flag a held run stops the command in one line; on a store without file locks
    --train-only refuses before training. Once the locks are free the same command trains those two
    alone; the command without the flag then trains nothing and writes the table."""
    import os

    import bayesncl.runs.lock as lock
    from bayesncl.paper.reproduce import study_configs

    over = [*TINY, "method.lam=0.0077"]
    configs = study_configs(studies.build("1", "fashion-mnist", over), "fashion-mnist", over, 2)
    hashes = {key: variants.variant_hash(cfg) for key, cfg in configs.items()}
    held = bench.store / hashes["BayesNCL (STE)", 0]
    held.mkdir(parents=True)
    pretraining = lock.lock_run_dir(held)  # another open file description: flock refuses this process too
    claimed = lock.lock_file(bench.store / f".training-{hashes['BayesNCL (GS)', 1]}.lock", "{pid}")
    assert pretraining is not None and claimed is not None
    run_dir = tmp_path / "t1"
    args = ["reproduce", "1", "--dataset", "fashion-mnist", "--seeds", "2", "--store", str(bench.store),
            "--run-dir", str(run_dir), *over]  # fmt: skip
    before, pid = len(bench.calls), os.getpid()
    capsys.readouterr()
    assert main([*args, "--train-only"]) == 0
    out = capsys.readouterr().out
    for name, seed in (("BayesNCL (STE)", 0), ("BayesNCL (GS)", 1)):
        now = f"(another process is training it now, pid {pid})"
        planned = f"  {name} seed {seed}: train {hashes[name, seed]}"
        assert any(line.startswith(planned) and line.endswith(now) for line in out.splitlines()), out
        assert f"/4] {name} seed {seed}: passed over, another process is training it (pid {pid})" in out
    assert bench.calls[before:] == [False] * 3  # the pretrain's run too, refused at its run dir's lock
    new = [hashes[v, s] for v in ("BayesNCL (STE)", "BayesNCL (GS)") for s in (0, 1)]
    assert [variants.finished(bench.store / h) for h in new] == [False, True, True, False]
    assert list(held.iterdir()) == [held / ".bayesncl.lock"] and not (bench.store / new[3]).exists()
    assert ("--train-only: trained 2, passed over 2 (another process trains or trained them); 6 finished "
            "before." in out)  # fmt: skip
    assert "the table goes to" not in out and not (run_dir / "table1.md").exists()
    assert main(args) == 2  # without the flag: a held run stops it, in one line
    assert error_line(capsys) == (
        f"{ERROR}BayesNCL (GS) seed 1: another bayesncl process is training it in {bench.store / new[3]} "
        f"(pid {pid}); wait for it to end, give --train-only to train the table's other runs meanwhile, or "
        "--finished for the table so far")  # fmt: skip
    pretraining.release()
    claimed.release()
    with monkeypatch.context() as m:  # a file system without locks: lock_file gives None
        m.setattr(lock, "lock_file", lambda *a: None)
        assert main([*args, "--train-only"]) == 2
        assert error_line(capsys) == (
            f"{ERROR}--train-only: the store {bench.store} takes no file locks, so a process cannot tell "
            "which runs another one trains; run one process (without --train-only), or give a --store on a "
            "file system with flock")  # fmt: skip
    assert len(bench.calls) == before + 3
    assert main([*args, "--train-only"]) == 0
    assert bench.calls[before + 3 :] == [False, False]
    assert all(variants.finished(bench.store / h) for h in new)
    assert "--train-only: trained 2, passed over 0" in capsys.readouterr().out
    assert sorted(p.name for p in bench.store.glob(".training-*")) == []  # each claim deleted at its release
    assert main(args) == 0
    assert len(bench.calls) == before + 5  # the table trains nothing
    table = json.loads((run_dir / "table1.json").read_text())
    assert sorted(table["reused"]) == sorted(set(hashes.values())) and table["trained"] == []
    assert None not in table["rows"]["BayesNCL (STE)"]["semantic_consistency"]["values"]
    capsys.readouterr()
    for flag in ("--plan", "--finished", "--list-weightless"):
        assert main([*args, "--train-only", flag]) == 2
        assert error_line(capsys, silent=True) == (
            f"{ERROR}--train-only and {flag}: give one (--train-only trains the table's runs and writes no "
            "table)")
    assert main(["reproduce", "6", "--train-only"]) == 2
    assert error_line(capsys, silent=True) == (
        f"{ERROR}--train-only: table 6 trains no runs (it probes the encoders given); give it to a table or "
        "figure ID")
