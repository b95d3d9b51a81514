"""Background metrics: which dimensions encode the background (place) rather than the object
(docs/metrics.md, "Background metrics"; issue 15, BayesNCL paper Definition 4.4 and Table 6).

Every function takes (N, D) features and (N,) integer labels and places (``torch.Tensor`` or
``np.ndarray``); the public ones validate them (EvalError, one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from ._numerics import magnitudes
from .inputs import EvalError, as_labels, validate_features
from .probe import linear_probe, stratified_split

__all__ = [
    "KIND_MARGIN", "KINDS", "BackgroundShared", "group_lift", "dimension_kinds", "background_metrics",
    "background_probe", "gate_closure"
]

KIND_MARGIN = 0.1  # δ of docs/metrics.md: the lift difference that makes a dim object or background
KINDS = ("object", "background", "mixed")  # codes 0, 1, 2; -1: inactive dim


def group_lift(f: torch.Tensor, groups: torch.Tensor) -> np.ndarray:
    """(D,) float64 lift r_k(u) in [0, 1] of validated features ``f`` (N, D) for the labelling
    ``groups`` (N,) int64 (docs/metrics.md); NaN for inactive dims, and for every dim when only one
    group is present."""
    a = magnitudes(f).to(torch.float64)
    uniq, inverse = torch.unique(groups, return_inverse=True)
    g = uniq.numel()
    sums = torch.zeros(g, a.shape[1], dtype=torch.float64).index_add_(0, inverse, a)
    means = (sums / torch.bincount(inverse, minlength=g).to(torch.float64)[:, None]).numpy()
    total = means.sum(axis=0)
    if g < 2:
        return np.full(a.shape[1], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        kappa = np.where(total > 0, means.max(axis=0) / np.where(total > 0, total, 1.0), np.nan)
    return (kappa - 1.0 / g) / (1.0 - 1.0 / g)


def _kinds(r_class: np.ndarray, r_place: np.ndarray, margin: float) -> np.ndarray:
    kind = np.full(r_class.shape, -1, dtype=np.int64)
    active = np.isfinite(r_class) & np.isfinite(r_place)
    diff = np.where(active, r_class - r_place, 0.0)
    kind[active] = 2
    kind[active & (diff >= margin)] = 0
    kind[active & (diff <= -margin)] = 1
    return kind


def dimension_kinds(features: Any, labels: Any, places: Any, margin: float = KIND_MARGIN) -> np.ndarray:
    """(D,) int64 kind codes: 0 object, 1 background, 2 mixed (:data:`KINDS`), -1 inactive.
    Raises EvalError for bad features, labels or places."""
    s = BackgroundShared.from_arrays(features, labels, places)
    return _kinds(*s.lifts, margin)


def gate_closure(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(D,) share of the firing entries of each dim (z_nk > 0) that the gate closes (m_nk = 0);
    NaN for dims that never fire. z, mask: (N, D)."""
    fire = z > 0
    n_fire = fire.sum(axis=0)
    closed = (fire & (mask <= 0)).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_fire > 0, closed / np.maximum(n_fire, 1), np.nan)


def _mean_or_none(values: np.ndarray) -> float | None:
    kept = values[np.isfinite(values)]
    return float(kept.mean()) if kept.size else None


