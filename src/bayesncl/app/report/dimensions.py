"""What each dimension of z̃ does on the test split: the numbers behind the HTML report's dimension
index and its page per dimension (:mod:`bayesncl.app.report.html`).

Pure NumPy on a features dict of :func:`bayesncl.app.evaluate.extract_features` (or a features
file): ``features`` (N, D) = z̃, ``labels`` (N,), ``indices`` (N,) into the split's images and, for
gated runs, ``mask`` (N, D) and ``z`` (N, D), the non-negative feature before the gate. A dimension
*fires* on an image where |z̃_k| > 1e-5 (the threshold of ``bayesncl.metrics``, PAPER-NOTES §3);
it is *active* where it fires on some image (Σ_n |z̃_nk| > 0, as ``active_dims``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EPS = 1e-5  # bayesncl.metrics' firing threshold

#: A dimension firing on at least this share of the test images is not selective by firing: the
#: classes of the images it fires on are about the split's (its page says so, not a majority class).
UNSELECTIVE = 0.95
#: How many images each section of a dimension page shows.
N_TOP, N_QUANTILES, N_CLOSED, N_CORRELATED, N_CLASSES, N_BINS = 16, 10, 8, 5, 10, 30


@dataclass
class DimSummary:
    """One row of the dimension index. Shares and rates are fractions in [0, 1]; ``sc`` is SC_k
    (NaN where no row-normalised entry exceeds 1e-5); ``tied``: how many classes share the largest
    count (``majority`` is the lowest of them; over 1: there is no majority); ``gate_open`` is None
    for ungated runs."""

    dim: int
    sc: float
    majority: int
    tied: int
    majority_share: float
    firing_rate: float
    mean_activation: float
    gate_open: float | None

    @property
    def unselective(self) -> bool:
        """Fires on (nearly) every test image: :data:`UNSELECTIVE`."""
        return self.firing_rate >= UNSELECTIVE

    @property
    def selectivity(self) -> str | None:
        """What the index and the page say instead of a majority class for an :attr:`unselective`
        dimension: "not selective" (it fires on every test image) or "hardly selective"; else None."""
        if not self.unselective:
            return None
        return "not selective" if self.firing_rate == 1.0 else "hardly selective"


@dataclass
class DimDetail:
    """A dimension page. Image lists hold rows of the features dict (not split indices), best first.

    ``hist``: (counts, bin edges) of the activations of the images it fires on; ``zeros``: images
    it does not fire on; ``classes``: (class id, share of the firing images), largest first;
    ``closed``: rows where the gate closed k, largest z_k first (gated runs), ``n_closed`` of them
    in all; ``correlated``: (dim, Pearson r over the test images), largest |r| first."""

    dim: int
    top: list[int]
    quantiles: list[tuple[float, int]]
    hist: tuple[list[int], list[float]]
    zeros: int
    classes: list[tuple[int, float]]
    closed: list[int] = field(default_factory=list)
    n_closed: int = 0
    correlated: list[tuple[int, float]] = field(default_factory=list)


def class_fire_counts(fire: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(C, D) counts: ``out[c, k]`` = #{n with label c : fire[n, k]}. fire: (N, D) bool."""
    onehot = np.zeros((len(labels), num_classes), dtype=np.float32)
    onehot[np.arange(len(labels)), labels] = 1.0
    return onehot.T @ fire.astype(np.float32)


def summarise(feats: dict[str, np.ndarray], num_classes: int) -> list[DimSummary]:
    """One :class:`DimSummary` per active dimension, in dimension order.

    SC_k is :func:`bayesncl.metrics.semantic_consistency_per_dim` (PAPER-NOTES §3); the majority
    class is the most frequent label among the images the dimension fires on."""
    from bayesncl.metrics import semantic_consistency_per_dim

    f, y = feats["features"], feats["labels"]
    fire = np.abs(f) > EPS
    counts = class_fire_counts(fire, y, num_classes)
    total = counts.sum(0)
    sc = semantic_consistency_per_dim(f, y)
    mask = feats.get("mask")
    open_rate = mask.mean(0) if mask is not None else None
    return [
        DimSummary(
            dim=int(k), sc=float(sc[k]), majority=int(counts[:, k].argmax()),
            tied=int((counts[:, k] == counts[:, k].max()).sum()),
            majority_share=float(counts[:, k].max() / total[k]) if total[k] else 0.0,
            firing_rate=float(fire[:, k].mean()), mean_activation=float(f[:, k].mean()),
            gate_open=None if open_rate is None else float(open_rate[k]),
        )
        for k in np.flatnonzero(np.abs(f).sum(0) > 0)
    ]


