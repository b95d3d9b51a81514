"""The ``synthetic`` reader: 10 classes of shapes and textures in random colours, 32x32 RGB, 5000
train / 1000 test, generated deterministically; the shape, not the colour, carries the label."""

from __future__ import annotations

import functools

import numpy as np
import torch

from bayesncl.data.sources import CLEARS, Split, SplitKey, reader

SYNTHETIC_CLASSES = (
    "disk", "ring", "square", "frame", "h-stripes",
    "v-stripes", "diagonal", "checker", "cross", "triangle",
)
SYNTHETIC_SIZES = {"train": 5000, "test": 1000}
SYNTHETIC_SEED = 7


def _synthetic_mask(c: int, rng: np.random.Generator, m: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """The ``(m, s, s)`` foreground masks of ``m`` images of class ``c`` (its shape or texture)."""
    cx, cy = (rng.uniform(-0.3, 0.3, (2, m, 1, 1))).astype(np.float32)
    r = rng.uniform(0.45, 0.75, (m, 1, 1)).astype(np.float32)
    dx, dy = xx[None] - cx, yy[None] - cy
    freq = rng.uniform(2.5, 4.0, (m, 1, 1)).astype(np.float32) * np.pi
    phase = rng.uniform(0, 2 * np.pi, (m, 1, 1)).astype(np.float32)
    d = np.sqrt(dx**2 + dy**2)
    box = np.maximum(np.abs(dx), np.abs(dy))
    if c == 0:
        return d < r
    if c == 1:
        return np.abs(d - 0.75 * r) < 0.2 * r
    if c == 2:
        return box < 0.8 * r
    if c == 3:
        return (box < 0.8 * r) & (box > 0.5 * r)
    if c == 4:
        return np.sin(yy[None] * freq + phase) > 0
    if c == 5:
        return np.sin(xx[None] * freq + phase) > 0
    if c == 6:
        return np.sin((xx[None] + yy[None]) * freq * 0.75 + phase) > 0
    if c == 7:
        return np.sin(xx[None] * freq + phase) * np.sin(yy[None] * freq + phase) > 0
    if c == 8:
        w = 0.25 * r
        return ((np.abs(dx) < w) & (np.abs(dy) < r)) | ((np.abs(dy) < w) & (np.abs(dx) < r))
    return (dy < 0.7 * r) & (np.abs(dx) < (dy + 0.9 * r) * 0.6)


@functools.lru_cache(maxsize=4)
def _synthetic(split: str) -> tuple[torch.Tensor, np.ndarray]:
    """The synthetic split: uint8 ``(N, 3, 32, 32)`` images and int64 ``(N,)`` labels."""
    n = SYNTHETIC_SIZES[split]
    rng = np.random.default_rng([SYNTHETIC_SEED, 0 if split == "train" else 1])
    s = 32
    labels = rng.permutation(np.arange(n) % len(SYNTHETIC_CLASSES)).astype(np.int64)
    coords = (np.arange(s, dtype=np.float32) + 0.5) / s * 2 - 1
    yy, xx = np.meshgrid(coords, coords, indexing="ij")  # (s, s) in [-1, 1]
    masks = np.zeros((n, s, s), dtype=bool)
    for c in range(len(SYNTHETIC_CLASSES)):
        idx = np.flatnonzero(labels == c)
        masks[idx] = _synthetic_mask(c, rng, len(idx), xx, yy)
    # Colours: the foreground is light on a dark background or vice versa, so the shape survives
    # grayscale; hues are random, so colour alone says nothing about the class.
    light = rng.random(n) < 0.5
    fg_l = np.where(light, rng.uniform(0.65, 0.95, n), rng.uniform(0.05, 0.35, n))
    bg_l = np.where(light, rng.uniform(0.05, 0.35, n), rng.uniform(0.65, 0.95, n))
    tint_fg = rng.uniform(-0.25, 0.25, (n, 3))
    tint_bg = rng.uniform(-0.25, 0.25, (n, 3))
    fg = np.clip(fg_l[:, None] + tint_fg, 0, 1).astype(np.float32)
    bg = np.clip(bg_l[:, None] + tint_bg, 0, 1).astype(np.float32)
    img = np.where(masks[:, None], fg[:, :, None, None], bg[:, :, None, None])
    img = img + rng.normal(0, 0.05, img.shape).astype(np.float32)
    x = np.clip(np.round(img * 255), 0, 255).astype(np.uint8)
    return torch.from_numpy(x).contiguous(), labels


@reader("synthetic")
def read_synthetic(k: SplitKey) -> Split:
    x, y = _synthetic(k.split)
    stats = _synthetic_stats() if k.split == "train" else None  # the train split's, exact (no subsample)
    return Split(y, SYNTHETIC_CLASSES, f"synthetic(seed={SYNTHETIC_SEED})", images=x, stats=stats)


@functools.lru_cache(maxsize=1)
def _synthetic_stats() -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = _synthetic("train")[0].float().div_(255)
    return tuple(x.mean((0, 2, 3)).tolist()), tuple(x.std((0, 2, 3)).tolist())


CLEARS.append(_synthetic.cache_clear)