@dataclass
class BackgroundShared:
    """Validated features ``f`` (N, D), classes ``y`` and places ``g`` (N,), optional pre-gate
    ``z`` and ``mask`` (N, D) NumPy arrays, and what several background metrics share."""

    f: torch.Tensor
    y: torch.Tensor
    g: torch.Tensor
    z: np.ndarray | None = None
    mask: np.ndarray | None = None

    @classmethod
    def from_arrays(
        cls, features: Any, labels: Any, places: Any, z: Any = None, mask: Any = None
    ) -> BackgroundShared:
        if labels is None or places is None:
            raise EvalError("background metrics need labels and places; got None")
        f, y = validate_features(features, labels)
        g = as_labels(places, f.shape[0], name="places")
        zz = None if z is None else validate_features(z)[0].numpy()
        mm = None if mask is None else validate_features(mask)[0].numpy()
        for name, arr in (("z", zz), ("mask", mm)):
            if arr is not None and arr.shape != tuple(f.shape):
                raise EvalError(f"{name} has shape {arr.shape} but features has {tuple(f.shape)}")
        assert y is not None
        return cls(f, y, g, zz, mm)

    @cached_property
    def lifts(self) -> tuple[np.ndarray, np.ndarray]:
        """(class lift, place lift), each (D,), on the features."""
        return group_lift(self.f, self.y), group_lift(self.f, self.g)

    @cached_property
    def kinds(self) -> np.ndarray:
        return _kinds(*self.lifts, KIND_MARGIN)

    def kind_fraction(self, code: int) -> float:
        active = self.kinds >= 0
        return float((self.kinds[active] == code).mean()) if active.any() else 0.0

    def mass_fraction(self, code: int) -> float:
        mass = magnitudes(self.f).to(torch.float64).sum(0).numpy()
        total = mass[self.kinds >= 0].sum()
        return float(mass[self.kinds == code].sum() / total) if total > 0 else 0.0

    @cached_property
    def closure(self) -> tuple[float | None, float | None]:
        """(gate closure on background dims, on object dims), kinds taken on z; Nones without a gate."""
        if self.z is None or self.mask is None:
            return None, None
        zt = torch.from_numpy(self.z)
        kinds = _kinds(group_lift(zt, self.y), group_lift(zt, self.g), KIND_MARGIN)
        rate = gate_closure(self.z, self.mask)
        return _mean_or_none(rate[kinds == 1]), _mean_or_none(rate[kinds == 0])


def background_metrics(
    features: Any, labels: Any, places: Any, *, z: Any = None, mask: Any = None
) -> dict[str, float | None]:
    """The rows of :data:`bayesncl.metrics.registry.BACKGROUND_METRICS` as a dict (docs/metrics.md).
    ``z`` and ``mask`` (N, D): the pre-gate features and the gate of a gated method (the closure
    keys are None without them). Raises EvalError for bad input."""
    from .registry import BACKGROUND_METRICS

    s = BackgroundShared.from_arrays(features, labels, places, z, mask)
    return {m.key: m.value(s) for m in BACKGROUND_METRICS}


def background_probe(
    train_h: Any, train_places: Any, test_h: Any, test_places: Any, *, seed: int = 0
) -> dict[str, Any]:
    """``background_probe_acc1`` (paper Table 6), percent: :func:`linear_probe` on frozen features
    predicting the place; returns ``{"background_probe_acc1", "background_probe_protocol"}``."""
    return _place_probe(linear_probe(train_h, train_places, test_h, test_places, seeds=seed), "train -> test")


def _place_probe(lp: dict[str, Any], where: str) -> dict[str, Any]:
    return {"background_probe_acc1": lp["acc1"], "background_probe_protocol": f"{where}: {lp['protocol']}"}


def background_probe_one_split(h: Any, places: Any, *, seed: int = 0) -> dict[str, Any]:
    """:func:`background_probe` within one split: fitted on a stratified half of the rows (``seed``),
    scored on the other half (``bayesncl metrics``, whose file holds one split). Raises EvalError
    when a place has fewer than 2 rows."""
    x, _ = validate_features(h)
    g = as_labels(places, x.shape[0], name="places")
    if int(torch.unique(g, return_counts=True)[1].min()) < 2:
        raise EvalError("background probe: every place needs at least 2 rows to split the file in halves")
    train, test = stratified_split(g, 0.5, seed)
    lp = linear_probe(x[train], g[train], x[test], g[test], seeds=seed)
    return _place_probe(lp, "one file, stratified halves")
