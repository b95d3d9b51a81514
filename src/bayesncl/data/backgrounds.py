"""Datasets with a second label, the background (``place``): the paper's mechanism made visible.

* ``fashion-mnist-bg``: each Fashion-MNIST item (28 px, centred in 32 px) is composited onto a
  32 x 32 RGB procedural background, its gray level g the alpha of a white garment
  (``pixel = g + (1 - g) * background``); ten background kinds (:data:`PLACE_NAMES`), each instance
  with its own phase, frequency and colour jitter, generated from the fixed :data:`BG_SEED` (about
  2 s, no download). The place is uniform, independent of the class, unless
  ``data.bg_correlation=p``: then the *train* place is the class index with probability p (so
  P(place = class) = p + (1 - p) / 10); the test split stays independent (Waterbirds-style).
* ``waterbirds`` (Sagawa et al. 2020): ``data.root/metadata.csv`` with columns ``img_filename, y,
  split, place`` (split 0 train, 1 val, 2 test; y 1 waterbird; place 1 water), images at
  ``data.root/<img_filename>``; ``split="test"`` reads split 2 (1 when there is no 2).

:func:`places_of` gives a split's places (None without them); extract stores them as ``places``.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.data import sources as src
from bayesncl.data.download import expand
from bayesncl.data.fmnist import FMNIST_CLASSES

BG_SEED = 15  # fixed: the same composite images for every run
SIZE = 32
PLACE_NAMES = (
    "sky", "grass", "h-stripes", "v-stripes", "checker", "sunset", "plain-red", "plain-yellow", "water",
    "dots",
)
WATERBIRDS_CLASSES = ("landbird", "waterbird")
WATERBIRDS_PLACES = ("land", "water")
WATERBIRDS_COLUMNS = ("img_filename", "y", "split", "place")


# ============================================================================ procedural backgrounds
def _col(c: tuple[float, ...]) -> np.ndarray:
    return np.asarray(c, dtype=np.float32)[None, :, None, None]


def _gradient(top: tuple[float, ...], bottom: tuple[float, ...]) -> Callable[..., np.ndarray]:
    def make(rng: np.random.Generator, m: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
        shift = rng.uniform(-0.2, 0.2, (m, 1, 1)).astype(np.float32)
        t = np.clip(yy[None] + shift, 0, 1)[:, None]  # (m, 1, S, S)
        return _col(top) * (1 - t) + _col(bottom) * t

    return make


def _two_colour(
    pattern: Callable[..., np.ndarray], c0: tuple[float, ...], c1: tuple[float, ...]
) -> Callable[..., np.ndarray]:
    def make(rng: np.random.Generator, m: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
        freq = (rng.uniform(2.5, 4.5, (m, 1, 1)) * 2 * np.pi).astype(np.float32)
        phase = rng.uniform(0, 2 * np.pi, (m, 1, 1)).astype(np.float32)
        t = pattern(xx[None], yy[None], freq, phase).astype(np.float32)[:, None]
        return _col(c0) * (1 - t) + _col(c1) * t

    return make


def _grass(rng: np.random.Generator, m: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    blades = rng.standard_normal((m, 1, SIZE, SIZE), dtype=np.float32) * np.float32(0.12)
    return _col((0.20, 0.50, 0.15)) + blades * _col((0.5, 1.0, 0.4))


def _water(rng: np.random.Generator, m: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    freq = (rng.uniform(3.0, 5.0, (m, 1, 1)) * 2 * np.pi).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, (m, 1, 1)).astype(np.float32)
    t = (0.5 + 0.5 * np.sin(yy[None] * freq + 0.6 * np.sin(xx[None] * np.float32(2 * np.pi) + phase)))[
        :, None
    ]
    return _col((0.05, 0.25, 0.45)) * (1 - t) + _col((0.35, 0.65, 0.80)) * t


def _plain(colour: tuple[float, ...]) -> Callable[..., np.ndarray]:
    def make(rng: np.random.Generator, m: int, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
        return np.broadcast_to(_col(colour), (m, 3, SIZE, SIZE))

    return make


_KINDS: tuple[Callable[..., np.ndarray], ...] = (
    _gradient((0.15, 0.35, 0.80), (0.70, 0.82, 0.95)),  # sky
    _grass,
    _two_colour(
        lambda x, y, f, p: np.sin(y * f + p) > 0, (0.55, 0.30, 0.10), (0.90, 0.60, 0.20)
    ),  # h-stripes
    _two_colour(
        lambda x, y, f, p: np.sin(x * f + p) > 0, (0.40, 0.15, 0.50), (0.80, 0.75, 0.85)
    ),  # v-stripes
    _two_colour(  # checker
        lambda x, y, f, p: np.sin(x * f + p) * np.sin(y * f + p) > 0, (0.10, 0.40, 0.40), (0.50, 0.50, 0.50)
    ),
    _gradient((0.95, 0.55, 0.15), (0.35, 0.10, 0.40)),  # sunset
    _plain((0.75, 0.12, 0.12)),  # plain red
    _plain((0.85, 0.80, 0.15)),  # plain yellow
    _water,
    _two_colour(  # dots
        lambda x, y, f, p: (np.sin(x * f + p) > 0.6) & (np.sin(y * f + p) > 0.6),
        (0.10, 0.10, 0.12),
        (0.85, 0.85, 0.70),
    ),
)


def backgrounds(places: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Float ``(N, 3, 32, 32)`` backgrounds in [0, 1] of the kinds ``places`` (N,) (indices into
    :data:`PLACE_NAMES`), each with its own brightness (±0.08) and colour (±0.04 per channel) jitter."""
    n = len(places)
    coords = ((np.arange(SIZE) + 0.5) / SIZE).astype(np.float32)
    yy, xx = np.meshgrid(coords, coords, indexing="ij")  # (S, S) in [0, 1]
    out = np.empty((n, 3, SIZE, SIZE), dtype=np.float32)
    for kind, make in enumerate(_KINDS):
        idx = np.flatnonzero(places == kind)
        if idx.size:
            out[idx] = make(rng, idx.size, xx, yy)
    jitter = rng.uniform(-0.08, 0.08, (n, 1, 1, 1)) + rng.uniform(-0.04, 0.04, (n, 3, 1, 1))
    out += jitter.astype(np.float32)
    return np.clip(out, 0.0, 1.0, out=out)


