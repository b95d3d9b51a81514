"""Input checks shared by every metric: features (N, D) and labels (N,) in, CPU tensors out.

Every problem with the input is an :class:`EvalError` (a ``ValueError``) with one line that says
what was found; a metric evaluated on degenerate input returns its documented fallback value with
an :class:`EvalWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

__all__ = [
    "EvalError", "EvalWarning", "as_features", "as_labels", "needs_labels", "validate_features",
    "validate_train_test", "warn_degenerate",
]


class EvalError(ValueError):
    """Bad input to an evaluation function; the message is one line naming what was found."""


class EvalWarning(UserWarning):
    """A metric was evaluated on a degenerate input and returned its documented fallback value."""


def warn_degenerate(msg: str) -> None:
    """Issue ``msg`` as an :class:`EvalWarning` attributed to the metric's caller."""
    warnings.warn(msg, EvalWarning, stacklevel=3)


def needs_labels(labels: Any, metric: str) -> None:
    """Raise :class:`EvalError` when ``metric`` (which needs labels) got ``labels=None``."""
    if labels is None:
        raise EvalError(f"{metric} needs labels; got labels=None")


def _to_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    try:
        arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise EvalError(f"{name} must be an array; got {type(x).__name__}") from exc
    if arr.dtype.kind not in "biuf":
        what = "a NumPy array" if isinstance(x, np.ndarray) else type(x).__name__
        raise EvalError(f"{name} must be numeric; got {what} of dtype {arr.dtype}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only array (memory-mapped) is never written to
        return torch.as_tensor(arr)


def as_features(features: Any, name: str = "features") -> torch.Tensor:
    """Return ``features`` as a 2-D float CPU tensor (float32, or float64 if given float64).

    Raises :class:`EvalError` for a shape other than (N, D) with N, D > 0, and for NaN or inf
    (naming how many rows hold one). No copy is made for float32/float64 input.
    """
    t = _to_tensor(features, name)
    if t.ndim != 2:
        kind = {0: "a scalar", 1: "a 1-D array"}.get(t.ndim, f"a {t.ndim}-D array")
        raise EvalError(f"{name} must be a 2-D array (N, D); got {kind} of shape {tuple(t.shape)}")
    n, d = t.shape
    if n == 0 or d == 0:
        raise EvalError(f"{name} is empty: shape {tuple(t.shape)}")
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)
    # Fast finiteness test: a NaN or inf entry makes the total sum non-finite. Only when the sum
    # is non-finite (possibly by overflow of huge finite values) is the exact per-entry test run.
    if not bool(torch.isfinite(t.sum())):
        bad_rows = (~torch.isfinite(t)).any(dim=1)
        n_bad = int(bad_rows.sum())
        if n_bad:
            first = int(torch.nonzero(bad_rows)[0, 0])
            raise EvalError(f"{name} contain NaN or inf in {n_bad} of {n} rows (first: row {first})")
    return t


def as_labels(labels: Any, n: int | None = None, name: str = "labels") -> torch.Tensor:
    """Return ``labels`` as a 1-D int64 CPU tensor; ``n`` is the expected length (feature rows)."""
    t = _to_tensor(labels, name)
    if t.ndim != 1:
        raise EvalError(f"{name} must be a 1-D array (N,); got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point and not (bool(torch.isfinite(t).all()) and bool((t == t.round()).all())):
        raise EvalError(f"{name} must be integer class ids; got non-integer {t.dtype} values")
    t = t.to(torch.int64)
    if n is not None and t.shape[0] != n:
        raise EvalError(f"{name} has {t.shape[0]} entries but features has {n} rows")
    return t


def validate_features(features: Any, labels: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Check and convert ``(features, labels)``; return ``(F, y)`` as CPU tensors.

    ``F`` is (N, D) float32/float64, ``y`` is (N,) int64 or ``None`` when ``labels`` is ``None``.
    Raises :class:`EvalError` with one line for: not 2-D, empty, NaN/inf (with the number of rows),
    non-integer labels, or a label count different from the number of feature rows.
    """
    f = as_features(features)
    y = None if labels is None else as_labels(labels, f.shape[0])
    return f, y


def validate_train_test(
    train_features: Any, train_labels: Any, test_features: Any, test_labels: Any, who: str = ""
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """:func:`validate_features` of a train and a test split: ``(F_train, y_train, F_test, y_test)``.
    Raises EvalError also for train and test of different D, and, with ``who`` (the caller's
    name, e.g. ``linear_probe``), when a split's labels are None."""
    if who and (train_labels is None or test_labels is None):
        raise EvalError(f"{who} needs train and test labels; got None")
    xtr, ytr = validate_features(train_features, train_labels)
    xte, yte = validate_features(test_features, test_labels)
    if xtr.shape[1] != xte.shape[1]:
        raise EvalError(f"train features have D={xtr.shape[1]} but test features have D={xte.shape[1]}")
    return xtr, ytr, xte, yte


def class_indices(ytr: torch.Tensor, yte: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(train labels, test labels, C)`` as indices into the C sorted train classes; a test label
    absent from the train labels becomes -1 (never predicted)."""
    classes, ytr_idx = torch.unique(ytr, return_inverse=True)
    pos = torch.searchsorted(classes, yte).clamp_max(classes.numel() - 1)
    return ytr_idx, torch.where(classes[pos] == yte, pos, torch.full_like(pos, -1)), classes.numel()
