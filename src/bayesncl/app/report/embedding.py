"""The embedding map: a 2-D t-SNE (openTSNE; docs/decisions.md, row "embedding maps") of the test
features z̃, coloured by class, as ``embedding.png`` beside ``evaluate``'s other figures and in the
HTML report; beside it a UMAP of the same samples (both authors' repositories draw UMAP) where
umap-learn is installed (the optional extra ``bayesncl[umap]``), else a one-line note says it is left
out. UMAP: n_neighbors min(15, n − 1), its other defaults, seed 0 (one thread, so the same features
give the same map); its first fit in a process compiles numba code (about a minute on a busy CPU).

At most :data:`EMBED_CAP` test samples are embedded (a class-stratified subset, seed 0), so the
map stays cheap on a CPU; perplexity min(30, (n − 1) / 3), PCA initialisation, seed 0 (the same
features always give the same map). Fewer than :data:`MIN_SAMPLES` samples: no map (a message);
fewer than 2 active dimensions (an untrained or collapsed model): a frame saying so instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["EMBED_CAP", "MIN_SAMPLES", "UMAP_PANEL", "embed", "embed_umap", "write_embedding_map"]

EMBED_CAP = 1000
MIN_SAMPLES = 10
#: Draw the UMAP panel where umap-learn is installed (the test suite turns it off but in its own tests:
#: its first fit in a process costs about a minute of numba compilation).
UMAP_PANEL = True
UMAP_MISSING = "embedding map: no UMAP panel: umap-learn is not installed (pip install 'bayesncl[umap]')"


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


def embed_umap(
    features: np.ndarray, labels: np.ndarray, cap: int = EMBED_CAP, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`embed` (the same rows), with UMAP (module doc) instead of t-SNE. Raises ValueError
    for fewer than :data:`MIN_SAMPLES` rows; ImportError without umap-learn."""
    import warnings

    import umap

    from bayesncl.data import stratified_subset

    rows = stratified_subset(np.asarray(labels), cap, seed=seed)
    if len(rows) < MIN_SAMPLES:
        raise ValueError(f"the embedding map needs at least {MIN_SAMPLES} test samples; got {len(rows)}")
    x = np.asarray(features, dtype=np.float32)[rows]
    with warnings.catch_warnings():  # "n_jobs value 1 overridden to 1 by setting random_state"
        warnings.simplefilter("ignore", UserWarning)
        reducer = umap.UMAP(n_components=2, n_neighbors=min(15, len(rows) - 1), random_state=seed, n_jobs=1)
        return rows, np.asarray(reducer.fit_transform(x))


def write_embedding_map(
    features: np.ndarray, labels: np.ndarray, class_names: Sequence[str], path: Path, label: str = "",
    cap: int = EMBED_CAP,
) -> Path | None:
    """Draw the map (module doc) of ``features`` (N, D) with ``labels`` (N,) into the PNG ``path``;
    returns it, or None (with a one-line message) where there are too few samples or openTSNE is
    missing: never fatal. With :data:`UMAP_PANEL` a UMAP panel of the same samples sits to the right
    (without umap-learn: one line, :data:`UMAP_MISSING`, and the t-SNE alone). Features with fewer than
    2 active dimensions get one frame saying so."""
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
    maps = [("t-SNE", xy)]
    if rows is not None and UMAP_PANEL:
        try:
            maps.append(("UMAP", embed_umap(features, labels, cap)[1]))
        except ImportError:
            print(UMAP_MISSING)
    fig, axes = plt.subplots(1, len(maps), figsize=(6.4 * len(maps), 6.0), squeeze=False)
    for ax in axes[0]:
        ax.set_xticks([])
        ax.set_yticks([])
    ax = axes[0][0]
    if rows is None:  # the map of one coordinate (or none) is a point or a line: a frame that says so
        why = f"only {active} active dimension{'' if active == 1 else 's'} of {features.shape[1]}: no map"
        print(f"embedding map: {why}")
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_title(figure_title("t-SNE of the test features z̃", label), fontsize=9)
        return save_figure(fig, path)
    y = np.asarray(labels)[rows]
    cmap = plt.get_cmap("tab10" if len(class_names) <= 10 else "tab20")
    for ax, (name, coords) in zip(axes[0], maps, strict=True):
        for c in np.unique(y):
            at = y == c
            ax.scatter(coords[at, 0], coords[at, 1], s=6, color=cmap(int(c) % cmap.N),
                       label=class_name(class_names, c), linewidths=0)  # fmt: skip
        if len(maps) > 1:
            ax.set_title(name, fontsize=9)
    how = " and ".join(name for name, _ in maps)
    what = f"{how} of the test features z̃ ({len(rows)} of {len(labels)} samples), coloured by class"
    if len(class_names) <= 20:
        legend_below(fig, list(axes[0][:1]), figure_title(what, label))
    else:
        fig.suptitle(figure_title(what, label), fontsize=9)
    return save_figure(fig, path)