def draw_places(labels: np.ndarray, p: float, rng: np.random.Generator) -> np.ndarray:
    """(N,) int64 places: the class index with probability ``p``, else uniform over the 10 kinds.
    The uniform draw and the coin are taken for every row whatever ``p``, so rows that do not
    follow their class get the same place for every ``p``."""
    uniform = rng.integers(0, len(PLACE_NAMES), len(labels))
    follow = rng.random(len(labels)) < p
    return np.where(follow, labels % len(PLACE_NAMES), uniform).astype(np.int64)


def composite(garments: np.ndarray, bg: np.ndarray) -> np.ndarray:
    """uint8 ``(N, 3, 32, 32)``: the gray garments ``(N, 28, 28)`` uint8, centred, as the alpha of
    white over the float backgrounds ``bg`` (N, 3, 32, 32) in [0, 1]."""
    pad = (SIZE - garments.shape[-1]) // 2
    g = np.zeros((len(garments), 1, SIZE, SIZE), dtype=np.float32)
    g[:, 0, pad : pad + garments.shape[1], pad : pad + garments.shape[2]] = garments / np.float32(255)
    return np.rint((g + (1 - g) * bg) * np.float32(255)).astype(np.uint8)


@src.reader("fashion-mnist-bg")
def read_fmnist_bg(k: Any) -> Any:
    """The reader of ``data.name=fashion-mnist-bg`` (see the module doc): a :class:`Split` of
    uint8 (N, 3, 32, 32) images with ``places``. Raises DataError where Fashion-MNIST is missing."""
    fm = src.read_cached(k._replace(name="fashion-mnist", bg_correlation=0.0))
    split_id = 0 if k.split == "train" else 1
    labels = fm.labels
    p = k.bg_correlation if k.split == "train" else 0.0
    places = draw_places(labels, p, np.random.default_rng([BG_SEED, split_id, 0]))
    rng = np.random.default_rng([BG_SEED, split_id, 1])
    garments = fm.images[:, 0].numpy()
    out = np.empty((len(labels), 3, SIZE, SIZE), dtype=np.uint8)
    step = 5000
    for i in range(0, len(labels), step):
        out[i : i + step] = composite(garments[i : i + step], backgrounds(places[i : i + step], rng))
    source = f"{fm.source} on procedural backgrounds (seed={BG_SEED}, bg_correlation={p:g})"
    return src.Split(labels, FMNIST_CLASSES, source, images=torch.from_numpy(out), places=places)


