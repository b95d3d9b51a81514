"""The store's run names stay put: every study variant and recipe x method hashes as it did at
7c83712 (tests/paper/make_variant_hashes.py wrote the pins), so `runs/variants/` of earlier sessions is
still reused after refactors and after keys are added (variants.ADDED_KEYS).

``train.precision=auto`` resolves by the machine (issue 23): on a CPU with native bf16 it is bf16
autocast, held as ``auto:bf16``, a run of its own. The pins are the fp32 names (``auto`` held as
``auto``), so the detection is forced here both ways: the test passes on any CPU, with or without
AVX512-BF16, and on a machine with CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from bayesncl.core import optim
from tests.paper.make_variant_hashes import OUT, configs, current


def _machine(monkeypatch: pytest.MonkeyPatch, native: str | None) -> None:
    """A CPU-only machine whose CPU computes bf16 natively (``native``) or not (None)."""
    monkeypatch.setattr(optim, "native_cpu_bf16", lambda flags=None: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_variant_hashes_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, None)
    pinned = json.loads(OUT.read_text())
    now = current()
    changed = sorted(k for k in pinned if now.get(k) != pinned[k])
    assert not changed, f"{len(changed)} of {len(pinned)} store names changed, e.g. {changed[:5]}"


def test_on_a_native_bf16_cpu_exactly_the_auto_runs_get_new_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where ``auto`` is bf16, every config at ``train.precision=auto`` is another run than its fp32
    pin (a bf16 run is never reused for an fp32 one), and every config at an explicit precision
    (the demo recipe's fp32) keeps its pinned name."""
    from bayesncl.paper.variants import variant_hash

    _machine(monkeypatch, "AVX512-BF16")
    pinned = json.loads(OUT.read_text())
    cfgs = {k: c for k, c in configs().items() if k in pinned}  # recipes added since have no pin
    auto = {k for k, c in cfgs.items() if c.train.precision == "auto"}
    assert auto and auto != set(cfgs)  # both kinds are pinned
    kept = sorted(k for k in auto if variant_hash(cfgs[k]) == pinned[k])
    moved = sorted(k for k in set(cfgs) - auto if variant_hash(cfgs[k]) != pinned[k])
    assert not kept and not moved, (kept[:5], moved[:5])
