"""Datasets, subsets and the two loader paths (resident batched / per-sample DataLoader).

Datasets (``data.name``):

* ``fashion-mnist``: the four idx files (``{train,t10k}-{images-idx3,labels-idx1}-ubyte``, gzipped
  or raw), read with NumPy. With ``data.root`` unset the search order is
  ``/usr/share/datasets/fashion-mnist`` (Debian package ``dataset-fashion-mnist``), ``./data``,
  ``~/.cache/bayesncl``; in each place the files may sit in the folder itself, in
  ``fashion-mnist/`` or in torchvision's ``FashionMNIST/raw/`` layout. ``data.download=true``
  lets torchvision fetch them into ``data.root`` (or ``~/.cache/bayesncl``) when nothing is found.
* ``cifar10`` / ``cifar100``: torchvision's on-disk format (``cifar-10-batches-py`` /
  ``cifar-100-python`` under ``data.root``, ``./data`` or ``~/.cache/bayesncl``; ``data.root`` may
  also be that folder itself). The pickles are read here directly (no 160 MB MD5 check on every
  start); torchvision is used only to download (``data.download=true``).
* ``imagefolder``: ``root/train/<class>/*`` and ``root/val/<class>/*`` (``root/test`` if there is
  no ``val``), classes = the train folder's sub-folders, sorted. ``split="test"`` means ``val``.
* ``synthetic``: 10 classes of shapes and textures (disk, ring, square, ...) in random colours,
  positions and sizes on a noisy background, 32x32 RGB, 5000 train / 1000 test, generated
  deterministically (fixed seed) in about a second. The shape, not the colour, carries the label,
  so it survives colour jitter and grayscale: learnable, for tests and timing.

Gray images (Fashion-MNIST) keep ONE channel (``DatasetInfo.channels == 1``): colour jitter
reduces to brightness + contrast; saturation, hue and grayscale are skipped (see
:mod:`bayesncl.data.augment`).

Corrupt images (imagefolder): a split of at most :data:`VERIFY_MAX_FILES` files is verified
upfront with ``PIL.Image.verify`` (reads every file, decodes nothing; a fraction of a second per
thousand small files). A corrupt file raises :class:`DataError` naming it, or, with
``data.skip_corrupt=true``, is dropped with a logging warning and counted in ``num_skipped``.
Larger splits are not verified upfront (too slow for ImageNet-size folders); a file that fails
to decode at load time raises DataError naming it, or with ``skip_corrupt`` is replaced by the
next readable image of the split and counted (in that process: DataLoader workers count and warn
separately). ``verify`` cannot see every truncation, so load-time handling applies to small
folders too.

Subsets: ``train_subset`` / ``test_subset`` > 0 pick a class-stratified subset (per-class quotas
proportional to class frequency, largest remainder) with the fixed seed :data:`SUBSET_SEED`, so
every method and seed in a comparison sees the same images; kept in the split's original order.
Eval ``idx`` values and :func:`load_split_images` index the (subset) split.

Image size: ``image_size=0`` is the native size (28 Fashion-MNIST, 32 CIFAR/synthetic, 224
folders). Training crops come from the native image and are resized to S; evaluation resizes
(bilinear, antialiased); folder images are evaluated at "resize shorter side to S*256/224, centre
crop S" (the ImageNet protocol).

Loader paths: ``resident=auto`` uses the resident path for fashion-mnist/cifar/synthetic and the
per-sample path for imagefolder; ``resident=true`` for imagefolder decodes every image once at
"shorter side S, centre crop S" into memory (training crops then come from that square).

Determinism: the epoch permutation comes from a ``torch.Generator`` seeded with
``mix_seed(seed, epoch)`` (same on every rank, then rank-strided); the augmentation of step
``t`` (resident) or of the ``j``-th sample of the rank's epoch order (per-sample) runs under a
forked global RNG seeded with ``mix_seed(seed, epoch, rank, t or j)``. So the batches of an
epoch are a function of ``(seed, epoch, rank)`` only — independent of ``num_workers``, of
earlier epochs and of the caller's RNG, which is left untouched. Call ``set_epoch(e)`` before
each epoch (like ``DistributedSampler``); iterating twice without it replays the same epoch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import logging
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bayesncl.data.augment import (
    AugmentSpec,
    BatchAugment,
    eval_folder_transform,
    mix_seed,
    sample_transform,
    seeded,
)

logger = logging.getLogger("bayesncl.data")

__all__ = [
    "DataError",
    "DatasetInfo",
    "EvalLoader",
    "LazyImages",
    "PerSampleTwoViewLoader",
    "ResidentTwoViewLoader",
    "TwoViewLoader",
    "augment_spec",
    "build_eval_loader",
    "build_train_loader",
    "clear_cache",
    "dataset_info",
    "image_geometry",
    "load_split_images",
    "stratified_subset",
    "subset_indices",
    "uses_resident",
]

DATASETS = ("fashion-mnist", "cifar10", "cifar100", "imagefolder", "synthetic")
NATIVE_SIZE = {"fashion-mnist": 28, "cifar10": 32, "cifar100": 32, "synthetic": 32, "imagefolder": 224}
SUBSET_SEED = 20240601  # fixed: the same subset for every method and run seed
VERIFY_MAX_FILES = 20_000  # imagefolder splits up to this size are verified upfront
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
CACHE_DIR = Path("~/.cache/bayesncl")

# Per-channel statistics of the train splits (ImageNet's for folders).
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}

FMNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
FMNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SYNTHETIC_CLASSES = (
    "disk", "ring", "square", "frame", "h-stripes",
    "v-stripes", "diagonal", "checker", "cross", "triangle",
)
SYNTHETIC_SIZES = {"train": 5000, "test": 1000}
SYNTHETIC_SEED = 7

# name -> (folder, train files, test files, meta file, names key, labels key)
CIFAR = {
    "cifar10": (
        "cifar-10-batches-py", tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
        "batches.meta", "label_names", "labels",
    ),
    "cifar100": ("cifar-100-python", ("train",), ("test",), "meta", "fine_label_names", "fine_labels"),
}

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class DataError(ValueError):
    """A data problem (missing files, corrupt image, impossible batch size), reported as one line.

    Raised in a DataLoader worker (``data.num_workers`` > 0), it comes back as ``DataError("Caught
    DataError in DataLoader worker process N.\nOriginal Traceback ...")``: the message is then the
    original one, the traceback's last line, not the whole traceback."""

    def __init__(self, *args: Any) -> None:
        if len(args) == 1 and isinstance(args[0], str) and _WORKER_TRACEBACK.match(args[0]):
            last = args[0].rstrip().splitlines()[-1]
            args = (re.sub(r"^[\w.]+: ", "", last, count=1),)  # "bayesncl.data.datasets.DataError: ..."
        super().__init__(*args)


_WORKER_TRACEBACK = re.compile(r"Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")


class ShardDataError(DataError):
    """A data problem met while training on one process's shard (an image folder's image that cannot
    be decoded, found only when read): under ``torchrun`` only the process reading it meets it, so
    that process prints it, not its node's first process (which never sees it)."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the model and the reports need to know about a dataset (cheap: no augmentation).

    ``image_size`` is the effective side S the loaders yield; ``num_train``/``num_test`` count the
    (subset) splits; ``mean``/``std`` are the normalisation statistics; ``train_class_counts``: the
    (subset) train split's images per class, in class order.
    """

    num_classes: int
    channels: int
    image_size: int
    class_names: tuple[str, ...]
    num_train: int
    num_test: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    name: str = ""
    train_class_counts: tuple[int, ...] = ()


@dataclass
class _Split:
    """One full (not subset) split as loaded from disk."""

    labels: np.ndarray  # (N,) int64
    class_names: tuple[str, ...]
    source: str
    images: torch.Tensor | None = None  # uint8 (N, C, H, W) for tensor datasets
    paths: list[str] | None = None  # imagefolder
    skipped: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)


