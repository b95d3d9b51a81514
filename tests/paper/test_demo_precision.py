"""The demo trains at ``train.precision=auto`` (issue 46.4); the recipe stays fp32, so the stored
runs of the studies that train from it keep their names, and ``demo train.precision=fp32`` is the
former demo's config exactly (its digits)."""

from __future__ import annotations

import json

import pytest
import torch

from bayesncl.config import build_config
from bayesncl.core import optim
from bayesncl.paper.demo import DEMO_CONFIG, DEMO_METHODS, demo_configs
from bayesncl.paper.variants import variant_hash
from tests.paper.make_variant_hashes import OUT


@pytest.mark.parametrize("native", [None, "AVX512-BF16"])
def test_demo_is_auto_and_its_fp32_override_is_the_recipe(monkeypatch: pytest.MonkeyPatch, native) -> None:
    monkeypatch.setattr(optim, "native_cpu_bf16", lambda flags=None: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pinned = json.loads(OUT.read_text())
    assert build_config(DEMO_CONFIG).train.precision == "fp32"  # the recipe the studies train from
    auto, fp32 = demo_configs([]), demo_configs(["train.precision=fp32", "data.train_subset=20000"])
    for m in DEMO_METHODS:
        recipe = build_config(DEMO_CONFIG, [f"method.name={m}"])
        assert (auto[m].train.precision, auto[m].data.train_subset) == ("auto", 12000)
        assert fp32[m] == recipe  # the former demo, key for key
        assert variant_hash(fp32[m]) == pinned[f"fashion-mnist-demo/{m}"]
        # auto is a run of its own: held as "auto" (fp32 here) or "auto:bf16", never the fp32 name
        assert variant_hash(auto[m]) != pinned[f"fashion-mnist-demo/{m}"]
