"""The authors' spellings of φ and the gate (issue 47, item 6b): ``method.nonneg=leakyrelu``,
``non_neg: None`` and ``gate_type: STE`` read as our names, wherever a config is read (command line,
a config file, a run's saved config), through the one table ``bayesncl.config.parse.VALUE_ALIASES``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayesncl.config import ConfigError, build_config
from bayesncl.config.parse import VALUE_ALIASES, canonical
from bayesncl.core.parts import GATE_KINDS, NONNEG


@pytest.mark.filterwarnings("ignore:method.nonneg=")  # φ = identity turns ncl into cl: said, not tested here
@pytest.mark.parametrize(("given", "ours"), [
    ("leakyrelu", "leaky_relu"), ("None", "identity"), ("none", "identity"), ("null", "identity"),
    ("relu", "relu"), ("rep_relu", "rep_relu"), ("leaky_relu", "leaky_relu"),
])  # fmt: skip
def test_nonneg_takes_the_authors_names(given: str, ours: str) -> None:
    cfg = build_config(overrides=["method.name=ncl", f"method.nonneg={given}"], warn_inert=False)
    assert cfg.method.nonneg == ours


def test_gate_takes_the_authors_names_and_a_file_and_a_saved_config_too(tmp_path: Path) -> None:
    assert build_config(overrides=["method.gate=STE"]).method.gate == "ste"
    assert build_config(overrides=["method.gate=gumbel_sigmoid"]).method.gate == "gumbel"
    recipe = tmp_path / "theirs.yaml"
    recipe.write_text("method:\n  name: ncl\n  nonneg: leakyrelu\n")
    assert build_config(recipe).method.nonneg == "leaky_relu"
    saved = build_config(overrides=["method.name=ncl"]).to_dict()
    saved["method"]["nonneg"] = None  # YAML's null, as their `non_neg:` left empty
    assert build_config(saved).method.nonneg == "identity"


def test_every_alias_names_one_of_our_values_and_others_stay_refused() -> None:
    assert set(VALUE_ALIASES["method.nonneg"].values()) <= set(NONNEG)
    assert set(VALUE_ALIASES["method.gate"].values()) <= set(GATE_KINDS)
    # the authors' supported_non_neg_list (solo/methods/simclr.py): every entry reads as one of ours
    for theirs in ("None", "relu", "rep_relu", "gelu", "sigmoid", "softplus", "exp", "leakyrelu"):
        assert canonical("method.nonneg", theirs) in NONNEG, theirs
    assert canonical("method.nonneg", None) == "identity"
    assert canonical("method.gate", "STE") == "ste" and canonical("method.gate", "gumbel_sigmoid") == "gumbel"
    assert canonical("method.rho", "None") == "None" and canonical("method.nonneg", True) is True
    with pytest.raises(ConfigError, match="method.nonneg='LeakyReLU': expected one of identity"):
        build_config(overrides=["method.nonneg=LeakyReLU"])
