"""The method registry (issue 22): a method is one file, its loss the weighted sum of its terms, its
statistics a dict by name, its own keys checked like the common ones, and a user's file adds one
(``bayesncl.register_method``, ``--plugin``) with examples/ncl_l1.py as the tested example."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bayesncl
from bayesncl.app.cli import main
from bayesncl.config import ConfigError, build_config, valid_keys
from bayesncl.core import methods
from bayesncl.core.engine import Cursor
from bayesncl.core.losses import info_nce
from bayesncl.core.model import build_model, contrastive_loss

from ..conftest import ROOT, TINY_BASE, expect

EXAMPLE = ROOT / "examples" / "ncl_l1.py"
SMALL = [*TINY_BASE, "train.epochs=1", "train.warmup_epochs=0", "train.progress=false",
         "train.monitor_samples=0"]


def _l1(out: object, batch: object, m: object) -> torch.Tensor:
    return out.z.float().abs().sum(1).mean()  # type: ignore[attr-defined]


L1 = methods.LossTerm("l1", _l1, weight="l1_weight", label="L1")


def _ncl_l1(name: str = "test-ncl-l1") -> methods.Method:
    return methods.Method(
        name, terms=(methods.INFO_NCE, L1),
        stats=(*methods.CONTRASTIVE_STATS, methods.term_statistic(L1, "L1")),
        keys={"l1_weight": methods.Key(0.5, check=lambda v: v >= 0, expected=">= 0")},
    )


def test_each_built_in_method_is_one_file_registered_in_table_order() -> None:
    first = ["cl", "ncl", "ncl-topk", "bayesncl", "bayesncl-gs", "ncl-ipw"]  # then the NCL paper's (issue 25)
    assert list(methods.METHODS)[: len(first)] == first
    for file, name in zip(methods.BUILT_IN, methods.METHODS, strict=True):
        assert (ROOT / "src/bayesncl/core/methods" / f"{file}.py").is_file()
        assert methods.METHODS[name].source is None  # built in
    terms = {m: [t.name for t in methods.terms(build_config(overrides=[f"method.name={m}"]).method)]
             for m in ("ncl", "bayesncl")}
    assert terms == {"ncl": ["info_nce"], "bayesncl": ["info_nce", "kl"]}  # the gate brings the KL term
    with pytest.raises(ConfigError, match=r"^method.name='ncll': expected one of cl, .*did you mean ncl"):
        methods.get("ncll")


def test_the_loss_is_the_weighted_sum_of_the_terms(registry: None) -> None:
    bayesncl.register_method(_ncl_l1())
    cfg = build_config(overrides=[*SMALL, "method.name=test-ncl-l1", "method.l1_weight=0.25"])
    torch.manual_seed(0)
    model = build_model(cfg, 1, 16, 10)
    out = model(torch.randn(8, 1, 16, 16), views=2)
    loss, terms = contrastive_loss(out, cfg.method)
    nce = info_nce(out.z_tilde, 0.2)
    l1 = out.z.abs().sum(1).mean()  # by hand: mean over the 8 rows of the row's L1 norm
    assert set(terms) == {"info_nce", "l1"}
    assert terms["info_nce"].item() == pytest.approx(nce.item())
    assert terms["l1"].item() == pytest.approx(l1.item())
    assert loss.item() == pytest.approx(nce.item() + 0.25 * l1.item())
    gated = build_config(overrides=[*SMALL, "method.name=bayesncl", "method.lam=0.5"])
    model = build_model(gated, 1, 16, 10)
    out = model(torch.randn(8, 1, 16, 16), views=2)
    loss, terms = contrastive_loss(out, gated.method)
    assert loss.item() == pytest.approx(terms["info_nce"].item() + 0.5 * terms["kl"].item())


def test_statistics_are_a_dict_by_name() -> None:
    cfg = build_config(overrides=[*SMALL, "method.name=ncl"])
    model = build_model(cfg, 1, 16, 10)
    out = model(torch.randn(8, 1, 16, 16), views=2)
    loss, terms = contrastive_loss(out, cfg.method)
    logits, labels = torch.tensor([[2.0, 0.0]] * 8), torch.tensor([0, 0, 0, 1] * 2)
    stats = methods.statistics(cfg.method, methods.Step(loss, terms, out, logits, labels))
    assert list(stats) == ["loss", "info_nce", "online_acc"]  # no gate: none of the gate's statistics
    assert stats["online_acc"].item() == 0.75  # 6 of the 8 labels are class 0, the probe's pick
    assert stats["loss"].item() == loss.item()
    no_labels = methods.statistics(cfg.method, methods.Step(loss, terms, out), labeled=False)
    assert "online_acc" not in no_labels


def test_a_checkpoint_from_before_named_statistics_resumes() -> None:
    """An old last.pt holds the mid-epoch sums as a (6,) tensor in the old STATS order (from before
    gate_mean_alpha too)."""
    old = {"n_seen": 2, "sums": torch.arange(6.0), "elapsed": 3.0, "window": ([0.5] * 6, 1)}
    names = ("loss", "info_nce", "kl", "gate_open", "rows_all_closed", "online_acc")
    c = Cursor.from_dict(old, names)
    assert c.n_seen == 2 and c.elapsed == 3.0
    assert c.sums["kl"].item() == 2.0 and c.sums["online_acc"].item() == 5.0
    assert c.window == (dict.fromkeys(names, 0.5), 1)
    assert Cursor.from_dict(c.to_dict(), names) == c


def test_a_methods_own_keys(registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bayesncl.register_method(_ncl_l1())
    cfg = build_config(overrides=[*SMALL, "method.name=test-ncl-l1"])
    assert cfg.method.l1_weight == 0.5 and "method.l1_weight" in valid_keys("test-ncl-l1")
    assert cfg.to_dict()["method"]["l1_weight"] == 0.5  # beside the common keys, in config.yaml too
    assert "own" not in cfg.to_dict()["method"] and "method.own" not in valid_keys("test-ncl-l1")
    again = build_config(cfg.to_dict())
    assert again == cfg
    later = build_config(overrides=[*SMALL, "method.l1_weight=2", "method.name=test-ncl-l1"])  # any order
    assert later.method.l1_weight == 2
    assert "l1_weight" not in build_config(overrides=[*SMALL, "method.name=ncl"]).to_dict()["method"]
    methods.METHODS.pop("test-ncl-l1")  # the CLI's messages below name the example's method
    cli = ["pretrain", "--plugin", str(EXAMPLE), "--run-dir", str(tmp_path / "r")]
    for row, args in (
        ("X8", ["method.name=ncl-l1-example", "method.l1_weigth=1"]),
        ("X9", ["method.name=ncl-l1-example", "method.l1_weight=-1"]),
        ("X10", ["method.name=ncl", "method.l1_weight=1"]),
    ):
        assert main([*cli, *args]) == 2
        expect(row, capsys.readouterr().err, tmp_path)


def _plugin(tmp: Path, name: str, body: str) -> Path:
    path = tmp / name
    path.write_text("import bayesncl\nfrom bayesncl.core import methods as m\n" + body)
    return path


def test_bad_plugins_are_one_line(registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vector = "m.LossTerm('per_row', lambda out, batch, cfg: out.z.sum(1))"
    cases = {
        "X1": tmp_path / "missing.py",
        "X2": tmp_path,
        "X3": _plugin(tmp_path, "none.py", "x = 1\n"),
        "X4": _plugin(tmp_path, "clash.py", "bayesncl.register_method(m.METHODS['ncl'])\n"),
        "X5": _plugin(tmp_path, "raises.py", "1 / 0\n"),
        "X12": _plugin(tmp_path, "exits.py", "import sys\nsys.exit('no GPU here')\n"),
        "X6": _plugin(tmp_path, "vector.py", "bayesncl.register_method(m.Method('ncl-vector', "
                      f"terms=({vector},), stats=m.CONTRASTIVE_STATS))\n"),
        "X13": _plugin(tmp_path, "weight.py", "bayesncl.register_method(m.Method('ncl-weight', "
                       "terms=(m.INFO_NCE, m.LossTerm('l1', lambda out, batch, cfg: out.z.abs().mean(), "
                       "weight='l1_weigth')), "
                       "stats=m.CONTRASTIVE_STATS, keys={'l1_weight': m.Key(1e-3)}))\n"),
        "X14": _plugin(tmp_path, "inputs.py", "bayesncl.register_method(m.Method('ncl-inputs', "
                       "terms=(m.INFO_NCE, m.LossTerm('cls', lambda out, batch, cfg: out.z.mean(), "
                       "inputs=('heads.cls',))), stats=m.CONTRASTIVE_STATS))\n"),
        "X15": _plugin(tmp_path, "head.py", "bayesncl.register_method(m.Method('ncl-head', "
                       "terms=(m.INFO_NCE,), stats=m.CONTRASTIVE_STATS, "
                       "heads={'cls': m.Head(lambda d, c: 42)}))\n"),
    }
    for row, path in cases.items():
        assert main(["pretrain", "--plugin", str(path), *SMALL]) == 2, row
        expect(row, capsys.readouterr().err, tmp_path)
    assert len(methods.METHODS) == len(methods.BUILT_IN)  # nothing of a failed plugin stays registered
    # X16: a method that registers (its preset gate gives α) but fails on the run's settings (no gate):
    # refused when the config is checked, before a run dir
    gated = _plugin(tmp_path, "gated.py", "bayesncl.register_method(m.Method('ncl-alpha', gate='ste', "
                    "terms=(m.INFO_NCE, m.LossTerm('am', lambda out, batch, cfg: out.alpha.mean(), "
                    "inputs=('alpha',))), stats=m.CONTRASTIVE_STATS))\n")
    run = tmp_path / "run"
    assert main(["pretrain", "--plugin", str(gated), *SMALL, "method.name=ncl-alpha", "method.gate=none",
                 "--run-dir", str(run)]) == 2  # fmt: skip
    expect("X16", capsys.readouterr().err, tmp_path)
    assert not run.exists()
    twin = "bayesncl.register_method(m.Method('twin', terms=(m.INFO_NCE,), stats=m.CONTRASTIVE_STATS))"
    a, b = (_plugin(tmp_path, f"twin_{x}.py", twin + "\n") for x in "ab")
    assert main(["pretrain", "--plugin", str(a), "--plugin", str(b), *SMALL]) == 2
    expect("X11", capsys.readouterr().err, tmp_path)  # the second file's 'twin' names the first's
    assert methods.METHODS["twin"].source == str(a)


def test_config_that_is_not_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", "--config", "/dev/null"]) == 2
    expect("C16", capsys.readouterr().err, tmp_path)


@pytest.mark.integration
def test_the_example_runs_as_a_script() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[:2] == ["epoch", "1:"] and last[2::2] == ["loss", "info_nce", "l1"]
    loss, nce, l1 = map(float, last[3::2])
    assert l1 > 0 and loss == pytest.approx(nce + 0.01 * l1, abs=2e-6)  # method.l1_weight=0.01


@pytest.mark.slow
def test_the_example_plugin_trains_from_the_cli_and_reloads(
    registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["--plugin", str(EXAMPLE), "method.name=ncl-l1-example", "method.l1_weight=0.1", *SMALL]
    assert main(["pretrain", "--run-dir", str(run), "--no-eval", *args]) == 0
    rows = list(csv.DictReader((run / "log.csv").open()))
    header = (run / "log.csv").read_text().splitlines()[0].split(",")
    assert header.index("l1") == header.index("online_acc") + 1  # its own statistic, before lr
    loss, nce, l1 = (float(rows[0][k]) for k in ("loss", "info_nce", "l1"))
    assert loss == pytest.approx(nce + 0.1 * l1, abs=2e-6)
    assert (run / "plugins.txt").read_text().strip() == str(EXAMPLE.resolve())
    from bayesncl.app.report.curves import read_log, training_curves_figure

    titles = [ax.get_title() for ax in training_curves_figure({"r": read_log(run)}).axes]
    assert titles == ["InfoNCE (nats)", "online probe accuracy (%)", "mean ‖z‖₁ (before λ₁)"]
    capsys.readouterr()
    methods.METHODS.pop("ncl-l1-example")  # a fresh process that did not load the plugin
    assert main(["evaluate", str(run), "--probe", "none", "--no-knn"]) == 2
    expect("X7", capsys.readouterr().err, tmp_path)
    # every command that loads the run takes --plugin: extract, and finetune (its own run dir); each call
    # as a fresh process would make it, the plugin not loaded yet
    from bayesncl.core import plugins

    plugins._LOADED.clear()
    assert main(["extract", str(run), "--plugin", str(EXAMPLE), "--out", str(tmp_path / "f.npz")]) == 0
    with np.load(tmp_path / "f.npz") as f:
        assert f["z"].shape[1] == build_config(overrides=SMALL).model.proj_dim
    methods.METHODS.pop("ncl-l1-example")
    plugins._LOADED.clear()
    ft = ["finetune", str(run), "--plugin", str(EXAMPLE), "--run-dir", str(tmp_path / "ft"), "train.epochs=1",
          "train.warmup_epochs=0", "train.batch_size=16", "train.progress=false"]  # fmt: skip
    assert main(ft) == 0 and "acc1" in json.loads((tmp_path / "ft" / "finetune.json").read_text())


def test_a_gate_composes_with_a_methods_terms(registry: None) -> None:
    """The gate is a part: the user's method with method.gate=ste gets λ·KL besides its own terms."""
    bayesncl.register_method(dataclasses.replace(_ncl_l1(), name="test-gated-l1"))
    cfg = build_config(overrides=[*SMALL, "method.name=test-gated-l1", "method.gate=ste"], warn_inert=False)
    assert [t.name for t in methods.terms(cfg.method)] == ["info_nce", "l1", "kl"]


