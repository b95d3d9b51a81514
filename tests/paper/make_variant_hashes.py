"""Writes tests/fixtures/variant_hashes.json: the store names (variant hashes) of every study variant of
every dataset at seeds 0 and 1, and of every shipped recipe x method. Run once at a commit whose
names are to be kept (7c83712); tests/paper/test_variant_hashes.py checks that they still hold. Since
``train.precision=auto`` means bf16 on a CPU with native bf16 (issue 23), the pins are the names on a
CPU without it (``auto`` held as ``auto``): write them with ``native_cpu_bf16`` returning None there."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

from bayesncl.config import Config, ConfigError, build_config
from bayesncl.paper import reproduce, studies, variants

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "variant_hashes.json"
METHODS = ("cl", "ncl", "ncl-topk", "bayesncl", "bayesncl-gs", "ncl-ipw")


def current() -> dict[str, str]:
    """``{key: variant hash}`` of every config :func:`configs` lists."""
    cfgs = configs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {key: variants.variant_hash(cfg) for key, cfg in cfgs.items()}


def configs() -> dict[str, Config]:
    """``{key: config}``: every study variant of every dataset at seeds 0 and 1, and every shipped
    recipe x method (the keys of the pinned names)."""
    out: dict[str, Config] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dataset in ("fashion-mnist", "cifar10", "cifar100", "imagenet100"):
            for sid in ("1", "2", "3", "4", "5", "7", "15", "fig3", "fig4a", "fig4b", "ncl-fs", "ncl-sepin"):
                study = studies.build(sid, dataset, [])
                for v in study.variants:  # one at a time: a few variants do not build on every dataset
                    one = dataclasses.replace(study, variants=[v])
                    try:
                        cfgs = reproduce.study_configs(one, dataset, [], 2)
                    except ConfigError:
                        continue
                    for (name, seed), cfg in cfgs.items():
                        out[f"{dataset}/{sid}/{name}/s{seed}"] = cfg
        for recipe in sorted(studies.RECIPES.glob("*.yaml")):
            for m in METHODS:
                out[f"{recipe.stem}/{m}"] = build_config(recipe, [f"method.name={m}"])
    return out


if __name__ == "__main__":
    from bayesncl.core import optim

    optim.native_cpu_bf16 = lambda flags=None: None  # the fp32 names: `auto` held as `auto`
    OUT.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(current())} hashes")