# ============================================================================ helpers
def _cfg_get(cfg: Any, name: str, default: Any) -> Any:
    return getattr(cfg, name, default)


def _check_name(cfg: Any) -> str:
    name = str(cfg.name)
    if name not in DATASETS:
        raise DataError(f"data.name={name!r}: expected one of {', '.join(DATASETS)}")
    return name


def _check_split(split: str) -> str:
    if split not in ("train", "test"):
        raise DataError(f"split={split!r}: expected 'train' or 'test'")
    return split


def _expand(p: str | Path) -> Path:
    return Path(os.path.expanduser(str(p)))


def _default_bases() -> list[Path]:
    return [Path.cwd() / "data", _expand(CACHE_DIR)]


def clear_cache() -> None:
    """Forget the in-process cache of loaded splits (e.g. after files changed on disk)."""
    _load_split_cached.cache_clear()
    _synthetic.cache_clear()
    _SUBSET_WARNED.clear()


def uses_resident(cfg: Any) -> bool:
    """Whether ``cfg`` selects the resident (batched, on-device) training path."""
    mode = str(_cfg_get(cfg, "resident", "auto")).lower()
    if mode in ("true", "1", "yes"):
        return True
    if mode in ("false", "0", "no"):
        return False
    if mode != "auto":
        raise DataError(f"data.resident={mode!r}: expected auto, true or false")
    return _check_name(cfg) != "imagefolder"


def _image_size(cfg: Any, name: str) -> int:
    s = int(_cfg_get(cfg, "image_size", 0) or 0)
    if s < 0:
        raise DataError(f"data.image_size={s}: expected >= 0 (0 = native)")
    return s or NATIVE_SIZE[name]


# ============================================================================ fashion-mnist
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


def _fmnist_dirs(root: str | None) -> list[Path]:
    bases = [_expand(root)] if root else [DEBIAN_FMNIST, *_default_bases()]
    out: list[Path] = []
    for b in bases:
        out += [b, b / "fashion-mnist", b / "FashionMNIST" / "raw"]
    return out


def _find_fmnist(root: str | None) -> Path | None:
    stems = [s for pair in FMNIST_FILES.values() for s in pair]
    for d in _fmnist_dirs(root):
        if d.is_dir() and all(_fmnist_file(d, s) for s in stems):
            return d
    return None


def _fmnist_missing(root: str | None) -> DataError:
    searched = [root] if root else [str(DEBIAN_FMNIST), "./data", str(CACHE_DIR)]
    return DataError(
        f"Fashion-MNIST not found in {', '.join(searched)} (also looked in fashion-mnist/ and "
        f"FashionMNIST/raw/ below them): install it with `apt-get install dataset-fashion-mnist`, or "
        f"set data.root to a folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        f"t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz, or set data.download=true when online"
    )


def _download(what: str, target: Path, fetch: Callable[[str], Any]) -> None:
    """Run torchvision's download ``fetch(str(target))``. On failure (offline, disk full, ...) remove
    every file and folder it created, so a failed download leaves the disk as it was, and raise a
    one-line DataError."""
    before = set(target.rglob("*")) if target.is_dir() else None
    try:
        fetch(str(target))
    except Exception as e:  # noqa: BLE001 - any network/IO failure becomes one line
        if before is None:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for new in sorted(set(target.rglob("*")) - before, reverse=True):  # children first
                with contextlib.suppress(OSError):
                    if new.is_dir() and not new.is_symlink():
                        new.rmdir()
                    else:
                        new.unlink()
        raise DataError(
            f"downloading {what} into {target} failed ({_download_failure(e)}): copy the files there by "
            "hand, or set data.root"
        ) from None


