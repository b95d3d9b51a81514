"""STL-10 in torchvision's binary format (Coates, Lee & Ng 2011; https://cs.stanford.edu/~acoates/stl10/).

The folder ``stl10_binary/`` (under ``data.root``, ``./data`` or ``~/.cache/bayesncl``; ``data.root``
may be that folder itself) holds ``train_X.bin``/``train_y.bin`` (5000 labelled images),
``test_X.bin``/``test_y.bin`` (8000), ``unlabeled_X.bin`` (100000) and ``class_names.txt``.
An ``*_X.bin`` file is N x 3 x 96 x 96 uint8, each channel stored column-major (so it is transposed
here); a ``*_y.bin`` file is N uint8 labels 1..10.

``data.name=stl10`` trains on the labelled train split; with ``data.labels=none`` on
``unlabeled_X.bin`` followed by ``train_X.bin`` (105000 images, the usual pretraining set), without
labels. The test split is always ``test_X.bin`` with its labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.data.download import find_or_fetch
from bayesncl.data.sources import UNLABELED, DataError, Split, reader

FOLDER = "stl10_binary"
SIDE = 96
FILES = {"train": ("train_X.bin", "train_y.bin"), "test": ("test_X.bin", "test_y.bin")}
UNLABELED_FILE = "unlabeled_X.bin"
CLASS_FILE = "class_names.txt"


def _fetch(where: str) -> None:
    from torchvision.datasets import STL10

    STL10(where, split="train+unlabeled", download=True)


def read_images(path: Path) -> torch.Tensor:
    """uint8 (N, 3, 96, 96) row-major images of an STL-10 ``*_X.bin`` file. Raises DataError if it
    cannot be read or its size is not a whole number of images."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    per = 3 * SIDE * SIDE
    if raw.size == 0 or raw.size % per:
        raise DataError(f"{path}: {raw.size} bytes is not a whole number of 3x96x96 STL-10 images")
    # each channel is stored column-major: (N, C, W, H) -> (N, C, H, W)
    return torch.from_numpy(raw.reshape(-1, 3, SIDE, SIDE).transpose(0, 1, 3, 2).copy())


def read_labels(path: Path, n: int, num_classes: int) -> np.ndarray:
    """int64 labels 0..num_classes-1 of an STL-10 ``*_y.bin`` file (stored 1..num_classes)."""
    try:
        y = np.fromfile(path, dtype=np.uint8).astype(np.int64) - 1
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    if len(y) != n:
        raise DataError(f"{path}: {len(y)} labels for {n} images")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{path}: labels outside 1..{num_classes}")
    return y


def _class_names(d: Path) -> tuple[str, ...]:
    f = d / CLASS_FILE
    if not f.is_file():
        raise DataError(f"{d} lacks {CLASS_FILE} (torchvision's stl10_binary layout)")
    names = tuple(line.strip() for line in f.read_text(encoding="utf-8").splitlines() if line.strip())
    if not names:
        raise DataError(f"{f} lists no class names")
    return names


@reader("stl10")
def read(k: Any) -> Split:
    """One split of STL-10 (``k``: the source key of :mod:`bayesncl.data.sources`). Raises DataError."""
    x_files = (FILES["train"][0], FILES["test"][0])
    d = find_or_fetch("STL-10", k, ("", FOLDER), lambda d: all((d / f).is_file() for f in x_files), _fetch)
    if d is None:
        searched = k.root or "./data, ~/.cache/bayesncl"
        raise DataError(
            f"STL-10 not found in {searched} (also looked in {FOLDER}/ below): set data.root to the folder "
            f"holding {FOLDER}/ (train_X.bin, train_y.bin, test_X.bin, test_y.bin, {UNLABELED_FILE}, "
            f"{CLASS_FILE}), or data.download=true when online"
        )
    names = _class_names(d)
    x_file, y_file = FILES[k.split]
    x = read_images(d / x_file)
    if k.split == "train" and k.labels == "none":
        if not (d / UNLABELED_FILE).is_file():
            raise DataError(
                f"{d} lacks {UNLABELED_FILE}: data.labels=none pretrains on STL-10's unlabeled split"
            )
        x = torch.cat([read_images(d / UNLABELED_FILE), x])
        return Split(np.zeros(len(x), dtype=np.int64), (UNLABELED,), str(d), images=x, labeled=False)
    y = read_labels(d / y_file, len(x), len(names))
    return Split(y, names, str(d), images=x)

