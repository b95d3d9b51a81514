"""The store's run names stay put: every study variant and recipe x method hashes as it did at
7c83712 (tests/paper/make_variant_hashes.py wrote the pins), so `runs/variants/` of earlier sessions is
still reused after refactors and after keys are added (variants.ADDED_KEYS)."""

from __future__ import annotations

import json

from tests.paper.make_variant_hashes import OUT, current


def test_variant_hashes_are_unchanged() -> None:
    pinned = json.loads(OUT.read_text())
    now = current()
    changed = sorted(k for k in pinned if now.get(k) != pinned[k])
    assert not changed, f"{len(changed)} of {len(pinned)} store names changed, e.g. {changed[:5]}"
