"""Public metrics API: one function per metric, named as the keys of :func:`compute_all`.

>>> from bayesncl.metrics import compute_all, semantic_consistency
>>> compute_all(features, labels, retrieval_dims=[64])  # doctest: +SKIP

Definitions, units, edge cases and sources: docs/metrics.md. The implementations live in
:mod:`bayesncl.metrics`.
"""

from bayesncl.metrics.inputs import EvalError, EvalWarning
from bayesncl.metrics.interpretability import (
    METRIC_KEYS,
    activation_ratio,
    active_dims,
    compute_all,
    effective_rank,
    format_metrics_table,
    orthogonality,
    semantic_consistency,
    semantic_consistency_per_dim,
    semantic_entropy_freq,
    semantic_entropy_mean,
    semantic_entropy_sum,
    semantic_metrics,
    sepin_at_k,
    sepin_scores,
    sparsity,
    spectral_entropy,
)
from bayesncl.metrics.knn import knn_accuracy
from bayesncl.metrics.probe import feature_selection_probe, linear_probe
from bayesncl.metrics.retrieval import retrieval_metrics

__all__ = [
    "METRIC_KEYS",
    "EvalError",
    "EvalWarning",
    "activation_ratio",
    "active_dims",
    "compute_all",
    "effective_rank",
    "feature_selection_probe",
    "format_metrics_table",
    "knn_accuracy",
    "linear_probe",
    "orthogonality",
    "retrieval_metrics",
    "semantic_consistency",
    "semantic_consistency_per_dim",
    "semantic_entropy_freq",
    "semantic_entropy_mean",
    "semantic_entropy_sum",
    "semantic_metrics",
    "sepin_at_k",
    "sepin_scores",
    "sparsity",
    "spectral_entropy",
]
