"""The ``fashion-mnist`` reader: the four idx files, gzipped or raw, read with NumPy; ONE gray
channel. Without ``data.root``: ``/usr/share/datasets/fashion-mnist`` (Debian
``dataset-fashion-mnist``), ``./data``, ``~/.cache/bayesncl``, each also in ``fashion-mnist/`` or
torchvision's ``FashionMNIST/raw/``."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from bayesncl.data.download import find_or_fetch
from bayesncl.data.sources import CACHE_DIR, DataError, Split, SplitKey, reader

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
FMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
FMNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _read_idx(path: Path) -> np.ndarray:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}") from None
    if len(data) < 8 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path} is not an idx file of unsigned bytes (bad magic number)")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: header says {dims}, found {arr.size} values")
    return arr.reshape(dims)


def _fmnist_file(d: Path, stem: str) -> Path | None:
    for suffix in (".gz", ""):
        p = d / (stem + suffix)
        if p.is_file():
            return p
    return None


def _fetch_fmnist(where: str) -> None:
    from torchvision.datasets import FashionMNIST

    for train in (True, False):
        FashionMNIST(where, train=train, download=True)


@reader("fashion-mnist")
def read_fmnist(k: SplitKey) -> Split:
    stems = [s for pair in FMNIST_FILES.values() for s in pair]
    d = find_or_fetch(
        "Fashion-MNIST", k, ("", "fashion-mnist", "FashionMNIST/raw"),
        lambda d: all(_fmnist_file(d, s) for s in stems), _fetch_fmnist, first=[DEBIAN_FMNIST],
    )
    if d is None:
        searched = [k.root] if k.root else [str(DEBIAN_FMNIST), "./data", str(CACHE_DIR)]
        raise DataError(
            f"Fashion-MNIST not found in {', '.join(searched)} (also looked in fashion-mnist/ and "
            f"FashionMNIST/raw/ below them): install it with `apt-get install dataset-fashion-mnist`, or "
            f"set data.root to a folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
            f"t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz, or set data.download=true when online"
        )
    img_stem, lbl_stem = FMNIST_FILES[k.split]
    img_path, lbl_path = _fmnist_file(d, img_stem), _fmnist_file(d, lbl_stem)
    assert img_path is not None and lbl_path is not None
    images, labels = _read_idx(img_path), _read_idx(lbl_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{img_path} / {lbl_path}: expected (N, H, W) images and (N,) labels; "
            f"found images of shape {tuple(images.shape)} and labels of shape {tuple(labels.shape)}"
        )
    if len(labels) == 0:
        raise DataError(
            f"{img_path} holds no images: re-install with `apt-get install --reinstall dataset-fashion-mnist`"
        )
    if labels.max() >= len(FMNIST_CLASSES):
        raise DataError(f"{lbl_path}: label {labels.max()} out of range for Fashion-MNIST's 10 classes")
    tensor = torch.from_numpy(images.copy()).unsqueeze(1).contiguous()
    return Split(labels.astype(np.int64), FMNIST_CLASSES, str(d), images=tensor)
