"""pretrain's ``metrics.md`` says what its ``metrics.json`` holds, retrieval and NCL's map included
(issue 47, item 6c)."""

from __future__ import annotations

import json
from pathlib import Path

from bayesncl.app.evaluate import _retrieval_markdown
from bayesncl.app.train import pretrain
from bayesncl.config import build_config

from ..conftest import TINY


def test_retrieval_markdown_of_a_hand_made_result() -> None:
    result = {"retrieval": {"8": {"P@1": 50.0, "P@3": 40.0, "P@5": 30.0, "P@10": 20.0, "mAP@10": 12.345}},
              "ncl_map": {"8": 33.333}, "active_dims": 16}  # fmt: skip
    md = _retrieval_markdown(result)
    assert "| 8 | 50.00 | 40.00 | 30.00 | 20.00 | 12.35 |" in md
    assert "NCL's own retrieval map" in md and "| 8 | 33.33 |" in md
    assert _retrieval_markdown({"semantic_consistency": 1.0}) == ""
    assert _retrieval_markdown({"retrieval_note": "retrieval skipped"}) == "\n\nNote: retrieval skipped."


def test_pretrain_metrics_md_holds_the_json_retrieval(tmp_path: Path) -> None:
    cfg = build_config(overrides=[*TINY, "method.name=ncl", "eval.retrieval_dims=4,8"])
    pretrain(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    md = (tmp_path / "run" / "metrics.md").read_text()
    assert set(saved["retrieval"]) == {"4", "8"} and set(saved["ncl_map"]) == {"4", "8"}
    for k, row in saved["retrieval"].items():
        line = f"| {k} | " + " | ".join(f"{row[m]:.2f}" for m in ("P@1", "P@3", "P@5", "P@10", "mAP@10"))
        assert line in md
        assert f"| {k} | {saved['ncl_map'][k]:.2f} |" in md
