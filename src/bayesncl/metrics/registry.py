"""The metric registry: one row per metric of PAPER-NOTES §3, the only place naming its JSON key,
labels, unit and formats; :func:`compute_all`, :data:`METRIC_KEYS`, :func:`format_metrics_table` and
:func:`column` read it. A new metric: its function ``fn(features, labels)`` and a row with
``value=lambda s: fn(s.f, s.y)`` (rows of metrics that share work read it from :class:`Shared`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from .inputs import needs_labels, validate_features, warn_degenerate
from .ncl_retrieval import DEPTH, ncl_map
from .retrieval import check_dims, retrieval_metrics
from .semantic import SemanticStats, undefined_note
from .spectral import active_mask, spectrum

__all__ = [
    "BACKGROUND_METRICS", "FACTOR_METRICS", "METRICS", "METRIC_KEYS", "Metric", "Shared", "column",
    "compute_all",
    "format_metrics_table",
]

NO_ACTIVE_NOTE = "no active dimensions"


class Shared:
    """Validated features ``f`` (N, D), labels ``y`` (N,) and their (D,) ``active`` dims, with the
    intermediates several metrics share, each computed on first use."""

    def __init__(self, f: torch.Tensor, y: torch.Tensor) -> None:
        self.f, self.y = f, y
        self.active = active_mask(f)
        self.n_active = int(self.active.sum())

    @cached_property
    def semantic(self) -> SemanticStats:
        return SemanticStats.from_features(self.f, self.y)

    @cached_property
    def summary(self) -> tuple[dict[str, float], list[str]]:
        """:meth:`SemanticStats.summary`: the semantic values and the keys without a dimension."""
        return self.semantic.summary()

    @cached_property
    def cluster_entropy(self) -> float | None:
        """NCL's cluster entropy (:meth:`SemanticStats.cluster_entropy_per_dim`'s mean); None where no
        dim qualifies."""
        vals = self.semantic.cluster_entropy_per_dim()
        kept = vals[~np.isnan(vals)]
        return float(kept.mean()) if kept.size else None

    @cached_property
    def spectrum(self) -> tuple[float, float]:
        """``(spectral entropy, orthogonality error)``, see :func:`bayesncl.metrics.spectral.spectrum`."""
        return spectrum(self.f, self.active)


@dataclass(frozen=True)
class Metric:
    """One metric: its JSON ``key``; ``label``, ``unit`` and ``fmt`` for :func:`format_metrics_table`;
    ``short`` and ``short_fmt`` for the results tables' column; ``value`` computes it from
    :class:`Shared`."""

    key: str
    label: str
    unit: str
    fmt: str
    short: str
    short_fmt: str
    value: Callable[[Any], float | None]

    def text(self, value: Any) -> str:
        """``value`` formatted with :attr:`fmt` (an integer format takes ``int(value)``; None is "n/a")."""
        if value is None:
            return "n/a"
        return self.fmt.format(int(value) if self.fmt == "{:d}" else float(value))


#: Every metric of :func:`compute_all`, in the order of its keys.
METRICS = (
    Metric("semantic_consistency", "Semantic consistency (SC)", "%", "{:.2f}", "SC %", "{:.2f}",
           lambda s: s.summary[0]["semantic_consistency"]),
    Metric("semantic_entropy_sum", "Semantic entropy H_sum", "nats", "{:.4f}", "H_sum", "{:.3f}",
           lambda s: s.summary[0]["semantic_entropy_sum"]),
    Metric("semantic_entropy_mean", "Semantic entropy H_mean", "nats", "{:.4f}", "H_mean", "{:.3f}",
           lambda s: s.summary[0]["semantic_entropy_mean"]),
    Metric("semantic_entropy_freq", "Semantic entropy H_freq", "nats", "{:.4f}", "H_freq", "{:.3f}",
           lambda s: s.summary[0]["semantic_entropy_freq"]),
    Metric("cluster_entropy", "Cluster entropy (NCL's main_eval)", "nats", "{:.4f}", "clu. ent", "{:.3f}",
           lambda s: s.cluster_entropy or 0.0),
    Metric("active_dims", "Active dims", "count", "{:d}", "active", "{:d}", lambda s: s.n_active),
    Metric("activation_ratio", "Activation ratio (Act.)", "fraction", "{:.4f}", "Act.", "{:.3f}",
           lambda s: s.n_active / s.f.shape[1]),
    Metric("sparsity", "Sparsity", "fraction", "{:.4f}", "sparsity", "{:.3f}",
           lambda s: 1.0 - s.semantic.firing_entries() / s.f.numel()),
    Metric("nonneg_ratio", "Non-negative entries (NCL's non_neg_ratio)", "fraction", "{:.4f}", "non-neg",
           "{:.3f}", lambda s: int((s.f >= 0).sum()) / s.f.numel()),
    Metric("effective_rank", "Effective rank exp(H_spectral)", "dims", "{:.2f}", "eff. rank", "{:.2f}",
           lambda s: math.exp(s.spectrum[0]) if s.n_active else 0.0),
    Metric("orthogonality", "Orthogonality error", "mean abs cos", "{:.4f}", "ortho.", "{:.3f}",
           lambda s: s.spectrum[1]),
)  # fmt: skip

#: The background metrics (docs/metrics.md, "Background metrics"): their ``value`` takes a
#: :class:`bayesncl.metrics.background.BackgroundShared` (features with places); computed by
#: :func:`bayesncl.metrics.background.background_metrics`, not by :func:`compute_all`.
BACKGROUND_METRICS = (
    Metric("background_dims_fraction", "Background dims (of active)", "fraction", "{:.4f}", "bg dims",
           "{:.3f}", lambda s: s.kind_fraction(1)),
    Metric("object_dims_fraction", "Object dims (of active)", "fraction", "{:.4f}", "obj dims", "{:.3f}",
           lambda s: s.kind_fraction(0)),
    Metric("background_mass_fraction", "Activation mass on background dims", "fraction", "{:.4f}",
           "bg mass", "{:.3f}", lambda s: s.mass_fraction(1)),
    Metric("class_lift_mean", "Class lift (mean over active dims)", "[0, 1]", "{:.4f}", "class lift",
           "{:.3f}", lambda s: _nanmean(s.lifts[0])),
    Metric("place_lift_mean", "Place lift (mean over active dims)", "[0, 1]", "{:.4f}", "place lift",
           "{:.3f}", lambda s: _nanmean(s.lifts[1])),
    Metric("gate_closure_background", "Gate closure on background dims", "fraction", "{:.4f}", "closed bg",
           "{:.3f}", lambda s: s.closure[0]),
    Metric("gate_closure_object", "Gate closure on object dims", "fraction", "{:.4f}", "closed obj", "{:.3f}",
           lambda s: s.closure[1]),
)  # fmt: skip


#: The factor metrics (docs/metrics.md, "MIG"): computed by
#: :func:`bayesncl.metrics.disentanglement.factor_metrics` for features with ``factors`` (dSprites);
#: ``value`` takes that function's dict.
FACTOR_METRICS = (
    Metric("mig", "Mutual information gap (MIG)", "[0, 1]", "{:.4f}", "MIG", "{:.3f}", lambda r: r["mig"]),
)  # fmt: skip


def _nanmean(values: Any) -> float:
    kept = values[np.isfinite(values)]
    return float(kept.mean()) if kept.size else 0.0


#: The metrics of the NCL code that the BayesNCL paper's tables do not report (docs/metrics.md):
#: Tables 9/10 ("every metric of Table 1") leave them out.
NCL_CODE_METRICS: tuple[str, ...] = ("cluster_entropy", "nonneg_ratio")

#: The keys of :func:`compute_all`, in order (``retrieval`` and ``note`` are added when present).
METRIC_KEYS = tuple(m.key for m in METRICS)
_BY_KEY = {m.key: m for m in (*METRICS, *BACKGROUND_METRICS, *FACTOR_METRICS)}


def column(key: str) -> tuple[str, str, str]:
    """``(header, key, format)`` of a metric for :func:`bayesncl.app.report.format_table`."""
    m = _BY_KEY[key]
    return m.short, m.key, m.short_fmt


def compute_all(
    features: Any, labels: Any, retrieval_dims: int | Iterable[int] | None = None
) -> dict[str, Any]:
    """Every metric of :data:`METRICS` (PAPER-NOTES §3) as a JSON-ready dict.

    Keys: the nine :data:`METRIC_KEYS`; ``retrieval`` (``{"<K>": {"P@1", "P@3", "P@5", "P@10",
    "mAP@10"}}``, percent) and ``ncl_map`` (``{"<K>": NCL's own retrieval map}``, percent,
    :mod:`bayesncl.metrics.ncl_retrieval`; with more than 10 samples) when ``retrieval_dims`` (one K or
    a sequence) is given; ``note`` only
    for degenerate input: ``"no active dimensions"`` (all-zero features: SC, entropies, effective
    rank and orthogonality are 0.0) or ``"no dimension qualifies for <keys>; reported as 0.0"``
    (e.g. every entry is <= 1e-5, so H_freq has no dimension to average), instead of undefined
    values; the note is also issued as an EvalWarning. Raises EvalError for bad input.
    """
    needs_labels(labels, "compute_all")
    f, y = validate_features(features, labels)
    if retrieval_dims is not None:
        retrieval_dims = check_dims(retrieval_dims, f.shape[1])
    shared = Shared(f, y)  # type: ignore[arg-type]
    out: dict[str, Any] = {m.key: m.value(shared) for m in METRICS}
    if retrieval_dims is not None:
        out["retrieval"] = retrieval_metrics(f, y, dims=retrieval_dims)
        if f.shape[0] > DEPTH:
            out["ncl_map"] = {str(k): ncl_map(f, y, k) for k in retrieval_dims}
    undefined = [*shared.summary[1], *(["cluster_entropy"] if shared.cluster_entropy is None else [])]
    note = NO_ACTIVE_NOTE if shared.n_active == 0 else (undefined_note(undefined) if undefined else None)
    if note is not None:
        out["note"] = note
        warn_degenerate(f"compute_all: {note}")
    return out


def format_metrics_table(result: dict[str, Any]) -> str:
    """Render :func:`compute_all` output (and ``bayesncl metrics``' ``source``) as a Markdown table."""
    lines: list[str] = []
    src = result.get("source")
    if isinstance(src, dict):
        extra = ", ".join(f"{k}={src[k]}" for k in ("method", "dataset", "split") if k in src)
        extra = f", {extra}" if extra else ""
        lines += [f"Features: {src.get('path')} (N={src.get('num_samples')}, D={src.get('dim')}{extra})", ""]
    lines += ["| metric | value | unit |", "|---|---:|---|"]
    rows = (*METRICS, *BACKGROUND_METRICS, *FACTOR_METRICS)
    lines += [f"| {m.label} | {m.text(result[m.key])} | {m.unit} |" for m in rows if m.key in result]
    if "background_probe_acc1" in result:
        lines.append(f"| Background probe (place) | {float(result['background_probe_acc1']):.2f} | % |")
    retrieval = result.get("retrieval")
    if retrieval:
        cols = list(next(iter(retrieval.values())).keys())
        lines += ["", "Retrieval (top-K dims by expected activation, percent):", ""]
        lines.append("| K | " + " | ".join(cols) + " |")
        lines.append("|---:|" + "---:|" * len(cols))
        for k, row in retrieval.items():
            lines.append(f"| {k} | " + " | ".join(f"{float(row[c]):.2f}" for c in cols) + " |")
    if result.get("ncl_map"):
        lines += ["", "NCL's own retrieval map (main_eval.py: Euclidean, no re-normalisation), percent:", ""]
        lines += ["| K | NCL map |", "|---:|---:|"]
        lines += [f"| {k} | {float(v):.2f} |" for k, v in result["ncl_map"].items()]
    if "mig_per_factor" in result:
        per = ", ".join(f"{k} {float(v):.3f}" for k, v in result["mig_per_factor"].items())
        lines += ["", f"MIG per factor ({result.get('mig_bins', 20)} bins): {per}"]
    if "note" in result:
        lines += ["", f"Note: {result['note']}."]
    return "\n".join(lines)