def _download_failure(e: BaseException) -> str:
    """Why a download failed, in one line. torchvision's MNIST-style error says it on later lines
    (``Error downloading X:`` / ``Tried MIRROR, got:`` / ``<urlopen error ...>``): the first line is
    completed with the distinct reasons; with none there, with the exception's cause, else with the
    usual one (no network, or the server refused)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    head = lines[0] if lines else ""
    if head and not head.endswith(":"):
        return head
    reasons = list(dict.fromkeys(line for line in lines[1:] if not line.endswith(":")))  # not "Tried X, got:"
    cause, seen = e.__cause__ or e.__context__, {id(e)}
    while not reasons and cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = str(cause).strip()
        if text:
            reasons = [text.splitlines()[0].strip()]
        cause = cause.__cause__ or cause.__context__
    if not head:
        return f"{type(e).__name__}: {reasons[0]}" if reasons else type(e).__name__
    return f"{head} {'; '.join(reasons) or 'no network connection, or the server refused it'}"


def _load_fmnist(root: str | None, download: bool, split: str) -> _Split:
    d = _find_fmnist(root)
    if d is None and download:
        target = _expand(root) if root else _expand(CACHE_DIR)

        def fetch(where: str) -> None:
            from torchvision.datasets import FashionMNIST

            for train in (True, False):
                FashionMNIST(where, train=train, download=True)

        _download("Fashion-MNIST", target, fetch)
        d = _find_fmnist(str(target))
    if d is None:
        raise _fmnist_missing(root)
    img_stem, lbl_stem = FMNIST_FILES[split]
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
    return _Split(labels.astype(np.int64), FMNIST_CLASSES, str(d), images=tensor)


# ============================================================================ cifar
def _cifar_candidates(name: str, root: str | None) -> list[Path]:
    folder = CIFAR[name][0]
    if root:
        r = _expand(root)
        return [r / folder, r]
    return [b / folder for b in _default_bases()]


def _cifar_complete(name: str, d: Path) -> bool:
    _, train, test, meta, _, _ = CIFAR[name]
    return d.is_dir() and all((d / f).is_file() for f in (*train, *test, meta))


def _find_cifar(name: str, root: str | None) -> Path | None:
    for d in _cifar_candidates(name, root):
        if _cifar_complete(name, d):
            return d
    return None


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except Exception as e:  # noqa: BLE001 - a bad pickle is a data problem
        raise DataError(f"cannot read {path} as a CIFAR pickle: {type(e).__name__}: {e}") from None


def _load_cifar(name: str, root: str | None, download: bool, split: str) -> _Split:
    folder, train_files, test_files, meta_file, names_key, labels_key = CIFAR[name]
    d = _find_cifar(name, root)
    if d is None and download:
        target = _expand(root) if root else _expand(CACHE_DIR)

        def fetch(where: str) -> None:
            from torchvision.datasets import CIFAR10, CIFAR100

            (CIFAR10 if name == "cifar10" else CIFAR100)(where, train=True, download=True)

        _download(name, target, fetch)
        d = _find_cifar(name, str(target))
    if d is None:
        searched = ", ".join(str(p) for p in _cifar_candidates(name, root))
        raise DataError(
            f"{name} not found: searched {searched} for torchvision's {folder}/ layout "
            f"({', '.join((*train_files, *test_files, meta_file))}); set data.root to the folder holding "
            f"{folder}/, or set data.download=true when online"
        )
    meta = _unpickle(d / meta_file)
    class_names = tuple(str(c) for c in meta[names_key])
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
    return _Split(y, class_names, str(d), images=x)


# ============================================================================ synthetic
@functools.lru_cache(maxsize=4)
def _synthetic(split: str) -> tuple[torch.Tensor, np.ndarray]:
    n = SYNTHETIC_SIZES[split]
    rng = np.random.default_rng([SYNTHETIC_SEED, 0 if split == "train" else 1])
    s = 32
    labels = rng.permutation(np.arange(n) % len(SYNTHETIC_CLASSES)).astype(np.int64)
    coords = (np.arange(s, dtype=np.float32) + 0.5) / s * 2 - 1
    yy, xx = np.meshgrid(coords, coords, indexing="ij")  # (s, s) in [-1, 1]
    masks = np.zeros((n, s, s), dtype=bool)
    for c in range(len(SYNTHETIC_CLASSES)):
        idx = np.flatnonzero(labels == c)
        m = len(idx)
        cx, cy = (rng.uniform(-0.3, 0.3, (2, m, 1, 1))).astype(np.float32)
        r = rng.uniform(0.45, 0.75, (m, 1, 1)).astype(np.float32)
        dx, dy = xx[None] - cx, yy[None] - cy
        freq = rng.uniform(2.5, 4.0, (m, 1, 1)).astype(np.float32) * np.pi
        phase = rng.uniform(0, 2 * np.pi, (m, 1, 1)).astype(np.float32)
        d = np.sqrt(dx**2 + dy**2)
        box = np.maximum(np.abs(dx), np.abs(dy))
        if c == 0:
            mk = d < r
        elif c == 1:
            mk = np.abs(d - 0.75 * r) < 0.2 * r
        elif c == 2:
            mk = box < 0.8 * r
        elif c == 3:
            mk = (box < 0.8 * r) & (box > 0.5 * r)
        elif c == 4:
            mk = np.sin(yy[None] * freq + phase) > 0
        elif c == 5:
            mk = np.sin(xx[None] * freq + phase) > 0
        elif c == 6:
            mk = np.sin((xx[None] + yy[None]) * freq * 0.75 + phase) > 0
        elif c == 7:
            mk = np.sin(xx[None] * freq + phase) * np.sin(yy[None] * freq + phase) > 0
        elif c == 8:
            w = 0.25 * r
            mk = ((np.abs(dx) < w) & (np.abs(dy) < r)) | ((np.abs(dy) < w) & (np.abs(dx) < r))
        else:
            mk = (dy < 0.7 * r) & (np.abs(dx) < (dy + 0.9 * r) * 0.6)
        masks[idx] = mk
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


@functools.lru_cache(maxsize=1)
def _synthetic_stats() -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = _synthetic("train")[0].float().div_(255)
    return tuple(x.mean((0, 2, 3)).tolist()), tuple(x.std((0, 2, 3)).tolist())


# ============================================================================ imagefolder
def _folder_root(root: str | None) -> Path:
    hint = "expected root/train/<class>/*.jpg and root/val/<class>/*.jpg (e.g. an ImageNet-100 folder)"
    if not root:
        raise DataError(f"data.name=imagefolder needs data.root: {hint}")
    r = _expand(root)
    if not r.is_dir():
        raise DataError(f"image folder {r} does not exist: {hint}")
    return r


def _folder_split_dir(r: Path, split: str) -> Path:
    if split == "train":
        return r / "train"
    return r / "val" if (r / "val").is_dir() or not (r / "test").is_dir() else r / "test"


def read_class_list(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The class folder names listed in a text file (``data.classes``), sorted.

    Names are separated by whitespace, commas or newlines (the CMC ImageNet-100 list is one line of
    WordNet ids); ``#`` starts a comment. Sorted like torchvision's ImageFolder, so an ImageNet-100
    taken from a full ImageNet folder gets the same labels as a ready-made ImageNet-100 folder.
    Raises DataError (one line) if the file is missing or unreadable, lists nothing, or repeats a name.
    """
    f = _expand(str(path))
    try:
        lines = f.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark is not a name
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise DataError(f"data.classes={path}: cannot read the class list ({reason})") from None
    names = [n for ln in lines for n in ln.split("#", 1)[0].replace(",", " ").split()]
    if not names:
        raise DataError(f"data.classes={path}: the file lists no class folder names")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"data.classes={path}: repeated class name(s) {', '.join(repeated[:5])}")
    return tuple(sorted(names))


