"""Tables of results: Markdown for people, JSON for machines."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bayesncl.metrics import column
from bayesncl.runs.fileio import atomic_path

# (column header, metrics key, format)
MAIN_COLUMNS: list[tuple[str, str, str]] = [
    *map(column, ("semantic_consistency", "semantic_entropy_sum", "semantic_entropy_mean")),
    *map(column, ("semantic_entropy_freq", "activation_ratio")), ("LP@1", "linear_probe_acc1", "{:.2f}"),
]


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return fmt.format(value)


def format_table(
    results: dict[str, dict[str, Any]], columns: list[tuple[str, str, str]] | None = None
) -> str:
    """One Markdown row per method: ``results = {method: metrics dict}``."""
    cols = columns or MAIN_COLUMNS
    head = "| method | " + " | ".join(c[0] for c in cols) + " |"
    sep = "|---|" + "---:|" * len(cols)
    rows = [
        f"| {name} | " + " | ".join(_fmt(m.get(key), fmt) for _, key, fmt in cols) + " |"
        for name, m in results.items()
    ]
    return "\n".join([head, sep, *rows])


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def _json_ready(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None: strict JSON has no NaN token."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as strict JSON to ``path`` atomically: NumPy scalars as numbers, NaN as null."""
    ready = _json_ready(json.loads(json.dumps(value, default=float)))  # NumPy scalars -> floats first
    write_text_atomic(path, json.dumps(ready, indent=2, allow_nan=False) + "\n")


def write_results(out_dir: Path, stem: str, results: dict[str, Any], markdown: str, header: str = "") -> None:
    """Write ``stem.json`` and ``stem.md`` into ``out_dir`` (atomically). The JSON is strict: an
    undefined value (NaN, e.g. a correlation of ``dynamics``) is ``null`` there, ``nan`` in the
    Markdown."""
    write_json(out_dir / f"{stem}.json", results)
    write_text_atomic(out_dir / f"{stem}.md", (header + "\n\n" if header else "") + markdown + "\n")


def format_retrieval(retrieval: dict[str, dict[str, float]], active: int | None = None) -> str:
    """Markdown table of retrieval with feature selection: one row per K (PAPER-NOTES §3), in %.

    ``active``: the number of active dims. Every K above it selects the same dims (all active
    ones plus dims that are zero on every image), so its row repeats K = ``active``'s: such rows
    are marked ``K*`` and a note under the table says so."""
    keys = ("P@1", "P@3", "P@5", "P@10", "mAP@10")
    head = "| K | " + " | ".join(keys) + " |\n|---:|" + "---:|" * len(keys)
    over = [k for k in retrieval if active is not None and int(k) > active]
    rows = [
        f"| {k}{'*' if k in over else ''} | " + " | ".join(f"{v[m]:.2f}" for m in keys) + " |"
        for k, v in retrieval.items()
    ]
    note = (
        [f"\n\\* K exceeds the {active} active dims: the same dims as K = {active}, so the same values."]
        if over
        else []
    )
    return "\n".join([head, *rows, *note])
