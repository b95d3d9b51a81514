"""Public metrics API: one function per metric, named as the keys of :func:`compute_all`.

>>> from bayesncl.metrics import compute_all, semantic_consistency
>>> compute_all(features, labels, retrieval_dims=[64])  # doctest: +SKIP

Definitions, units, edge cases and sources: docs/metrics.md. :data:`METRICS` (module
:mod:`bayesncl.metrics.registry`) holds every metric's key, labels, unit and format.
"""

from bayesncl.metrics.inputs import EvalError, EvalWarning
from bayesncl.metrics.knn import knn_accuracy
from bayesncl.metrics.probe import feature_selection_probe, linear_probe, probe_columns, selection_probes
from bayesncl.metrics.registry import METRIC_KEYS, METRICS, Metric, column, compute_all, format_metrics_table
from bayesncl.metrics.retrieval import retrieval_metrics
from bayesncl.metrics.semantic import (
    cluster_entropy,
    semantic_consistency,
    semantic_consistency_per_dim,
    semantic_entropy_freq,
    semantic_entropy_mean,
    semantic_entropy_sum,
    semantic_metrics,
)
from bayesncl.metrics.sepin import (
    sepin_at_k,
    sepin_input_at_k,
    sepin_input_scores,
    sepin_label_at_k,
    sepin_label_scores,
    sepin_scores,
    sepin_top_k,
)
from bayesncl.metrics.spectral import (
    activation_ratio,
    active_dims,
    effective_rank,
    nonneg_ratio,
    orthogonality,
    sparsity,
    spectral_entropy,
)

__all__ = [
    "METRICS", "METRIC_KEYS", "EvalError", "EvalWarning", "Metric", "activation_ratio", "active_dims",
    "cluster_entropy", "column", "compute_all", "effective_rank", "feature_selection_probe",
    "format_metrics_table", "knn_accuracy", "linear_probe", "nonneg_ratio", "orthogonality", "probe_columns",
    "retrieval_metrics",
    "selection_probes", "semantic_consistency", "semantic_consistency_per_dim", "semantic_entropy_freq",
    "semantic_entropy_mean", "semantic_entropy_sum", "semantic_metrics", "sepin_at_k", "sepin_input_at_k",
    "sepin_input_scores", "sepin_label_at_k", "sepin_label_scores", "sepin_scores", "sepin_top_k", "sparsity",
    "spectral_entropy",
]