def _scan_folder(
    d: Path, class_names: Sequence[str] | None, *, subset: bool = False
) -> tuple[list[str], np.ndarray, tuple[str, ...]]:
    """Image paths and labels of one split folder. ``class_names`` fixes the label order (None:
    the sorted sub-folders); ``subset=True`` takes only those classes (``data.classes``) and
    requires every one of them, else every sub-folder must be one of them."""
    hint = "expected <split>/<class>/<image files> (ImageFolder layout)"
    if not d.is_dir():
        raise DataError(f"image folder split {d} does not exist: {hint}")
    found = sorted(e.name for e in os.scandir(d) if e.is_dir())
    if class_names is None:
        class_names = tuple(found)
    if not class_names:
        raise DataError(f"image folder {d} has no class sub-folders (it is empty): {hint}")
    if subset:
        missing = sorted(set(class_names) - set(found))
        if missing:
            raise DataError(
                f"{d} lacks {len(missing)} of the {len(class_names)} classes listed in data.classes: "
                f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}"
            )
    unknown = [] if subset else sorted(set(found) - set(class_names))
    if unknown:
        raise DataError(f"{d} has class folders not in the train split: {', '.join(unknown[:5])}")
    paths: list[str] = []
    labels: list[int] = []
    for ci, c in enumerate(class_names):
        cdir = d / c
        if not cdir.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(cdir, followlinks=True):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.lower().endswith(IMG_EXTENSIONS):
                    paths.append(os.path.join(dirpath, fn))
                    labels.append(ci)
    if not paths:
        raise DataError(f"image folder {d} holds no images ({', '.join(IMG_EXTENSIONS)}): {hint}")
    return paths, np.asarray(labels, dtype=np.int64), tuple(class_names)


