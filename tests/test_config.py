"""Config resolution: presets, YAML, overrides, type coercion and one-line errors."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest

from bayesncl.config import (
    METHOD_PRESETS,
    ConfigError,
    MethodConfig,
    build_config,
    diff_configs,
    dump_yaml,
    list_keys,
    preset_of,
    set_key,
    valid_keys,
)
from bayesncl.core import methods
from bayesncl.core.methods import METHODS
from bayesncl.core.optim import warmup_cosine

RECIPES = sorted((Path(__file__).parents[1] / "src" / "bayesncl" / "configs").glob("*.yaml"))


def test_presets_set_the_parts_of_each_method() -> None:
    cl = build_config(overrides=["method.name=cl"]).method
    assert (cl.nonneg, cl.gate, cl.topk) == ("identity", "none", False)
    topk = build_config(overrides=["method.name=ncl-topk"]).method
    assert topk.topk and topk.gate == "none" and topk.nonneg == "rep_relu"
    gs = build_config(overrides=["method.name=bayesncl-gs"]).method
    assert gs.gate == "gumbel"
    assert set(METHOD_PRESETS) == {"cl", "ncl", "ncl-topk", "bayesncl", "bayesncl-gs", "ncl-ipw", "cl-l1",
                                   "ncl-l1", "scl", "ncl-scl", "scl-l1", "supcon", "ncl-supcon", "ce", "nce"}


def test_overrides_win_over_preset_and_yaml(tmp_path: Path) -> None:
    y = tmp_path / "c.yaml"
    y.write_text("method:\n  name: bayesncl\n  rho: 0.7\n  gate: soft\ntrain:\n  epochs: 3\n")
    cfg = build_config(y, ["method.rho=0.6", "seed=5", "eval.retrieval_dims=32,64"])
    assert cfg.method.rho == 0.6  # CLI beats YAML
    assert cfg.method.gate == "soft"  # YAML beats preset (the soft-gate ablation)
    assert cfg.train.epochs == 3 and cfg.seed == 5
    assert cfg.eval.retrieval_dims == [32, 64]
    assert isinstance(cfg.train.epochs, int) and isinstance(cfg.method.rho, float)


def test_a_list_key_takes_a_single_value_on_the_command_line_only(tmp_path: Path) -> None:
    """key=value: 64 and 32,64 are the short forms of [64] and [32, 64] (a bracket needs quoting in a
    shell); a YAML file writes the list (tests/app/test_bad_inputs.py: a single value there is refused)."""
    assert build_config(overrides=["eval.retrieval_dims=64"]).eval.retrieval_dims == [64]
    assert build_config(overrides=["eval.retrieval_dims=[32, 64]"]).eval.retrieval_dims == [32, 64]
    y = tmp_path / "c.yaml"
    y.write_text("eval:\n  retrieval_dims: [64]\n")
    assert build_config(y).eval.retrieval_dims == [64]
    y.write_text("eval:\n  retrieval_dims:\n    - 32\n    - 64\n")
    assert build_config(y).eval.retrieval_dims == [32, 64]
    assert build_config(y, ["eval.retrieval_dims=16"]).eval.retrieval_dims == [16]  # CLI beats YAML
    assert list_keys() == ["train.loggers", "eval.retrieval_dims"]


def test_required_keys_exist() -> None:
    keys = set(valid_keys())
    for k in (
        "data.name",
        "data.root",
        "train.epochs",
        "train.batch_size",
        "model.backbone",
        "method.name",
        "method.rho",
        "method.lam",
        "seed",
    ):
        assert k in keys


def test_unknown_key_names_closest() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'method\.rhoo'.*method\.rho"):
        build_config(overrides=["method.rhoo=0.5"])
    with pytest.raises(ConfigError, match=r"unknown config key 'trian\.epochs'.*train\.epochs"):
        build_config(overrides=["trian.epochs=1"])


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("method.rho=1.0", r"method\.rho=1\.0: expected 0 < rho < 1"),
        ("method.rho=0", r"method\.rho=0\.0: expected 0 < rho < 1"),
        ("method.lam=-1e-5", r"method\.lam=-1e-05: expected lambda >= 0"),
        ("method.temperature=0", r"method\.temperature=0\.0: expected 0\.01 <= temperature <= 10 \(the"),
        ("method.temperature=11", r"method\.temperature=11\.0: expected 0\.01 <= temperature <= 10 "),
        ("data.image_size=7", r"data\.image_size=7: expected 0 \(the dataset's native size\) or >= 8 px"),
        ("train.device=cuda:x", r"train\.device='cuda:x': expected auto, cpu, cuda or cuda:N"),
        ("method.gate_tau=-1", r"method\.gate_tau=-1\.0: expected > 0"),
        ("train.batch_size=1", r"train\.batch_size=1: expected >= 2"),
        ("method.gate_depth=4", r"gate_depth=4: expected 1, 2 or 3"),
        ("method.name=simclr", r"method\.name='simclr': expected one of cl, ncl"),
        ("train.epochs=two", r"train\.epochs='two': expected int"),
        ("data.name=mnist", r"data\.name='mnist': expected one of fashion-mnist"),
        ("norho", r"override 'norho' is not key=value"),
    ],
)
def test_bad_values_are_one_line_errors(override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as e:
        build_config(overrides=[override])
    assert "\n" not in str(e.value)


# What the losses and the parts checked on every call (or in __init__) before config was the one
# checker; each value is refused here, once, before a model is built (tests/core/test_losses.py and
# tests/core/test_parts.py test the maths only).
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("method.temperature=-1", "method.temperature=-1.0: expected 0.01 <= temperature <= 10 (the paper "
         "uses 0.2)"),
        ("method.temperature=nan", "method.temperature='nan': expected a finite number"),
        ("method.temperature=true", "method.temperature=True: expected float"),
        ("method.temperature=[0.2]", "method.temperature=[0.2]: expected float"),
        ("method.temperature=none", "method.temperature='none': expected float"),
        ("method.rho=-0.5", "method.rho=-0.5: expected 0 < rho < 1"),
        ("method.rho=1.5", "method.rho=1.5: expected 0 < rho < 1"),
        ("method.rho=true", "method.rho=True: expected float"),
        ("method.threshold=1.0", "method.threshold=1.0: expected 0 < threshold < 1"),
        ("method.threshold=0", "method.threshold=0.0: expected 0 < threshold < 1"),
        ("method.threshold=1.2", "method.threshold=1.2: expected 0 < threshold < 1"),
        ("method.gate_tau=0", "method.gate_tau=0.0: expected > 0"),
        ("method.gate_tau=-2", "method.gate_tau=-2.0: expected > 0"),
        ("method.gate_tau=abc", "method.gate_tau='abc': expected float"),
        ("method.gumbel_noise=normal", "method.gumbel_noise='normal': expected one of gumbel, logistic"),
        ("method.nonneg=tanh", "method.nonneg='tanh': expected one of identity, relu, rep_relu, gelu, "
         "sigmoid, softplus, exp, leaky_relu"),
        ("method.gate=hard", "method.gate='hard': expected one of none, ste, gumbel, soft"),
        ("method.gate_depth=0", "method.gate_depth=0: expected 1, 2 or 3"),
        ("method.gate_depth=2.5", "method.gate_depth=2.5: expected int"),
        ("method.gate_depth=true", "method.gate_depth=True: expected int"),
        ("method.gate_hidden=8.5", "method.gate_hidden=8.5: expected int"),
        ("method.gate_hidden=-1", "method.gate_hidden=-1: expected >= 0"),
        ("method.detach=maybe", "method.detach='maybe': expected bool"),
        ("model.proj_dim=0", "model.proj_dim=0: expected >= 1"),
        ("model.proj_dim=true", "model.proj_dim=True: expected int"),
        ("model.proj_hidden=0", "model.proj_hidden=0: expected >= 1"),
        ("model.proj_hidden=4.5", "model.proj_hidden=4.5: expected int"),
        (
            "model.backbone=vit",
            "model.backbone='vit': expected one of resnet18, resnet50, small_cnn or timm:NAME (a timm model)",
        ),
    ],
)
def test_config_refuses_what_the_parts_would_get_wrong(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_config(overrides=[override])
    assert str(e.value) == message


def test_a_depth_3_gate_needs_a_hidden_width_of_2() -> None:
    message = (
        "method.gate_depth=3: the gate's hidden width is 1 (method.gate_hidden, or model.proj_hidden "
        "when 0): expected >= 2 (its second layer is hidden // 2 wide)"
    )
    for overrides in (["method.gate_hidden=1"], ["model.proj_hidden=1"]):
        with pytest.raises(ConfigError) as e:
            build_config(overrides=["method.gate_depth=3", *overrides])
        assert str(e.value) == message
    build_config(overrides=["method.gate_depth=3", "method.gate_hidden=2", "model.proj_hidden=1"])
    build_config(overrides={"method.name": "ncl", "method.gate_depth": 3, "model.proj_hidden": 1})  # no gate


def test_values_reach_the_parts_as_python_numbers() -> None:
    """The parts do not convert their arguments: config hands them Python ints, floats and bools."""
    cfg = build_config(
        overrides={"method.gate_depth": np.int64(3), "method.gate_tau": np.float32(2.0),
                   "model.proj_dim": 8.0, "method.detach": "true", "method.temperature": "0.2"}
    )
    m = cfg.method
    assert (type(m.gate_depth), type(m.gate_tau), type(cfg.model.proj_dim)) == (int, float, int)
    assert (m.gate_depth, m.gate_tau, cfg.model.proj_dim, m.detach, m.temperature) == (3, 2.0, 8, True, 0.2)


def test_topk_k_larger_than_d() -> None:
    # rho < 1 always gives k <= D; k = 0 (too small rho for D) is the reachable failure.
    with pytest.raises(ConfigError, match=r"TopK k=round\(rho\*D\)=0"):
        build_config(overrides=["method.name=ncl-topk", "method.rho=0.001", "model.proj_dim=16"])


def test_range_edges_are_accepted() -> None:
    for over in ("method.temperature=0.01", "method.temperature=10", "data.image_size=8", "data.image_size=0",
                 "train.device=cuda:1"):
        build_config(overrides=[over])


def test_unreadable_yaml_files_are_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"train:\n  epochs: 3\n\xff\xfe\x00")
    with pytest.raises(ConfigError) as e:
        build_config(binary)
    assert str(e.value) == (
        f"config file '{binary}' is not UTF-8 text (byte 0xff at offset 19): expected a YAML file"
    )
    with pytest.raises(ConfigError) as e:
        build_config(tmp_path)
    assert str(e.value) == f"config file '{tmp_path}' is a directory, not a YAML file"
    example = {"method": "method: {rho: 0.5}", "train": "train: {epochs: 10}",
               "data": "data: {name: cifar10}"}
    for section, value, shown in (("method", "3", "3"), ("train", "[1, 2]", "[1, 2]"), ("data", "x", "'x'")):
        bad = tmp_path / f"{section}.yaml"
        bad.write_text(f"{section}: {value}\n")
        with pytest.raises(ConfigError) as e:
            build_config(bad)
        assert str(e.value) == (
            f"config file '{bad}': section '{section}' must be a mapping of keys (e.g. {example[section]}), "
            f"got {shown}"
        )
    empty = tmp_path / "empty-section.yaml"
    empty.write_text("method:\n  # rho: 0.5\ntrain:\n  epochs: 3\n")
    assert build_config(empty).train.epochs == 3  # a section with every key commented out is empty


def test_yaml_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        build_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  epoch: 3\n")
    with pytest.raises(ConfigError, match=r"'train\.epoch'.*train\.epochs"):
        build_config(typo)


def test_roundtrip_and_diff() -> None:
    import yaml

    cfg = build_config(overrides=["method.name=ncl", "method.rho=0.5"])
    again = build_config(yaml.safe_load(dump_yaml(cfg)))
    assert again == cfg
    other = build_config(overrides=["method.name=ncl", "method.rho=0.6", "train.epochs=7"])
    assert diff_configs(cfg, other) == ["method.rho"]  # epochs may change on resume


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_is_valid(path: Path) -> None:
    cfg = build_config(path)
    # the demo and the ViT recipes serve NCL and BayesNCL alike (method.name on the command line)
    assert cfg.method.name in path.stem or path.stem.endswith(("-demo", "-vit", "-long"))


def test_warmup_cosine_schedule() -> None:
    s = warmup_cosine(1.0, total_steps=110, warmup_steps=10, start=0.0, final=0.0)
    assert s.shape == (110,)
    assert s[0] == 0.0 and s[5] == pytest.approx(5 / 9)  # linear warmup, pl_bolts': start -> peak at W-1
    assert s[9] == pytest.approx(1.0) and s[10] == pytest.approx(1.0)  # peak at W-1 and at W (issue 13)
    assert s[60] == pytest.approx(0.5)  # cosine midpoint
    assert s[-1] == pytest.approx((1 + __import__("math").cos(__import__("math").pi * 99 / 100)) / 2)
    assert all(a >= b for a, b in zip(s[10:], s[11:], strict=False))


def test_gate_settings_on_a_gateless_method_warn_naming_them() -> None:
    with pytest.warns(UserWarning) as record:
        build_config(overrides=["method.name=cl", "method.lam=0.1", "method.rho=0.3", "seed=1"])
    assert [str(w.message) for w in record] == [
        "method.lam, method.rho have no effect with method.name=cl (method.gate=none, method.topk=false)"
    ]
    with pytest.warns(UserWarning, match=r"^method.gate_depth has no effect .*method.topk=true\)$"):
        build_config(overrides=["method.name=ncl-topk", "method.rho=0.3", "method.gate_depth=3"])
    with pytest.warns(UserWarning, match=r"^method.gumbel_noise has no effect with method.name=bayesncl "):
        build_config(overrides=["method.gumbel_noise=logistic"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_config(overrides=["method.name=bayesncl", "method.lam=0.1", "method.rho=0.3"])
        build_config(overrides=["method.name=bayesncl", "method.gate=soft"])  # an ablation (Table 4)
        build_config(overrides=["method.name=ncl", "method.nonneg=relu"])  # an ablation (NCL's ReLU)
        build_config(overrides={"method.name": "cl", "method.lam": 0.1})  # programmatic dicts: no warning


def test_switches_that_make_another_method_warn() -> None:
    """A preset whose defining part is switched off (or another method's switched on) would be run,
    and labelled in every table, under a name it no longer is."""
    cases = {
        ("method.name=ncl-topk", "method.topk=false"): "method.topk=false turns method.name=ncl-topk into "
        "ncl",
        ("method.name=bayesncl", "method.gate=none"): "method.gate=none turns method.name=bayesncl into ncl",
        ("method.name=ncl", "method.gate=ste", "method.lam=0.1"): "method.gate=ste turns method.name=ncl "
        "into bayesncl",
        ("method.name=ncl", "method.nonneg=identity"): "method.nonneg=identity turns method.name=ncl into cl",
        ("method.name=cl", "method.nonneg=relu", "method.topk=true"): "method.nonneg=relu, method.topk=true "
        "turn method.name=cl into ncl-topk",
    }
    for overrides, start in cases.items():
        with pytest.warns(UserWarning) as record:
            build_config(overrides=list(overrides))
        assert [str(w.message) for w in record] == [
            f"{start}; its results are still labelled {overrides[0].split('=')[1]} "
            f"(use method.name={start.rsplit(' ', 1)[1]} if that is what you want)"
        ]


def _preset_of_by_hand(name: str, nonneg: str, topk: bool, gate: str) -> str:
    """The rule preset_of followed before the method registry: a gate makes a BayesNCL preset (the
    configured one if it is one, else by gate kind), else TopK ncl-topk, else φ ncl, else cl."""
    if gate != "none":
        if name in ("bayesncl", "bayesncl-gs"):
            return name
        return "bayesncl-gs" if gate == "gumbel" else "bayesncl"
    if topk:
        return "ncl-topk"
    return "cl" if nonneg == "identity" else "ncl"


def test_the_method_a_configuration_of_parts_is() -> None:
    info_nce_only = [n for n, m in METHODS.items() if m.terms == METHODS["cl"].terms]
    for name, nonneg, topk, gate in itertools.product(
        info_nce_only, ("identity", "relu", "rep_relu"), (False, True), ("none", "ste", "gumbel", "soft")
    ):
        method = MethodConfig(name=name, nonneg=nonneg, topk=topk, gate=gate)
        assert preset_of(method) == _preset_of_by_hand(name, nonneg, topk, gate), method
    # a method with other loss terms is the one of those terms whose parts agree (issue 25): a gate
    # switched on keeps it, φ moves it to its twin
    assert preset_of(MethodConfig(name="scl", nonneg="identity", gate="ste")) == "scl"
    assert preset_of(MethodConfig(name="scl", nonneg="rep_relu")) == "ncl-scl"
    assert preset_of(MethodConfig(name="nce", nonneg="identity", gate="ste")) == "ce"
    assert preset_of(MethodConfig(name="cl-l1", nonneg="relu")) == "ncl-l1"


def test_presets_come_from_the_method_specs() -> None:
    assert list(METHOD_PRESETS) == list(METHODS)
    for name, spec in METHODS.items():
        method = build_config(overrides={"method.name": name}).method
        assert (method.nonneg, method.topk, method.gate, method.gate_depth, method.detach) == (
            spec.nonneg, spec.topk, spec.gate, spec.gate_depth, spec.detach
        )
        assert (method.lam == 0.0) == ("kl" not in [t.name for t in methods.terms(method)])
        assert preset_of(method) == name


def test_a_warmup_longer_than_the_run_warns() -> None:
    with pytest.warns(UserWarning) as record:
        build_config(overrides=["train.epochs=4", "train.warmup_epochs=10"])
    assert [str(w.message) for w in record] == [
        "train.warmup_epochs=10 is more than train.epochs=4: the warmup is cut to the run's length, so the "
        "whole run warms up and the cosine decay never starts (set train.warmup_epochs < train.epochs)"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_config(overrides=["train.epochs=10", "train.warmup_epochs=10"])


@pytest.mark.parametrize("value", ["18446744073709551615", "9007199254740993", "-9223372036854775808"])
def test_large_integers_are_kept_exactly(value: str) -> None:
    """An integer is not passed through a float: seed=2**64-1 (the top of the range the seed check
    names) was refused as 'seed=18446744073709551616', and seed=2**53+1 silently became 2**53."""
    assert build_config(overrides=[f"seed={value}"]).seed == int(value)
    cfg = build_config()
    set_key(cfg, "seed", value)  # a string, as a quoted YAML value
    assert cfg.seed == int(value)
    assert build_config(overrides=["seed=1e3"]).seed == 1000  # a float that is an integer still works
    with pytest.raises(ConfigError, match=r"^seed=18446744073709551616: expected an integer from"):
        build_config(overrides=["seed=18446744073709551616"])
