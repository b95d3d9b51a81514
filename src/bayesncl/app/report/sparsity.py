"""Per-sample activation sparsity, the NCL paper's Fig. 1(c, d): a histogram of how many feature
dimensions fire (|z̃_k| > 1e-5, the threshold of the ``sparsity`` metric, docs/metrics.md) on each
test image, one outline per run, so CL (nearly every dim fires) and NCL (a few) sit on one axis.
``evaluate`` writes it for its run (``sparsity.png``); ``bayesncl report`` of several runs overlays
them (``sparsity.png`` beside the overlaid training curves)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["FIRE_EPS", "active_per_sample", "sparsity_figure", "sparsity_histogram"]

#: A dim fires on a sample where |z̃_k| exceeds this (the NCL paper's zero test, |x| < 1e-5).
FIRE_EPS = 1e-5


def active_per_sample(features: np.ndarray, eps: float = FIRE_EPS) -> np.ndarray:
    """(N,) int64: the number of dims k with |F_nk| > ``eps`` in each row of ``features`` (N, D)."""
    f = np.asarray(features)
    if f.ndim != 2:
        raise ValueError(f"features must be (N, D); got shape {f.shape}")
    return (np.abs(f) > eps).sum(axis=1).astype(np.int64)


def sparsity_histogram(features: np.ndarray, eps: float = FIRE_EPS) -> np.ndarray:
    """(D + 1,) int64: entry m counts the rows of ``features`` (N, D) on which exactly m dims fire."""
    f = np.asarray(features)
    return np.bincount(active_per_sample(f, eps), minlength=f.shape[1] + 1)


def sparsity_figure(runs: Mapping[str, np.ndarray], path: Path, title: str = "") -> Path:
    """Draw the histogram (module doc) of each run of ``runs`` (label → test features (N, D)) as a
    step outline of the share of its samples (%) against the number of active dims, with each run's
    mean in the legend, into the PNG ``path``; returns it. Raises ValueError for no runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bayesncl.runs.fileio import atomic_path

    if not runs:
        raise ValueError("the sparsity figure needs at least one run's features")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    d_max = 0
    for label, feats in runs.items():
        hist = sparsity_histogram(feats)
        share = 100.0 * hist / max(1, hist.sum())
        d = len(hist) - 1
        d_max = max(d_max, d)
        mean = float((np.arange(d + 1) * hist).sum() / max(1, hist.sum()))
        name = f"{label} (mean {mean:.1f} of {d} dims)"
        ax.stairs(share, np.arange(d + 2) - 0.5, label=name, linewidth=1.4)
    ax.set_xlim(-0.5, d_max + 0.5)
    ax.set_xlabel("active dims per test image (|z̃_k| > 1e-5)")
    ax.set_ylabel("test images (%)")
    ax.legend(fontsize=7, frameon=False)
    fig.suptitle(title or "Per-sample activation sparsity", fontsize=10)
    fig.tight_layout()
    try:  # (figures.save_figure's way; figures imports this module)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path