def _verify_image(path: str) -> str | None:
    """None if PIL can parse ``path``, else the reason."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.verify()
    except Exception as e:  # noqa: BLE001 - PIL raises many types for bad files
        return f"{type(e).__name__}: {e}"
    return None


def _corrupt_error(path: str, reason: str, more: int = 0) -> DataError:
    extra = f" (and {more} more corrupt files)" if more else ""
    return DataError(
        f"corrupt image {path} ({reason.splitlines()[0] if reason else 'unreadable'}){extra}: "
        f"fix or remove it, or set data.skip_corrupt=true to skip unreadable images"
    )


def _load_folder(root: str | None, split: str, skip_corrupt: bool, classes: str | None = None) -> _Split:
    r = _folder_root(root)
    train_dir = r / "train"
    class_names = read_class_list(classes) if classes else None
    if split == "test" and class_names is None:
        if not train_dir.is_dir():
            raise DataError(f"image folder {r} has no train/ sub-folder (needed for the class list)")
        class_names = tuple(sorted(e.name for e in os.scandir(train_dir) if e.is_dir()))
    paths, labels, names = _scan_folder(_folder_split_dir(r, split), class_names, subset=bool(classes))
    skipped: list[str] = []
    if len(paths) <= VERIFY_MAX_FILES:
        bad = [(p, why) for p in paths if (why := _verify_image(p)) is not None]
        if bad and not skip_corrupt:
            raise _corrupt_error(bad[0][0], bad[0][1], len(bad) - 1)
        if bad:
            skipped = [p for p, _ in bad]
            drop = set(skipped)
            keep = np.asarray([p not in drop for p in paths])
            paths = [p for p in paths if p not in drop]
            labels = labels[keep]
            logger.warning(
                "skipped %d corrupt image(s) in %s (data.skip_corrupt=true), first: %s",
                len(skipped), _folder_split_dir(r, split), skipped[0],
            )
            if not paths:
                raise DataError(f"every image in {_folder_split_dir(r, split)} is corrupt")
    return _Split(labels, names, str(_folder_split_dir(r, split)), paths=paths, skipped=skipped)


# ============================================================================ loading + subsets
@functools.lru_cache(maxsize=6)
def _load_split_cached(
    name: str, root: str | None, download: bool, split: str, skip_corrupt: bool, classes: str | None = None
) -> _Split:
    if name == "fashion-mnist":
        return _load_fmnist(root, download, split)
    if name in CIFAR:
        return _load_cifar(name, root, download, split)
    if name == "synthetic":
        x, y = _synthetic(split)
        return _Split(y, SYNTHETIC_CLASSES, f"synthetic(seed={SYNTHETIC_SEED})", images=x)
    return _load_folder(root, split, skip_corrupt, classes)


def _load_full(cfg: Any, split: str) -> _Split:
    name = _check_name(cfg)
    root = _cfg_get(cfg, "root", None)
    return _load_split_cached(
        name,
        str(root) if root else None,
        bool(_cfg_get(cfg, "download", False)),
        _check_split(split),
        bool(_cfg_get(cfg, "skip_corrupt", False)),
        _cfg_get(cfg, "classes", None) or None,
    )


def stratified_subset(labels: np.ndarray, k: int, seed: int = SUBSET_SEED) -> np.ndarray:
    """Sorted indices of a class-stratified subset of size ``min(k, N)``, deterministic in ``seed``.

    Per-class quotas are ``k * n_c / N`` rounded by largest remainder (ties → lower class id);
    within a class the members are a seeded random choice.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if k <= 0 or k >= n:
        return np.arange(n)
    classes, counts = np.unique(labels, return_counts=True)
    exact = k * counts / n
    quota = np.floor(exact).astype(np.int64)
    rest = k - int(quota.sum())
    order = np.lexsort((classes, -(exact - quota)))  # largest remainder first, then class id
    quota[order[:rest]] += 1
    rng = np.random.default_rng([seed, k, n])
    chosen = []
    for c, q in zip(classes, quota, strict=True):
        members = np.flatnonzero(labels == c)
        chosen.append(rng.permutation(members)[:q])
    return np.sort(np.concatenate(chosen))


def subset_indices(cfg: Any, split: str) -> np.ndarray:
    """Indices into the full split of the images ``cfg`` uses (``data.train_subset``/``test_subset``)."""
    full = _load_full(cfg, split)
    k = int(_cfg_get(cfg, f"{split}_subset", 0) or 0)
    return stratified_subset(full.labels, k)


# (split, subset size, source) of the subsets already warned about as larger than their split
_SUBSET_WARNED: set[tuple[str, int, str]] = set()


def _load(cfg: Any, split: str) -> _Split:
    """The (subset) split."""
    full = _load_full(cfg, split)
    k = int(_cfg_get(cfg, f"{split}_subset", 0) or 0)
    if k > len(full) and (split, k, full.source) not in _SUBSET_WARNED:
        _SUBSET_WARNED.add((split, k, full.source))  # once: every loader of a run loads the split again
        warnings.warn(
            f"data.{split}_subset={k} is more than the {len(full)} images of the {split} split: the whole "
            "split is used",
            stacklevel=2,
        )
    if k <= 0 or k >= len(full):
        return full
    idx = stratified_subset(full.labels, k)
    return _Split(
        full.labels[idx],
        full.class_names,
        full.source,
        images=full.images[torch.from_numpy(idx)] if full.images is not None else None,
        paths=[full.paths[i] for i in idx] if full.paths is not None else None,
        skipped=full.skipped,
    )


