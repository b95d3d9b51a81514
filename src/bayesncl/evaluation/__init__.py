"""Evaluation of frozen features: interpretability metrics, retrieval, kNN and linear probes.

All functions read plain arrays (or a features file through :func:`load_features`); every bad
input raises :class:`EvalError` (a ``ValueError``) with a one-line message. Definitions, units and
sources: docs/metrics.md.
"""

from .io import (
    EvalError,
    EvalWarning,
    FeatureSet,
    load_features,
    save_features,
    validate_features,
)
from .knn import knn_accuracy
from .metrics import (
    METRIC_KEYS,
    activation_ratio,
    active_dims,
    compute_all,
    effective_rank,
    format_metrics_table,
    metrics_command,
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
from .probe import feature_selection_probe, linear_probe
from .retrieval import expected_activation, rank_dims, retrieval_metrics, select_top_dims

__all__ = [
    "METRIC_KEYS",
    "EvalError",
    "EvalWarning",
    "FeatureSet",
    "activation_ratio",
    "active_dims",
    "compute_all",
    "effective_rank",
    "expected_activation",
    "feature_selection_probe",
    "format_metrics_table",
    "knn_accuracy",
    "linear_probe",
    "load_features",
    "metrics_command",
    "orthogonality",
    "rank_dims",
    "retrieval_metrics",
    "save_features",
    "select_top_dims",
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
    "validate_features",
]