def correlations(features: np.ndarray, dims: Sequence[int], n: int = N_CORRELATED) -> dict[int, list]:
    """For each of ``dims``, the ``n`` other dims of ``dims`` with the largest |Pearson r| of their
    activations over the rows of ``features`` (N, D): ``{k: [(j, r), ...]}``. A constant dim has
    r = 0 with every other (no NaN)."""
    if len(dims) < 2:
        return {int(k): [] for k in dims}
    x = features[:, list(dims)].astype(np.float64)
    x -= x.mean(0)
    norm = np.linalg.norm(x, axis=0)
    x /= np.where(norm > 0, norm, 1.0)
    r = x.T @ x
    np.fill_diagonal(r, 0.0)
    order = np.argsort(-np.abs(r), axis=1, kind="stable")[:, :n]
    return {int(k): [(int(dims[j]), float(r[i, j])) for j in order[i]] for i, k in enumerate(dims)}


def quantile_sample(values: np.ndarray, rows: np.ndarray, n: int = N_QUANTILES) -> list[tuple[float, int]]:
    """``n`` rows of ``rows`` spread over the quantiles of ``values[rows]``: ``(q, row)`` with q in
    [0, 1] from the weakest to the strongest, duplicates dropped (fewer rows than n: each once)."""
    if len(rows) == 0:
        return []
    order = rows[np.argsort(values[rows], kind="stable")]
    qs = np.linspace(0.0, 1.0, n)
    picks = np.unique(np.round(qs * (len(order) - 1)).astype(int))
    return [(float(p / max(len(order) - 1, 1)), int(order[p])) for p in picks]


def detail(
    feats: dict[str, np.ndarray], k: int, counts: np.ndarray, correlated: list[tuple[int, float]]
) -> DimDetail:
    """The :class:`DimDetail` of dimension ``k``; ``counts``: :func:`class_fire_counts` (C, D)."""
    f = feats["features"][:, k]
    firing = np.flatnonzero(np.abs(f) > EPS)
    top = firing[np.argsort(-f[firing], kind="stable")][:N_TOP]
    fired = f[firing]  # the axis starts at 0 (or the lowest value): one value would span v ± 0.5
    span = (min(0.0, float(fired.min())), max(0.0, float(fired.max()))) if len(firing) else None
    hist, edges = np.histogram(fired, bins=N_BINS, range=span) if span else (np.zeros(0, int), np.zeros(0))
    col = counts[:, k]
    share = col / col.sum() if col.sum() else col
    classes = [(int(c), float(share[c])) for c in np.argsort(-col, kind="stable")[:N_CLASSES] if col[c] > 0]
    out = DimDetail(
        dim=k, top=[int(i) for i in top], quantiles=quantile_sample(f, firing),
        hist=([int(h) for h in hist], [float(e) for e in edges]), zeros=int(len(f) - len(firing)),
        classes=classes, correlated=correlated,
    )
    mask = feats.get("mask")
    if mask is not None:
        closed = np.flatnonzero(mask[:, k] < 0.5)
        pre = feats["z"][:, k] if feats.get("z") is not None else np.zeros(len(f))
        out.closed = [int(i) for i in closed[np.argsort(-pre[closed], kind="stable")][:N_CLOSED]]
        out.n_closed = int(len(closed))
    return out


def images_used(details: Sequence[DimDetail]) -> np.ndarray:
    """Sorted unique feature rows any page shows (one thumbnail each)."""
    rows: set[int] = set()
    for d in details:
        rows.update(d.top, (r for _, r in d.quantiles), d.closed)
    return np.array(sorted(rows), dtype=np.int64)


def svg_bars(values: Sequence[float], width: int = 320, height: int = 90) -> list[dict[str, Any]]:
    """Bar rectangles (x, y, w, h in px) of ``values`` scaled to a ``width`` × ``height`` box, for
    an inline SVG histogram (the template draws them; no script, no image file)."""
    if not len(values):
        return []
    top = max(max(values), 1e-12)
    w = width / len(values)
    return [
        {"x": round(i * w, 2), "w": round(max(w - 1, 0.5), 2), "h": round(height * v / top, 2),
         "y": round(height - height * v / top, 2), "v": v}
        for i, v in enumerate(values)
    ]