def _stats(name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return _synthetic_stats() if name == "synthetic" else STATS[name]


def image_geometry(cfg: Any) -> tuple[int, int]:
    """``(channels, image size in px)`` of the images ``cfg`` (a DataConfig) feeds the model, read
    from the config alone (no data files): 1 channel for fashion-mnist, else 3 (RGB). Raises DataError."""
    name = _check_name(cfg)
    return (1 if name == "fashion-mnist" else 3), _image_size(cfg, name)


def dataset_info(cfg: Any) -> DatasetInfo:
    """Classes, channels, effective image size and (subset) split sizes of ``cfg`` (a DataConfig).

    Reads the data files (cached in-process for the loaders), augments nothing. Raises DataError.
    """
    name = _check_name(cfg)
    train, test = _load(cfg, "train"), _load(cfg, "test")
    channels, image_size = image_geometry(cfg)
    mean, std = _stats(name)
    num_classes = len(train.class_names)
    return DatasetInfo(
        num_classes=num_classes,
        channels=channels,
        image_size=image_size,
        class_names=tuple(train.class_names),
        num_train=len(train),
        num_test=len(test),
        mean=mean,
        std=std,
        name=name,
        train_class_counts=tuple(
            int(c) for c in np.bincount(np.asarray(train.labels, dtype=np.int64), minlength=num_classes)
        ),
    )


def augment_spec(cfg: Any, info: DatasetInfo | None = None) -> AugmentSpec:
    """The training augmentation distribution for ``cfg`` (PAPER-NOTES §2)."""
    info = info or dataset_info(cfg)
    return AugmentSpec.simclr(
        info.image_size,
        info.channels,
        info.mean,
        info.std,
        crop_min_scale=float(_cfg_get(cfg, "crop_min_scale", 0.08)),
        blur_prob=float(_cfg_get(cfg, "blur_prob", 0.5)),
    )


# ============================================================================ image access
def _open_rgb(path: str):
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


class _FolderImages:
    """Decode folder images by index, with the corrupt-file policy at load time."""

    def __init__(self, paths: list[str], skip_corrupt: bool) -> None:
        self.paths = paths
        self.skip_corrupt = skip_corrupt
        self.num_skipped = 0

    def __len__(self) -> int:
        return len(self.paths)

    def get(self, i: int) -> tuple[Any, int]:
        """``(PIL image, index actually used)``: with skip_corrupt a bad file is replaced by the next."""
        for attempt in range(min(len(self.paths), 50)):
            j = (i + attempt) % len(self.paths)
            try:
                return _open_rgb(self.paths[j]), j
            except Exception as e:  # noqa: BLE001 - PIL raises many types for bad files
                if not self.skip_corrupt:
                    raise _corrupt_error(self.paths[j], f"{type(e).__name__}: {e}") from None
                self.num_skipped += 1
                logger.warning("skipping corrupt image %s (%s: %s)", self.paths[j], type(e).__name__, e)
        raise DataError(f"no readable image near index {i} of {len(self.paths)} in the image folder")


def _tensor_pil(images: torch.Tensor, i: int) -> tuple[Any, int]:
    from PIL import Image

    a = images[i].numpy()
    img = Image.fromarray(a[0], mode="L") if a.shape[0] == 1 else Image.fromarray(a.transpose(1, 2, 0), "RGB")
    return img, i


def _resize_float(x: torch.Tensor, size: int) -> torch.Tensor:
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


def _resize_uint8(x: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    out = [
        _resize_float(x[i : i + chunk].float(), size).round_().clamp_(0, 255).to(torch.uint8)
        for i in range(0, len(x), chunk)
    ]
    return torch.cat(out)


def _square_transform(size: int):
    from torchvision.transforms import v2 as T

    return T.Compose([T.Resize(size, antialias=True), T.CenterCrop(size), T.ToImage()])


class LazyImages:
    """Folder images decoded on demand at the evaluation geometry, as uint8 tensors.

    ``images[i]`` → ``(C, S, S)``; ``images[list or tensor of indices]`` → ``(k, C, S, S)``;
    ``len(images)`` and ``images.shape`` work like a tensor's. Returned by
    :func:`load_split_images` for image folders, which can be too large to decode at once.
    """

    def __init__(self, paths: list[str], size: int, skip_corrupt: bool = False) -> None:
        self._src = _FolderImages(paths, skip_corrupt)
        self._tf = eval_folder_transform(size, None, None)
        self.size = size

    def __len__(self) -> int:
        return len(self._src)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self), 3, self.size, self.size)

    def __getitem__(self, key: Any) -> torch.Tensor:
        if isinstance(key, (int, np.integer)) or (torch.is_tensor(key) and key.dim() == 0):
            return self._tf(self._src.get(int(key))[0]).as_subclass(torch.Tensor)
        if isinstance(key, slice):
            key = range(*key.indices(len(self)))
        idx = key.tolist() if hasattr(key, "tolist") else list(key)
        if not idx:
            return torch.empty((0, 3, self.size, self.size), dtype=torch.uint8)
        return torch.stack([self[int(i)] for i in idx])


def load_split_images(cfg: Any, split: str) -> tuple[torch.Tensor | LazyImages, torch.Tensor]:
    """``(images, labels)`` of the (subset) split at display size S, for figures.

    Tensor datasets: uint8 ``(N, C, S, S)`` (resized with antialias if ``image_size`` differs from
    the native size). Image folders: a :class:`LazyImages` accessor decoding on demand ("shorter
    side S*256/224, centre crop S", as evaluated). ``labels``: int64 ``(N,)``; position ``i``
    matches ``idx == i`` from :func:`build_eval_loader`.
    """
    name = _check_name(cfg)
    data = _load(cfg, split)
    size = _image_size(cfg, name)
    labels = torch.from_numpy(data.labels.copy())
    if data.images is None:
        assert data.paths is not None
        return LazyImages(data.paths, size, bool(_cfg_get(cfg, "skip_corrupt", False))), labels
    return _resize_uint8(data.images, size), labels