def test_the_examples_of_docs_extending_md_run(registry: None, capsys: pytest.CaptureFixture[str]) -> None:
    doc = ROOT / "docs" / "extending.md"
    for block in re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S):
        exec(compile(block, str(doc), "exec"), {})  # noqa: S102 - our own documentation
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "gate 2 1, 2 or 3", "('gate_depth', 'gate_hidden') ['name', 'nonneg', 'temperature', 'topk']",
        "0.01 0.01", "['cls']", "['online_acc', 'z_active']", "mean_l1 2.0000",
    ]
    assert methods.get("ncl-active").source is not None  # a user's method, checked on a test batch


@pytest.mark.slow
def test_a_method_that_presets_a_gate_registers_and_trains(registry: None, tmp_path: Path) -> None:
    """A user's method with gate=ste is checked with the gate's λ·KL term (its `kl` statistic reads
    it), from Python and from --plugin, and trains with it."""
    bayesncl.register_method(methods.Method("test-gated", gate="ste", terms=(methods.INFO_NCE,),
                                            stats=methods.CONTRASTIVE_STATS))
    cfg = build_config(overrides=[*SMALL, "method.name=test-gated"])
    assert cfg.method.gate == "ste" and [t.name for t in methods.terms(cfg.method)] == ["info_nce", "kl"]
    body = ("bayesncl.register_method(m.Method('plugin-gated', gate='ste', terms=(m.INFO_NCE,), "
            "stats=m.CONTRASTIVE_STATS))\n")
    run = tmp_path / "run"
    args = ["--plugin", str(_plugin(tmp_path, "gated.py", body)), "method.name=plugin-gated", "method.lam=.5"]
    assert main(["pretrain", "--run-dir", str(run), "--no-eval", *args, *SMALL]) == 0
    row = list(csv.DictReader((run / "log.csv").open()))[0]
    loss, nce, kl, open_rate = (float(row[k]) for k in ("loss", "info_nce", "kl", "gate_open"))
    assert kl > 0 and 0 < open_rate <= 1 and loss == pytest.approx(nce + 0.5 * kl, abs=2e-6)


