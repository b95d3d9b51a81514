"""The committed store's runs keep their names and their configs (issue 45, item 3: the parts declare
their own ``method.*`` keys, and ``MethodConfig`` is built from those declarations): every
``results/long-store/variants/HASH/config.yaml`` loads, as a run's config is loaded
(``runs.export.load_run_config``), to a config whose ``variant_hash`` is its folder's name ``HASH``
(the store names a run by it: ``paper.variants.variant_hash``), and whose resolved values are the
file's. Every committed run trained at ``train.precision=fp32``, so its name is the same on any machine
(``auto`` would resolve by the CPU: tests/paper/test_variant_hashes.py)."""

from __future__ import annotations

import warnings

import pytest
import yaml

from bayesncl.config import flatten
from bayesncl.paper.variants import ADDED_KEYS, variant_hash
from bayesncl.runs.export import load_run_config

from ..conftest import ROOT

STORE = ROOT / "results" / "long-store" / "variants"
RUNS = sorted(p.parent for p in STORE.glob("*/config.yaml"))


def test_the_committed_store_has_runs_of_several_methods() -> None:
    methods = {yaml.safe_load((run / "config.yaml").read_text())["method"]["name"] for run in RUNS}
    assert len(RUNS) >= 50 and {"cl", "ncl", "bayesncl", "ncl-ipw", "ncl-topk"} <= methods


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_a_stored_runs_config_loads_to_its_name_and_its_values(run) -> None:
    saved = flatten(yaml.safe_load((run / "config.yaml").read_text()))
    assert saved["train.precision"] == "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a reload warns about nothing
        cfg = load_run_config(run)
    assert variant_hash(cfg) == run.name
    now = flatten(cfg.to_dict())
    # keys added since keep their defaults (ADDED_KEYS); a string key written as a YAML bool
    # (train.compile: false) reads as its string
    differ = {k: (v, now.get(k)) for k, v in saved.items()
              if now.get(k) != (str(v).lower() if isinstance(v, bool) and isinstance(now.get(k), str) else v)}
    assert not differ
    # the method section: the file's keys and values, and no other key but one added since at its old value
    added = {k: v for k, v in now.items() if k.startswith("method.") and k not in saved}
    assert all(k in ADDED_KEYS and ADDED_KEYS[k] == v for k, v in added.items()), added