# ============================================================================ train loaders
def _epoch_order(n: int, seed: int, epoch: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's sample order for ``epoch``: one permutation shared by all ranks, truncated to a
    multiple of ``world_size`` and rank-strided, so shards are disjoint and of equal length."""
    g = torch.Generator().manual_seed(mix_seed(seed, epoch, 0x5EED))
    perm = torch.randperm(n, generator=g)
    per_rank = n // world_size
    return perm[: per_rank * world_size][rank::world_size]


class TwoViewLoader:
    """Common interface of the two training paths: iterate ``(x1, x2, y)`` on ``device``.

    ``len(loader)`` = steps per epoch (drop_last); ``set_epoch(e)`` selects the epoch whose order
    and augmentation are a function of ``(seed, epoch, rank)`` only. Attributes: ``batch_size``,
    ``num_samples`` (this rank's samples per epoch before drop_last), ``epoch``, ``resident``,
    ``spec`` (the AugmentSpec), ``num_skipped`` (corrupt images skipped so far).
    """

    resident: bool = False

    def __init__(
        self, n: int, batch_size: int, spec: AugmentSpec, *, seed: int, device: torch.device,
        rank: int, world_size: int,
    ) -> None:
        self.n = n
        self.batch_size = batch_size
        self.spec = spec
        self.seed = int(seed)
        self.device = device
        self.rank = rank
        self.world_size = world_size
        self.num_samples = n // world_size
        self.epoch = 0
        self.start_step = 0

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select ``epoch``; ``start_step`` > 0 skips the first steps (mid-epoch resume)."""
        if start_step < 0 or start_step > len(self):
            raise ValueError(f"start_step={start_step}: expected 0..{len(self)}")
        self.epoch = int(epoch)
        self.start_step = int(start_step)

    def _order(self) -> torch.Tensor:
        return _epoch_order(self.n, self.seed, self.epoch, self.rank, self.world_size)

    @property
    def num_skipped(self) -> int:
        return 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        raise NotImplementedError


class ResidentTwoViewLoader(TwoViewLoader):
    """The split as one uint8 ``(N, C, H, W)`` tensor on ``device``; both views of a batch are
    augmented in ONE :class:`BatchAugment` call on the ``2B`` stacked copies (independent
    parameters per copy) under a seed of ``(seed, epoch, rank, step)``."""

    resident = True

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, spec: AugmentSpec, *,
        seed: int, device: torch.device, rank: int = 0, world_size: int = 1,
    ) -> None:
        super().__init__(
            len(images), batch_size, spec, seed=seed, device=device, rank=rank, world_size=world_size
        )
        self.images = images.to(device)
        self.labels = labels.to(device)
        self.augment = BatchAugment(spec)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        order = self._order()
        b = self.batch_size
        for step in range(self.start_step, len(self)):
            idx = order[step * b : (step + 1) * b].to(self.device, non_blocking=True)
            x = self.images[idx].float().div_(255.0)
            # One kornia call for both views (2B samples, each with its own parameters): half the
            # per-call overhead, which dominates on a GPU.
            with seeded(mix_seed(self.seed, self.epoch, self.rank, step), self.device):
                views = self.augment(torch.cat([x, x]))
            yield views[:b], views[b:], self.labels[idx]


_Getter = Callable[[int], tuple[Any, int]]  # index -> (PIL image, index actually used)


class _TwoViewDataset(torch.utils.data.Dataset):
    """Items are ``(index, seed)`` keys: the two views of image ``index`` under ``seed``."""

    def __init__(self, get: _Getter, labels: np.ndarray, transform: Callable) -> None:
        self.get = get
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        i, s = key
        try:
            img, j = self.get(i)
        except DataError as e:  # this rank's shard: the other processes do not meet it
            raise ShardDataError(str(e)) from None
        with seeded(s):
            v1 = self.transform(img).as_subclass(torch.Tensor)
            v2 = self.transform(img).as_subclass(torch.Tensor)
        return v1, v2, int(self.labels[j])


class _KeySampler(torch.utils.data.Sampler):
    """Yields ``(index, seed)`` for this rank's epoch order. Holds its own copy of the epoch state
    (no reference back to the loader: a cycle would delay the DataLoader's finaliser to the garbage
    collector, and its persistent workers then took 5 s to shut down)."""

    def __init__(self, n: int, batch_size: int, steps: int, seed: int, rank: int, world_size: int) -> None:
        self.n, self.batch_size, self.steps = n, batch_size, steps
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self.start_step = 0

    def __len__(self) -> int:
        return (self.steps - self.start_step) * self.batch_size

    def __iter__(self) -> Iterator[tuple[int, int]]:
        lo, hi = self.start_step * self.batch_size, self.steps * self.batch_size
        order = _epoch_order(self.n, self.seed, self.epoch, self.rank, self.world_size)[lo:hi].tolist()
        for j, i in enumerate(order, start=lo):
            yield i, mix_seed(self.seed, self.epoch, self.rank, j)


def _worker_init(worker_id: int) -> None:
    import random

    s = torch.initial_seed() % (2**32)
    np.random.seed(s)
    random.seed(s)


class PerSampleTwoViewLoader(TwoViewLoader):
    """A torch DataLoader over PIL images with :func:`sample_transform`; the ``j``-th sample of the
    rank's epoch order is augmented under a seed of ``(seed, epoch, rank, j)``, so batches do not
    depend on ``num_workers``. ``pin_memory`` on CUDA; workers persist across epochs."""

    resident = False

    def __init__(
        self, get: _Getter, labels: np.ndarray, batch_size: int, spec: AugmentSpec, *,
        seed: int, device: torch.device, rank: int = 0, world_size: int = 1, num_workers: int = 0,
        folder: _FolderImages | None = None, skipped_upfront: int = 0,
    ) -> None:
        super().__init__(
            len(labels), batch_size, spec, seed=seed, device=device, rank=rank, world_size=world_size
        )
        self._folder = folder
        self._skipped_upfront = skipped_upfront
        self.dataset = _TwoViewDataset(get, labels, sample_transform(spec))
        self._sampler = _KeySampler(self.n, batch_size, len(self), self.seed, rank, world_size)
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=batch_size,
            sampler=self._sampler,
            drop_last=True,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            persistent_workers=num_workers > 0,
            worker_init_fn=_worker_init if num_workers > 0 else None,
            generator=torch.Generator().manual_seed(mix_seed(seed, rank, 0xDA7A)),
        )

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        super().set_epoch(epoch, start_step)
        self._sampler.epoch, self._sampler.start_step = self.epoch, self.start_step

    @property
    def num_skipped(self) -> int:
        return self._skipped_upfront + (self._folder.num_skipped if self._folder is not None else 0)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        nb = self.device.type == "cuda"
        for x1, x2, y in self.loader:
            yield (
                x1.to(self.device, non_blocking=nb),
                x2.to(self.device, non_blocking=nb),
                y.to(self.device, non_blocking=nb),
            )


def _as_device(device: Any) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def _decode_folder_square(paths: list[str], size: int, skip_corrupt: bool) -> torch.Tensor:
    src = _FolderImages(paths, skip_corrupt)
    tf = _square_transform(size)
    out = torch.empty((len(paths), 3, size, size), dtype=torch.uint8)
    for i in range(len(paths)):
        out[i] = tf(src.get(i)[0])
    return out


