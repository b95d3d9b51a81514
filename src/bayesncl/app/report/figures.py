"""Figures to look at: top-activating images per dimension (the paper's Fig. 1 view) and the
features a BayesNCL gate suppresses.

Both read the features dict/file from ``bayesncl.app.evaluate.extract_features`` and the
split's images from ``bayesncl.data.load_split_images``; nothing recomputes features.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.runs.fileio import atomic_path


def most_active_dims(features: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` dims with the largest expected activation Σ_i |F_ik| (PAPER-NOTES §3
    ranking), skipping dims that never fire. features: (N, D). returns: (≤ n,) int64."""
    score = np.abs(features).sum(0)
    order = np.argsort(-score, kind="stable")
    return order[score[order] > 0][:n]


def top_samples(values: np.ndarray, dims: Sequence[int], m: int) -> np.ndarray:
    """For each dim, the rows of ``values`` (N, D) with the ``m`` largest entries. returns (len(dims), m)."""
    return np.stack([np.argsort(-values[:, k], kind="stable")[:m] for k in dims])


def _to_hwc(img: torch.Tensor) -> np.ndarray:
    a = img.detach().cpu().numpy()
    return a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)


def image_grid_figure(
    images: Any,
    rows: np.ndarray,
    row_titles: Sequence[str],
    cell_titles: Sequence[Sequence[str]],
    path: Path,
    title: str,
) -> Path:
    """Draw ``images[rows[r, c]]`` in a grid with titles; write a PNG atomically. returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows, n_cols = rows.shape
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(1.25 * n_cols + 1.2, 1.35 * n_rows + 0.6), squeeze=False
    )
    for r in range(n_rows):
        batch = images[torch.as_tensor(rows[r])]
        for c in range(n_cols):
            ax = axes[r, c]
            img = _to_hwc(batch[c])
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(cell_titles[r][c], fontsize=6)
        axes[r, 0].set_ylabel(row_titles[r], fontsize=7, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    return path


def _majority(labels: np.ndarray, class_names: Sequence[str]) -> str:
    """``"75% Bag"``: the share of the most frequent class among ``labels`` and its name."""
    if not len(labels):
        return ""
    counts = np.bincount(labels)
    c = int(counts.argmax())
    name = class_names[c] if c < len(class_names) else str(c)
    return f"{100 * counts[c] / len(labels):.0f}% {name}"


def top_activations_figure(
    feats: dict[str, np.ndarray],
    images: Any,
    class_names: Sequence[str],
    path: Path,
    n_dims: int = 8,
    n_images: int = 8,
    title: str = "",
) -> Path:
    """One row per most-active dimension of z̃, its ``n_images`` top-activating images, each titled
    with its class name; the row label gives the dim and the share of the majority class among the
    shown images. feats: ``features`` (N, D), ``indices`` (N,) into ``images``, ``labels`` (N,)."""
    f = feats["features"]
    dims = most_active_dims(f, n_dims)
    if len(dims) == 0:
        raise ValueError("no active dimension: every feature is zero, nothing to draw")
    top = top_samples(f, dims, n_images)
    lab = feats["labels"]
    row_titles = [f"dim {k}\n{_majority(lab[t], class_names)}" for k, t in zip(dims, top, strict=True)]
    cells = [[class_names[lab[i]] if lab[i] < len(class_names) else str(lab[i]) for i in t] for t in top]
    return image_grid_figure(
        images,
        feats["indices"][top],
        row_titles,
        cells,
        path,
        title or "Top-activating test images for the most active dimensions",
    )


def write_figures(feats: dict[str, np.ndarray], data_cfg: Any, out_dir: Path) -> list[Path]:
    """Write ``top_activations.png`` (and ``suppressed_features.png`` for gated methods) for the
    test split into ``out_dir``; returns the paths written. Figures are skipped (with a message),
    never fatal, when there is nothing to draw."""
    from bayesncl.data import dataset_info, load_split_images

    images, _ = load_split_images(data_cfg, "test")
    names = dataset_info(data_cfg).class_names
    written = []
    try:
        written.append(top_activations_figure(feats, images, names, out_dir / "top_activations.png"))
        if feats.get("mask") is not None:
            written.append(
                suppressed_features_figure(feats, images, names, out_dir / "suppressed_features.png")
            )
    except ValueError as e:
        print(f"figure skipped: {e}")
    return written


def suppressed_features_figure(
    feats: dict[str, np.ndarray],
    images: Any,
    class_names: Sequence[str],
    path: Path,
    n_dims: int = 6,
    n_images: int = 8,
) -> Path:
    """What the gate filters out: for the dims the gate closes most often while the non-negative
    feature z is active, the images with the largest z_k among samples whose gate for k is closed.

    feats needs ``z``, ``mask`` (N, D), ``labels``, ``indices``. Raises ValueError without a gate.
    """
    if feats.get("mask") is None:
        raise ValueError("suppressed-features figure needs a gated method (features file has no mask)")
    z, mask, lab = feats["z"], feats["mask"], feats["labels"]
    suppressed = np.where(mask < 0.5, np.abs(z), 0.0)
    count = (suppressed > 1e-5).sum(0)
    dims = np.argsort(-count, kind="stable")[:n_dims]
    dims = dims[count[dims] > 0]
    if len(dims) == 0:
        raise ValueError("the gate suppressed no active feature on this split")
    top = top_samples(suppressed, dims, n_images)
    row_titles = [f"dim {k}\nsuppressed on\n{count[k]}/{len(lab)}" for k in dims]
    cells = [[class_names[lab[i]] for i in t] for t in top]
    return image_grid_figure(
        images,
        feats["indices"][top],
        row_titles,
        cells,
        path,
        "Gate-suppressed features: active z_k with a closed gate (largest z_k shown)",
    )


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG atomically (see :mod:`bayesncl.runs.fileio`) and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return path