# ============================================================================ waterbirds
def _waterbirds_rows(root: Path) -> list[dict[str, str]]:
    meta = root / "metadata.csv"
    if not root.is_dir():
        raise src.DataError(f"Waterbirds folder {root} (data.root) does not exist or is not a folder")
    if not meta.is_file():
        raise src.DataError(
            f"Waterbirds folder {root} has no metadata.csv: expected the standard Waterbirds layout "
            f"(metadata.csv with columns {', '.join(WATERBIRDS_COLUMNS)}, images at root/<img_filename>)"
        )
    try:
        with meta.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in WATERBIRDS_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise src.DataError(
                    f"{meta} lacks the column(s) {', '.join(missing)} (expected "
                    f"{', '.join(WATERBIRDS_COLUMNS)})"
                )
            return list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise src.DataError(f"{meta} cannot be read: {e}") from None


@src.reader("waterbirds")
def read_waterbirds(k: Any) -> Any:
    """The reader of ``data.name=waterbirds`` (module doc): a path :class:`Split` with ``places``.
    Raises DataError (one line) without data.root, without metadata.csv, for missing columns, bad
    values (the line is named), or image files that do not exist (up to 3 are named, with the count)."""
    if not k.root:
        raise src.DataError("data.name=waterbirds needs data.root: the folder holding metadata.csv")
    root = expand(k.root)
    rows = _waterbirds_rows(root)
    table = []
    for line, r in enumerate(rows, start=2):  # line 1 is the header
        try:
            table.append((r["img_filename"], int(r["y"]), int(r["split"]), int(r["place"])))
        except (TypeError, ValueError):
            values = f"y={r['y']!r}, split={r['split']!r}, place={r['place']!r}"
            raise src.DataError(
                f"{root / 'metadata.csv'} line {line}: y, split and place must be integers, got {values}"
            ) from None
    present = {s for _, _, s, _ in table}
    want = 0 if k.split == "train" else (2 if 2 in present or 1 not in present else 1)
    chosen = [t for t in table if t[2] == want]
    if not chosen:
        raise src.DataError(f"{root / 'metadata.csv'} lists no images of split {want} ({k.split})")
    bad = [(y, p) for _, y, _, p in chosen if y not in (0, 1) or p not in (0, 1)]
    if bad:
        raise src.DataError(f"{root / 'metadata.csv'}: y and place must be 0 or 1, found {bad[0]}")
    paths = [str(root / f) for f, _, _, _ in chosen]
    absent = [p for p in paths if not Path(p).is_file()]
    if len(absent) == 1:
        raise src.DataError(f"Waterbirds image {absent[0]} listed in metadata.csv does not exist")
    if absent:
        more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
        raise src.DataError(
            f"{len(absent)} Waterbirds images listed in metadata.csv do not exist: "
            f"{', '.join(absent[:3])}{more}"
        )
    labels = np.asarray([y for _, y, _, _ in chosen], dtype=np.int64)
    places = np.asarray([p for _, _, _, p in chosen], dtype=np.int64)
    return src.Split(labels, WATERBIRDS_CLASSES, str(root), paths=paths, places=places)


# ============================================================================ access
def places_of(cfg: Any, split: str) -> np.ndarray | None:
    """(N,) int64 places of the (subset) ``split`` of ``cfg`` (a DataConfig), in the order of the
    eval loader's ``idx``; None for a dataset without places."""
    return src.load_split(cfg, split).places


def place_names(name: str) -> tuple[str, ...]:
    """The place names of dataset ``name`` (empty for a dataset without places)."""
    return {"fashion-mnist-bg": PLACE_NAMES, "waterbirds": WATERBIRDS_PLACES}.get(name, ())