CLS_EXAMPLE = ROOT / "examples" / "ncl_classifier.py"


def test_a_term_weighted_by_no_declared_key_is_refused_at_registration(
    registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A term whose ``weight`` names no key fails at registration, in one line, before any run dir (it
    used to pass and die mid-epoch with an AttributeError)."""
    bad = methods.LossTerm("l1", _l1, weight="l1_wieght", label="L1")
    method = methods.Method("test-typo", terms=(methods.INFO_NCE, bad), stats=methods.CONTRASTIVE_STATS,
                            keys={"l1_weight": methods.Key(0.5)})
    match = (r"^method 'test-typo': its loss term 'l1' is weighted by method.l1_wieght, which is not a key "
             r"of the method \(its own keys: l1_weight; or a common method.\* key\)$")
    with pytest.raises(ConfigError, match=match):
        bayesncl.register_method(method)
    assert "test-typo" not in methods.METHODS
    body = ("bayesncl.register_method(m.Method('test-typo2', terms=(m.INFO_NCE, m.LossTerm('x', "
            "lambda o, b, c: o.z.sum(), weight='nope')), stats=m.CONTRASTIVE_STATS))\n")
    plugin = _plugin(tmp_path, "typo.py", body)
    run = tmp_path / "run"
    assert main(["pretrain", "--plugin", str(plugin), "--run-dir", str(run), *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is weighted by method.nope, which is not a key of the method" in err[0]
    assert not run.exists()  # no run dir left behind


def test_a_plugin_with_its_own_head_registers_trains_and_evaluates(
    registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/ncl_classifier.py: a classifier ``Head`` beside InfoNCE. It registers (the check builds its
    head), trains from the CLI (its parameters are ``heads.cls.*``; loss = InfoNCE + γ·CE), resumes with its
    head's weights and goes on training them, and evaluates."""
    from bayesncl.core.plugins import load_plugin

    assert load_plugin(CLS_EXAMPLE) == ["ncl-cls-example"]
    run = tmp_path / "run"
    args = ["--plugin", str(CLS_EXAMPLE), "method.name=ncl-cls-example", "method.cls_weight=0.5", *SMALL]
    assert main(["pretrain", "--run-dir", str(run), "--no-eval", *args]) == 0
    row = next(csv.DictReader((run / "log.csv").open()))
    loss, nce, ce = (float(row[k]) for k in ("loss", "info_nce", "cls"))
    assert ce > 0 and loss == pytest.approx(nce + 0.5 * ce, abs=2e-6)
    assert 0 <= float(row["cls_acc"]) <= 100
    state = torch.load(run / "last.pt", map_location="cpu", weights_only=False)
    model_state = state["state_dict"]
    assert {"heads.cls.linear.weight", "heads.cls.linear.bias"} <= set(model_state)
    assert model_state["heads.cls.linear.weight"].shape == (10, 16)  # classes x D (synthetic: 10 classes)
    assert main(["pretrain", "--run-dir", str(run), "--resume", "--no-eval", *args, "train.epochs=2"]) == 0
    resumed = torch.load(run / "last.pt", map_location="cpu", weights_only=False)["state_dict"]
    assert len(list(csv.DictReader((run / "log.csv").open()))) == 2
    assert not torch.equal(resumed["heads.cls.linear.weight"], model_state["heads.cls.linear.weight"])
    capsys.readouterr()
    assert main(["evaluate", str(run), "--plugin", str(CLS_EXAMPLE), "--probe", "none", "--no-knn"]) == 0


def test_contrastive_head_builds_a_methods_own_heads(registry: None) -> None:
    """``bayesncl.ContrastiveHead`` with CE (its classifier head): refused in one line without the number
    of classes, and with it the head is built and the loss is the classifier's cross-entropy."""
    cfg = build_config(overrides=[*SMALL, "method.name=ce"])
    with pytest.raises(ConfigError, match=r"^method 'ce' has its own head\(s\) \(classifier\), built for the "
                                          r"number of classes"):
        bayesncl.ContrastiveHead(32, cfg)
    torch.manual_seed(0)
    head = bayesncl.ContrastiveHead(32, cfg, num_classes=3)
    assert head.heads["classifier"].weight.shape == (3, 16)
    h1, h2, y = torch.randn(4, 32), torch.randn(4, 32), torch.tensor([0, 1, 2, 0])
    loss, stats = head(h1, h2, labels=y)
    out = head.project(torch.cat([h1, h2]))
    by_hand = torch.nn.functional.cross_entropy(out.heads["classifier"], torch.cat([y, y]))
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)
