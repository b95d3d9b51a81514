"""The ``cifar10`` / ``cifar100`` reader: torchvision's pickles (``cifar-10-batches-py`` /
``cifar-100-python`` under ``data.root``, ``./data`` or ``~/.cache/bayesncl``, or ``data.root``
itself), read here directly (no 160 MB MD5 check on every start)."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import numpy as np
import torch

from bayesncl.data.download import candidates, find_or_fetch
from bayesncl.data.sources import DataError, Split, SplitKey, reader

# name -> (folder, train files, test files, meta file, names key, labels key)
CIFAR = {
    "cifar10": (
        "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
        "batches.meta", "label_names", "labels",
    ),
    "cifar100": ("cifar-100-python", ("train",), ("test",), "meta", "fine_label_names", "fine_labels"),
}


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except Exception as e:  # noqa: BLE001 - a bad pickle is a data problem
        raise DataError(f"cannot read {path} as a CIFAR pickle: {type(e).__name__}: {e}") from None


def _fetch_cifar(name: str, where: str) -> None:
    from torchvision.datasets import CIFAR10, CIFAR100

    (CIFAR10 if name == "cifar10" else CIFAR100)(where, train=True, download=True)


@reader("cifar10", "cifar100")
def read_cifar(k: SplitKey) -> Split:
    name, split = k.name, k.split
    folder, train_files, test_files, meta_file, names_key, labels_key = CIFAR[name]
    subfolders = (folder, "") if k.root else (folder,)  # data.root may be the folder itself
    files = (*train_files, *test_files, meta_file)
    fetch = functools.partial(_fetch_cifar, name)
    d = find_or_fetch(name, k, subfolders, lambda d: all((d / f).is_file() for f in files), fetch)
    if d is None:
        searched = ", ".join(str(p) for p in candidates(k.root, subfolders))
        raise DataError(
            f"{name} not found: searched {searched} for torchvision's {folder}/ layout "
            f"({', '.join((*train_files, *test_files, meta_file))}); set data.root to the folder holding "
            f"{folder}/, or set data.download=true when online"
        )
    class_names = tuple(str(c) for c in _unpickle(d / meta_file)[names_key])
    images, labels = [], []
    for f in train_files if split == "train" else test_files:
        entry = _unpickle(d / f)
        try:
            data = np.asarray(entry["data"], dtype=np.uint8)
            lab = np.asarray(entry[labels_key], dtype=np.int64)
        except KeyError as e:
            raise DataError(f"{d / f}: missing key {e} (not torchvision's {name} format)") from None
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(lab):
            raise DataError(f"{d / f}: expected data (N, 3072) and N labels, got {data.shape}, {len(lab)}")
        images.append(data.reshape(-1, 3, 32, 32))
        labels.append(lab)
    y = np.concatenate(labels)
    if len(y) == 0:
        raise DataError(f"{d} holds no {split} images")
    if y.min() < 0 or y.max() >= len(class_names):
        raise DataError(f"{d}: labels out of range for {len(class_names)} classes")
    x = torch.from_numpy(np.concatenate(images)).contiguous()
    return Split(y, class_names, str(d), images=x)
