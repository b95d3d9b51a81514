"""The parts declare their own ``method.*`` keys (issue 45, item 3): each key is a ``Key`` (default,
help, check) of the method config (``COMMON_KEYS``) or of exactly one part (``PARTS``), and
``MethodConfig``'s fields, their defaults and types, the range checks, the "has no effect" warnings
and the ``--help`` list all come from those declarations."""

from __future__ import annotations

import dataclasses
import itertools
import typing
import warnings

import pytest

from bayesncl.config import ConfigError, build_config, valid_keys
from bayesncl.core import methods
from bayesncl.core.methods import KEYS, PARTS, Key, MethodConfig, Part
from bayesncl.core.methods import keys as keys_module
from bayesncl.core.methods.keys import COMMON_KEYS

# the method section's keys in config.yaml's order, as they were fields of MethodConfig before
FIELDS = (
    "name", "nonneg", "temperature", "topk", "gate", "gate_depth", "gate_hidden", "detach", "gate_lr",
    "gate_lr_ratio", "threshold", "gate_tau", "gumbel_noise", "rho", "lam", "ipw", "ipw_momentum", "ipw_eps",
)
DEFAULTS = {
    "name": "bayesncl", "nonneg": "rep_relu", "temperature": 0.2, "topk": False, "gate": "ste",
    "gate_depth": 2, "gate_hidden": 0, "detach": True, "gate_lr": 0.0, "gate_lr_ratio": 0.25,
    "threshold": 0.5, "gate_tau": 1.0, "gumbel_noise": "gumbel", "rho": 0.8, "lam": 3e-5, "ipw": False,
    "ipw_momentum": 0.99, "ipw_eps": 0.01,
}
SWITCHES = ("topk", "gate", "ipw")


def test_the_method_configs_fields_are_the_declared_keys_in_their_old_order() -> None:
    assert tuple(KEYS) == FIELDS
    assert [f.name for f in dataclasses.fields(MethodConfig)] == [*FIELDS, "own"]
    hints = typing.get_type_hints(MethodConfig)
    m = MethodConfig()
    for name, key in KEYS.items():
        assert getattr(m, name) == key.default == DEFAULTS[name], name
        assert hints[name] is type(DEFAULTS[name]), name
        assert key.help, f"method.{name} has no help"
    assert m.own == {} and MethodConfig.__module__ == "bayesncl.core.methods.keys"


def test_each_key_is_declared_once_by_the_method_config_or_by_one_part() -> None:
    owners = {name: ["method"] for name in COMMON_KEYS}
    for part_name, part in PARTS.items():
        for name in part.keys:
            owners.setdefault(name, []).append(part_name)
    assert {k: len(v) for k, v in owners.items()} == dict.fromkeys(FIELDS, 1)
    assert {p: part.switch for p, part in PARTS.items() if part.switch} == {"topk": "topk", "gate": "gate",
                                                                          "ipw": "ipw"}
    assert PARTS["topk"].settings() == ("rho",)  # TopK reads the prior's rho
    assert PARTS["gate"].settings() == ("gate_depth", "gate_hidden", "detach", "gate_lr", "gate_lr_ratio",
                                        "threshold", "gate_tau")
    assert PARTS["prior"].terms == (methods.KL,) and PARTS["prior"].settings() == ("rho", "lam")


def test_a_part_declaring_a_key_twice_or_reading_an_undeclared_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    new = Part(lambda m: True, {"drop_p": Key(0.1, "dropout on z", lambda v: 0 <= v < 1, "0 <= p < 1")})
    monkeypatch.setitem(PARTS, "dropout", new)
    assert list(keys_module._keys())[-1] == "drop_p"  # a new part's key: one more field, after the others
    monkeypatch.setitem(PARTS, "dropout", Part(lambda m: True, {"rho": Key(0.5)}))
    with pytest.raises(ValueError, match=r"^part 'dropout': method.rho is declared twice$"):
        keys_module._keys()
    monkeypatch.setitem(PARTS, "dropout", Part(lambda m: True, reads=("drop_q",)))
    with pytest.raises(ValueError, match=r"^part 'dropout': it reads method.drop_q, which nothing declares$"):
        keys_module._keys()


def test_every_checked_key_refuses_a_bad_value_with_its_declared_expectation() -> None:
    bad = {"temperature": 100.0, "gate_depth": 4, "gate_hidden": -1, "gate_lr": -1.0, "gate_lr_ratio": -1.0,
           "threshold": 1.0, "gate_tau": 0.0, "rho": 1.5, "lam": -1.0, "ipw_momentum": 1.0, "ipw_eps": 0.0}
    assert {k for k, key in KEYS.items() if key.check is not None} == set(bad)
    for name, value in bad.items():
        assert KEYS[name].check(KEYS[name].default)  # the default passes its own check
        with pytest.raises(ConfigError) as e:
            build_config(overrides=[f"method.{name}={value}"])
        assert str(e.value) == f"method.{name}={value!r}: expected {KEYS[name].expected}"
    with pytest.raises(ConfigError, match=r"^method.gate_depth=4: expected 1, 2 or 3$"):
        build_config(overrides=["method.gate_depth=4"])


def test_a_parts_own_check_runs_only_where_the_config_has_the_part() -> None:
    tiny = ["model.proj_hidden=1", "method.gate_depth=3"]
    with pytest.raises(ConfigError, match=r"^method.gate_depth=3: the gate's hidden width is 1 "):
        build_config(overrides=tiny)
    build_config(overrides=["method.name=ncl", *tiny], warn_inert=False)  # no gate: its check does not run
    with pytest.raises(ConfigError, match=r"^TopK k=round\(rho\*D\)=0 with rho=0.01, D=16"):
        build_config(overrides=["method.name=ncl-topk", "method.rho=0.01", "model.proj_dim=16"])
    build_config(overrides=["method.name=ncl", "method.rho=0.01", "model.proj_dim=16"], warn_inert=False)


def test_switches_are_always_read_and_the_other_keys_only_with_their_part() -> None:
    for gate, topk, ipw in itertools.product(("none", "ste", "gumbel", "soft"), (False, True), (False, True)):
        m = MethodConfig(gate=gate, topk=topk, ipw=ipw)
        unread = methods.unread_keys(m)
        assert not unread & {*SWITCHES, *COMMON_KEYS}
        assert ("lam" in unread) == (gate == "none") and ("gumbel_noise" in unread) == (gate != "gumbel")
        assert ("rho" in unread) == (gate == "none" and not topk)
        assert ({"ipw_momentum", "ipw_eps"} <= unread) == (not ipw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_config(overrides=["method.name=ncl", "method.gate=none", "method.topk=false",
                                "method.ipw=false"])
    with pytest.warns(UserWarning, match=r"^method.lam, method.gate_tau have no effect with method.name=cl "):
        build_config(overrides=["method.name=cl", "method.lam=0.1", "method.gate_tau=2"])


def test_the_part_keys_are_fields_replace_and_attribute_access_keep_working() -> None:
    cfg = build_config(overrides=["method.name=bayesncl", "method.rho=0.3"])
    assert cfg.method.rho == 0.3 and cfg.method.gate == "ste" and cfg.to_dict()["method"]["rho"] == 0.3
    other = dataclasses.replace(cfg.method, rho=0.6, gate="none")
    assert (other.rho, other.gate, other.lam, cfg.method.rho) == (0.6, "none", cfg.method.lam, 0.3)
    assert {f"method.{k}" for k in KEYS} <= set(valid_keys())
    with pytest.raises(AttributeError, match="method has no key 'bogus'"):
        _ = cfg.method.bogus