def build_train_loader(
    cfg: Any,
    batch_size: int,
    *,
    seed: int,
    device: torch.device | str,
    rank: int = 0,
    world_size: int = 1,
    crop_flip_only: bool = False,
) -> TwoViewLoader:
    """The two-view training loader of ``cfg`` (a DataConfig): resident or per-sample (see module doc).

    ``crop_flip_only``: random resized crop and horizontal flip only (no colour jitter, grayscale
    or blur): the augmentation of the paper's linear-probe protocol (PAPER-NOTES §2).

    Raises DataError for missing data, ``batch_size < 2`` or ``batch_size`` larger than this
    rank's share of the training split.
    """
    device = _as_device(device)
    if world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"rank={rank}, world_size={world_size}: expected 0 <= rank < world_size")
    if batch_size < 2:
        raise DataError(f"batch_size={batch_size}: expected >= 2 (InfoNCE needs negatives)")
    info = dataset_info(cfg)
    data = _load(cfg, "train")
    n = len(data)
    per_rank = n // world_size
    if batch_size > per_rank:
        shard = f" ({per_rank} per rank with world_size={world_size})" if world_size > 1 else ""
        raise DataError(
            f"batch_size={batch_size} is larger than the {n} training samples{shard} of {info.name}: "
            f"lower train.batch_size or raise data.train_subset"
        )
    spec = augment_spec(cfg, info)
    if crop_flip_only:
        spec = dataclasses.replace(spec, jitter_p=0.0, gray_p=0.0, blur_p=0.0)
    skip = bool(_cfg_get(cfg, "skip_corrupt", False))
    kw = dict(seed=seed, device=device, rank=rank, world_size=world_size)
    labels = torch.from_numpy(data.labels.copy())
    if uses_resident(cfg):
        if data.images is not None:
            images = data.images
        else:
            assert data.paths is not None
            logger.info("decoding %d folder images at %dpx (data.resident=true)", n, info.image_size)
            images = _decode_folder_square(data.paths, info.image_size, skip)
        return ResidentTwoViewLoader(images, labels, batch_size, spec, **kw)
    workers = int(_cfg_get(cfg, "num_workers", 0) or 0)
    if data.images is not None:
        images = data.images
        return PerSampleTwoViewLoader(
            functools.partial(_tensor_pil, images), data.labels, batch_size, spec, num_workers=workers, **kw
        )
    assert data.paths is not None
    folder = _FolderImages(data.paths, skip)
    return PerSampleTwoViewLoader(
        folder.get, data.labels, batch_size, spec, num_workers=workers, folder=folder,
        skipped_upfront=len(data.skipped), **kw,
    )


# ============================================================================ eval loaders
class EvalLoader:
    """Deterministic, unaugmented ``(x, y, idx)`` batches of a (subset) split on ``device``;
    ``idx`` indexes the split as returned by :func:`load_split_images`. ``len()`` = batches."""

    def __init__(self, n: int, batch_size: int, device: torch.device) -> None:
        if batch_size < 1:
            raise DataError(f"batch_size={batch_size}: expected >= 1")
        self.n = n
        self.batch_size = batch_size
        self.device = device
        self.num_skipped = 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        raise NotImplementedError


class _TensorEvalLoader(EvalLoader):
    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, device: torch.device,
        size: int, mean: Sequence[float], std: Sequence[float],
    ) -> None:
        super().__init__(len(images), batch_size, device)
        self.images, self.labels, self.size = images, labels, size
        c = images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, c, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, c, 1, 1)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        nb = self.device.type == "cuda"
        for lo in range(0, self.n, self.batch_size):
            hi = min(lo + self.batch_size, self.n)
            x = self.images[lo:hi].to(self.device, non_blocking=nb).float().div_(255.0)
            x = (_resize_float(x, self.size) - self.mean) / self.std
            yield x, self.labels[lo:hi].to(self.device), torch.arange(lo, hi, device=self.device)


class _FolderEvalDataset(torch.utils.data.Dataset):
    def __init__(self, folder: _FolderImages, labels: np.ndarray, transform: Callable) -> None:
        self.folder, self.labels, self.transform = folder, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        img, j = self.folder.get(i)
        return self.transform(img).as_subclass(torch.Tensor), int(self.labels[j]), i


class _FolderEvalLoader(EvalLoader):
    def __init__(self, ds: _FolderEvalDataset, batch_size: int, device: torch.device, workers: int) -> None:
        super().__init__(len(ds), batch_size, device)
        self.ds = ds
        self.loader = torch.utils.data.DataLoader(
            ds, batch_size=batch_size, shuffle=False, num_workers=workers,
            pin_memory=device.type == "cuda", worker_init_fn=_worker_init if workers > 0 else None,
        )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        nb = self.device.type == "cuda"
        for x, y, idx in self.loader:
            yield x.to(self.device, non_blocking=nb), y.to(self.device), idx.to(self.device)


def build_eval_loader(cfg: Any, split: str, batch_size: int, *, device: torch.device | str) -> EvalLoader:
    """Unaugmented ``(x, y, idx)`` batches of ``split`` ("train" or "test"; folders: test = val/),
    resized to S if needed and normalised, in split order (no drop_last)."""
    device = _as_device(device)
    name = _check_name(cfg)
    info = dataset_info(cfg)
    data = _load(cfg, _check_split(split))
    labels = torch.from_numpy(data.labels.copy())
    if data.images is not None:
        return _TensorEvalLoader(
            data.images, labels, batch_size, device, info.image_size, info.mean, info.std
        )
    assert data.paths is not None and name == "imagefolder"
    folder = _FolderImages(data.paths, bool(_cfg_get(cfg, "skip_corrupt", False)))
    ds = _FolderEvalDataset(folder, data.labels, eval_folder_transform(info.image_size, info.mean, info.std))
    loader = _FolderEvalLoader(ds, batch_size, device, int(_cfg_get(cfg, "num_workers", 0) or 0))
    loader.num_skipped = len(data.skipped)
    return loader
