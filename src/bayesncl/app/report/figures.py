"""Figures to look at: top-activating images per dimension (the paper's Fig. 1 view) and the
features a BayesNCL gate suppresses.

Both read the features dict/file from ``bayesncl.app.evaluate.extract_features`` and the
split's images from ``bayesncl.data.load_split_images``; nothing recomputes features.
"""

from __future__ import annotations

import math
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
    images: Any, rows: np.ndarray, row_titles: Sequence[str], cell_titles: Sequence[Sequence[str]],
    path: Path, title: str,
) -> Path:
    """Draw ``images[rows[r, c]]`` in a grid with titles; write a PNG atomically. returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows, n_cols = rows.shape
    size = (1.25 * n_cols + 1.2, 1.35 * n_rows + 0.6)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=size, squeeze=False)
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
    """``"Bag: 6 of the\n8 shown"``: the most frequent class among ``labels`` (the images shown in
    a row) and how many of them it holds; ``"tie (3 classes): 2 each of the\n8 shown"`` where
    several classes hold the most."""
    if not len(labels):
        return ""
    counts = np.bincount(labels)
    c, tied = int(counts.argmax()), int((counts == counts.max()).sum())
    who = f"tie ({tied} classes)" if tied > 1 else class_name(class_names, c)
    return f"{who}: {counts[c]}{' each' if tied > 1 else ''} of the\n{len(labels)} shown"


def top_activations_figure(
    feats: dict[str, np.ndarray], images: Any, class_names: Sequence[str], path: Path, n_dims: int = 8,
    n_images: int = 8, title: str = "",
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
    cells = _cell_names(top, lab, class_names)
    title = title or "Top-activating test images for the most active dimensions"
    return image_grid_figure(images, feats["indices"][top], row_titles, cells, path, title)


def class_name(class_names: Sequence[str], c: int) -> str:
    """Class ``c``'s name, or the number where it has none."""
    return class_names[c] if c < len(class_names) else str(c)


def _cell_names(top: np.ndarray, labels: np.ndarray, class_names: Sequence[str]) -> list[list[str]]:
    """The class name of each image ``labels[top[r, c]]``."""
    return [[class_name(class_names, labels[i]) for i in t] for t in top]


def figure_title(what: str, label: str) -> str:
    """``what``, then the method and run it shows (``label``: ``"bayesncl, run demo/bayesncl"``)."""
    return f"{what}\n{label}" if label else what


def write_figures(
    feats: dict[str, np.ndarray], data_cfg: Any, out_dir: Path, label: str = "", names: Any = None
) -> list[Path]:
    """Write ``top_activations.png``, ``sparsity.png`` (:mod:`bayesncl.app.report.sparsity`) and, for
    gated methods, ``suppressed_features.png`` for the test split into ``out_dir``; returns the paths
    written. ``label``: the method and run, in each title; ``names``: the class names (default: the
    data's). Figures are skipped (with a message), never fatal, when there is nothing to draw."""
    from bayesncl.app.report.sparsity import sparsity_figure
    from bayesncl.data import dataset_info, load_split_images

    images, _ = load_split_images(data_cfg, "test")
    names = names or dataset_info(data_cfg).class_names
    top = figure_title("Top-activating test images for the most active dimensions", label)
    sparse = figure_title("Per-sample activation sparsity (the NCL paper's Fig. 1 c, d)", label)
    draws = {"top_activations.png": lambda p: top_activations_figure(feats, images, names, p, title=top),
             "sparsity.png": lambda p: sparsity_figure({"test split": feats["features"]}, p, title=sparse)}
    if feats.get("mask") is not None:
        draws["suppressed_features.png"] = lambda p: suppressed_features_figure(
            feats, images, names, p, label=label
        )
    written = []
    for name, draw in draws.items():
        try:
            written.append(draw(out_dir / name))
        except ValueError as e:
            print(f"figure skipped: {e}")
    return written


