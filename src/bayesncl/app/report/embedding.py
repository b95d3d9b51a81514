"""The embedding map: a 2-D t-SNE (openTSNE; docs/decisions.md, "Embedding maps") of the test
features z̃, coloured by class, as ``embedding.png`` beside ``evaluate``'s other figures and in the
HTML report (both authors' repositories draw such a map, with UMAP).

At most :data:`EMBED_CAP` test samples are embedded (a class-stratified subset, seed 0), so the
map stays cheap on a CPU; perplexity min(30, (n − 1) / 3), PCA initialisation, seed 0 (the same
features always give the same map). Fewer than :data:`MIN_SAMPLES` samples: no map (a message);
fewer than 2 active dimensions (an untrained or collapsed model): a frame saying so instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["EMBED_CAP", "MIN_SAMPLES", "embed", "write_embedding_map"]

EMBED_CAP = 1000
MIN_SAMPLES = 10


def embed(
    features: np.ndarray, labels: np.ndarray, cap: int = EMBED_CAP, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, xy)``: the (n,) rows of ``features`` (N, D) embedded (all, or a class-stratified
    ``cap`` of them) and their (n, 2) t-SNE coordinates. Raises ValueError for fewer than
    :data:`MIN_SAMPLES` rows; ImportError without openTSNE."""
    from openTSNE import TSNE

    from bayesncl.data import stratified_subset

    rows = stratified_subset(np.asarray(labels), cap, seed=seed)
    if len(rows) < MIN_SAMPLES:
        raise ValueError(f"the embedding map needs at least {MIN_SAMPLES} test samples; got {len(rows)}")
    x = np.asarray(features, dtype=np.float64)[rows]
    tsne = TSNE(n_components=2, perplexity=min(30.0, (len(rows) - 1) / 3), initialization="pca",
                random_state=seed, n_jobs=1, verbose=False)
    return rows, np.asarray(tsne.fit(x))


def write_embedding_map(
    features: np.ndarray, labels: np.ndarray, class_names: Sequence[str], path: Path, label: str = "",
    cap: int = EMBED_CAP,
) -> Path | None:
    """Draw the map (module doc) of ``features`` (N, D) with ``labels`` (N,) into the PNG ``path``;
    returns it, or None (with a one-line message) where there are too few samples or openTSNE is
    missing: never fatal. Features with fewer than 2 active dimensions get a frame saying so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bayesncl.app.report.figures import class_name, figure_title, legend_below, save_figure

    active = int((np.abs(features).sum(0) > 0).sum())
    try:
        rows, xy = embed(features, labels, cap) if active > 1 else (None, None)
    except ImportError:
        print("embedding map skipped: openTSNE is not installed (pip install openTSNE)")
        return None
    except ValueError as e:
        print(f"embedding map skipped: {e}")
        return None
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    ax.set_xticks([])
    ax.set_yticks([])
    if rows is None:  # the map of one coordinate (or none) is a point or a line: a frame that says so
        why = f"only {active} active dimension{'' if active == 1 else 's'} of {features.shape[1]}: no map"
        print(f"embedding map: {why}")
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_title(figure_title("t-SNE of the test features z̃", label), fontsize=9)
        return save_figure(fig, path)
    y = np.asarray(labels)[rows]
    cmap = plt.get_cmap("tab10" if len(class_names) <= 10 else "tab20")
    for c in np.unique(y):
        at = y == c
        ax.scatter(xy[at, 0], xy[at, 1], s=6, color=cmap(int(c) % cmap.N), label=class_name(class_names, c),
                   linewidths=0)
    what = f"t-SNE of the test features z̃ ({len(rows)} of {len(labels)} samples), coloured by class"
    if len(class_names) <= 20:
        legend_below(fig, [ax], figure_title(what, label))
    else:
        ax.set_title(figure_title(what, label), fontsize=9)
    return save_figure(fig, path)
