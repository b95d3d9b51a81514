"""dSprites (Matthey et al. 2017), generated here: ``data.name=dsprites``, no download.

The DeepMind definition: every combination of 5 factors, 3 shapes (square, ellipse, heart) × 6
scales (linearly spaced in [0.5, 1]) × 40 orientations (40 values linearly spaced in [0, 2π], both
ends included, as in the released ``latents_values``) × 32 × 32 positions (linearly spaced in
[0, 1]) = 737,280 binary 64 × 64 images, white sprite on black, in the released order (posY varies
fastest, shape slowest). DeepMind did not publish their renderer; ours draws each sprite from an
implicit shape at pixel centres (no anti-aliasing, as the released images are binary): a square
of half-side R, an ellipse of half-axes (R, R/2), and the classic algebraic heart
(x² + y² − 1)³ − x² y³ ≤ 0 scaled to about 2R, where R = 0.15 · scale of the image side, the centre
at 0.2 + 0.6 · pos of the side, and the shape turned by the orientation (counter-clockwise).

Splits (dSprites has none): ``train`` is the whole grid, or with ``data.train_subset=n`` the first
n grid points of one permutation seeded by :data:`DSPRITES_SEED`; ``test`` is the next
``data.test_subset`` (default :data:`TEST_SIZE`, disentanglement_lib's MIG sample) points of that
permutation (disjoint from a train subset; inside the whole grid). Only those images are drawn, so
a subset is cheap. Labels are the shape (3 classes); every image's factor codes are the split's
``factors`` (N, 5) int64, in :data:`FACTOR_NAMES` order, and extract stores them as ``factors``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from bayesncl.data import sources as src

SHAPES = ("square", "ellipse", "heart")
FACTOR_NAMES = ("shape", "scale", "orientation", "posX", "posY")
FACTOR_SIZES = (3, 6, 40, 32, 32)
FACTOR_VALUES: tuple[np.ndarray, ...] = (
    np.arange(3, dtype=np.float64) + 1,  # the released latents_values: 1, 2, 3
    np.linspace(0.5, 1.0, 6),
    np.linspace(0.0, 2 * np.pi, 40),
    np.linspace(0.0, 1.0, 32),
    np.linspace(0.0, 1.0, 32),
)
SIZE = 64
NUM_IMAGES = int(np.prod(FACTOR_SIZES))  # 737,280
DSPRITES_SEED = 2017  # fixed: the same subsets for every method and run seed
TEST_SIZE = 10_000
RADIUS = 0.15  # sprite size R at scale 1, as a fraction of the image side
CHUNK = 4096  # images drawn at once


def grid_factors(indices: np.ndarray) -> np.ndarray:
    """(N, 5) int64 factor codes of the grid ``indices`` (N,) in the released order."""
    codes = np.unravel_index(np.asarray(indices, dtype=np.int64), FACTOR_SIZES)
    return np.stack(codes, axis=1).astype(np.int64)


def render(factors: np.ndarray) -> np.ndarray:
    """uint8 ``(N, 64, 64)`` images (0 or 255) of the factor codes ``factors`` (N, 5) (module doc)."""
    n = len(factors)
    out = np.empty((n, SIZE, SIZE), dtype=np.uint8)
    coords = ((np.arange(SIZE) + 0.5) / SIZE).astype(np.float32)
    yy, xx = np.meshgrid(coords, coords, indexing="ij")  # row (down), column (right) in [0, 1]
    for lo in range(0, n, CHUNK):
        f = factors[lo : lo + CHUNK]
        scale = FACTOR_VALUES[1][f[:, 1]].astype(np.float32)[:, None, None]
        theta = FACTOR_VALUES[2][f[:, 2]].astype(np.float32)[:, None, None]
        cx = (0.2 + 0.6 * FACTOR_VALUES[3][f[:, 3]]).astype(np.float32)[:, None, None]
        cy = (0.2 + 0.6 * FACTOR_VALUES[4][f[:, 4]]).astype(np.float32)[:, None, None]
        dx, dy = xx[None] - cx, cy - yy[None]  # y up
        cos, sin = np.cos(theta), np.sin(theta)
        r = RADIUS * scale
        u, v = (cos * dx + sin * dy) / r, (-sin * dx + cos * dy) / r  # the sprite's own frame, unit R
        inside = np.empty(u.shape, dtype=bool)
        for s in range(3):
            rows = f[:, 0] == s
            if rows.any():
                inside[rows] = _shape(s, u[rows], v[rows])
        out[lo : lo + CHUNK] = inside.astype(np.uint8) * np.uint8(255)
    return out


def _shape(s: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inside-masks of shape ``s`` at the sprite-frame coordinates ``u``, ``v`` (units of R)."""
    if s == 0:
        return np.maximum(np.abs(u), np.abs(v)) <= 1.0
    if s == 1:
        return u**2 + (2 * v) ** 2 <= 1.0
    x, y = u * 1.15, v * 1.15 + 0.12  # the heart spans x in ±1.14, y in [-1, 1.25]: centred, about 2R
    return (x**2 + y**2 - 1) ** 3 - x**2 * y**3 <= 0


def split_indices(split: str, sizes: tuple[int, int]) -> np.ndarray:
    """Sorted grid indices of ``split`` for ``sizes`` = (train_subset, test_subset) (module doc)."""
    n_train, n_test = sizes
    if split == "train" and (n_train <= 0 or n_train >= NUM_IMAGES):
        return np.arange(NUM_IMAGES)
    perm = np.random.default_rng(DSPRITES_SEED).permutation(NUM_IMAGES)
    if split == "train":
        return np.sort(perm[:n_train])
    start = n_train if 0 < n_train < NUM_IMAGES else 0
    n_test = n_test if n_test > 0 else TEST_SIZE
    return np.sort(perm[start : start + n_test] if start + n_test <= NUM_IMAGES else perm[-n_test:])


@functools.lru_cache(maxsize=4)
def _generate(split: str, sizes: tuple[int, int]) -> tuple[torch.Tensor, np.ndarray]:
    factors = grid_factors(split_indices(split, sizes))
    return torch.from_numpy(render(factors)).unsqueeze(1).contiguous(), factors


@src.reader("dsprites", geometry=lambda cfg: (1, SIZE))
def read_dsprites(k: Any) -> src.Split:
    """The reader of ``data.name=dsprites``: a :class:`~bayesncl.data.sources.Split` of uint8
    (N, 1, 64, 64) images, shape labels and ``factors`` (N, 5)."""
    images, factors = _generate(k.split, tuple(k.sizes))
    source = f"dSprites, generated (seed={DSPRITES_SEED}, {len(factors)} of {NUM_IMAGES} images)"
    return src.Split(factors[:, 0].copy(), SHAPES, source, images=images, factors=factors)


def factors_of(cfg: Any, split: str) -> np.ndarray | None:
    """(N, F) int64 factor codes of the (subset) ``split`` of ``cfg`` (a DataConfig), in the eval
    loader's ``idx`` order; None for a dataset without factors."""
    return src.load_split(cfg, split).factors


def factor_names(name: str) -> tuple[str, ...]:
    """The factor names of dataset ``name`` (empty for a dataset without factors)."""
    return FACTOR_NAMES if name == "dsprites" else ()


src.NATIVE_SIZE["dsprites"] = SIZE
src.STATS["dsprites"] = ((0.0368,), (0.1884,))  # measured on a 20,000-image train subset