def run_label(method: str, run_dir: Path, seed: int | None = None) -> str:
    """The method (and seed) and run a figure shows: ``"bayesncl, run demo/bayesncl"``,
    ``"ncl seed 1, run variants/0123456789ab"`` (a store's run is named by its hash alone)."""
    run_dir = Path(run_dir)
    what = method if seed is None else f"{method} seed {seed}"
    return f"{what}, run {run_dir.parent.name + '/' if run_dir.parent.name else ''}{run_dir.name}"


def filtered_dims(mask: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` dims the gate closes on some images and opens on others, the most mixed first
    (largest min(#open, #closed); ties: lower dim). A dim closed (or open) on every image filters
    nothing and is never chosen. mask: (N, D), open where >= 0.5. returns (<= n,) int64."""
    closed = (mask < 0.5).sum(0)
    mixed = np.minimum(closed, len(mask) - closed)
    order = np.argsort(-mixed, kind="stable")
    return order[mixed[order] > 0][:n]


def suppressed_features_figure(
    feats: dict[str, np.ndarray], images: Any, class_names: Sequence[str], path: Path, n_dims: int = 4,
    n_images: int = 8, label: str = "",
) -> Path:
    """What the gate filters: for each of the ``n_dims`` dims it closes on some images and opens on
    others (:func:`filtered_dims`), two rows: the images where its gate is open with the largest
    z̃_k, then those where it is closed with the largest pre-gate z_k (what the gate removed).

    feats needs ``z``, ``features``, ``mask`` (N, D), ``labels``, ``indices``. Raises ValueError
    without a gate, or when every dim's gate is open on every image or closed on every image."""
    if feats.get("mask") is None:
        raise ValueError("suppressed-features figure needs a gated method (features file has no mask)")
    z, f, mask, lab = feats["z"], feats["features"], feats["mask"], feats["labels"]
    dims = filtered_dims(mask, n_dims)
    if len(dims) == 0:
        raise ValueError(
            "the gate filters no dimension on this split: each is open on every image or on none"
        )
    n = min(n_images, int(np.minimum((mask[:, dims] < 0.5).sum(0), (mask[:, dims] >= 0.5).sum(0)).min()))
    rows, titles = [], []
    for k in dims:
        closed = mask[:, k] < 0.5
        sides = (("open", np.where(closed, -np.inf, f[:, k])), ("closed", np.where(closed, z[:, k], -np.inf)))
        for side, score in sides:
            rows.append(np.argsort(-score, kind="stable")[:n])
            count = int((~closed).sum() if side == "open" else closed.sum())
            titles.append(f"dim {k} {side}\non {count}/{len(lab)}")
    top = np.stack(rows)
    cells = _cell_names(top, lab, class_names)
    what = "What the gate filters: per dim, images with its gate open (largest z̃_k) and closed (largest z_k)"
    return image_grid_figure(images, feats["indices"][top], titles, cells, path, figure_title(what, label))


def legend_below(fig: Any, axes: Sequence[Any], title: str, extra: dict[str, Any] | None = None,
                 title_size: int = 11) -> None:
    """One legend under all panels of ``fig`` (each label of ``axes`` once, then ``extra``
    ``{label: handle}``), the figure grown to hold it, ``title`` above; then tight_layout."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    entries.update(extra or {})
    rect_bottom = 0.0
    if entries:
        ncol = min(len(entries), 4, max(1, int(fig.get_figwidth() // 2.2)))  # a narrow figure: fewer
        legend_in = 0.16 * math.ceil(len(entries) / ncol) + 0.15  # inches
        height = fig.get_figheight() + legend_in
        fig.set_figheight(height)
        fig.legend(list(entries.values()), list(entries), loc="lower center", ncol=ncol, fontsize=7,
                   frameon=False)  # fmt: skip
        rect_bottom = legend_in / height
    if title:
        fig.suptitle(title, fontsize=title_size)
    fig.tight_layout(rect=(0, rect_bottom, 1, 1))


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG atomically (see :mod:`bayesncl.runs.fileio`) and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return path
