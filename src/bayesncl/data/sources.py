"""Dataset sources: the readers, downloads, the in-process cache, subsets and metadata.

``data.name`` (:data:`READERS`):

* ``fashion-mnist``: the four idx files, gzipped or raw, read with NumPy; ONE gray channel. Without
  ``data.root``: ``/usr/share/datasets/fashion-mnist`` (Debian ``dataset-fashion-mnist``), ``./data``,
  ``~/.cache/bayesncl``, each also in ``fashion-mnist/`` or torchvision's ``FashionMNIST/raw/``.
* ``cifar10`` / ``cifar100``: torchvision's pickles (``cifar-10-batches-py`` / ``cifar-100-python``
  under ``data.root``, ``./data`` or ``~/.cache/bayesncl``, or ``data.root`` itself), read here
  directly (no 160 MB MD5 check on every start).
* ``imagefolder``: ``root/train/<class>/*`` and ``root/val/<class>/*`` (``root/test`` without
  ``val``; ``split="test"`` means it), classes = the train folder's sub-folders, sorted.
* ``synthetic``: 10 classes of shapes and textures in random colours, 32x32 RGB, 5000 train / 1000
  test, generated deterministically; the shape, not the colour, carries the label.
* ``fashion-mnist-bg``, ``waterbirds``: :mod:`bayesncl.data.backgrounds`.
* ``dsprites``: :mod:`bayesncl.data.dsprites` (generated; its subsets are generated, not cut).

``data.download=true``: torchvision fetches a dataset not found into ``data.root`` (or the cache).
An image-folder split of at most :data:`VERIFY_MAX_FILES` files is verified upfront
(``PIL.Image.verify``): a corrupt file raises :class:`DataError`, or with ``data.skip_corrupt=true``
is dropped with a warning (``num_skipped``); larger splits are checked when read (``data.images``).
``train_subset`` / ``test_subset`` > 0: :func:`stratified_subset` (seed :data:`SUBSET_SEED`: the
same images for every method and seed). ``image_size=0``: :data:`NATIVE_SIZE`. ``cfg`` is a
validated :class:`bayesncl.config.DataConfig`: nothing here re-checks its values.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

logger = logging.getLogger("bayesncl.data")

NATIVE_SIZE = {
    "fashion-mnist": 28, "cifar10": 32, "cifar100": 32, "imagefolder": 224, "synthetic": 32, "stl10": 96,
    "fashion-mnist-bg": 32, "waterbirds": 224,
}
UNLABELED = "(unlabeled)"  # the one class name of a split without labels (data.labels=none, a flat folder)
SUBSET_SEED = 20240601  # fixed: the same subset for every method and run seed
VERIFY_MAX_FILES = 20_000  # imagefolder splits up to this size are verified upfront
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
CACHE_DIR = Path("~/.cache/bayesncl")

# Per-channel statistics of the train splits (ImageNet's for folders; synthetic's are computed).
STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "fashion-mnist-bg": ((0.6009, 0.5550, 0.5019), (0.3020, 0.2823, 0.3191)),  # bg_correlation=0
    "waterbirds": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
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

_WORKER_TRACEBACK = re.compile(r"Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")


class DataError(ValueError):
    """A data problem (missing files, corrupt image, impossible batch size), reported as one line.

    Raised in a DataLoader worker (``data.num_workers`` > 0), it comes back as ``DataError("Caught
    DataError in DataLoader worker process N.\nOriginal Traceback ...")``: the message is then the
    original one, the traceback's last line, not the whole traceback."""

    def __init__(self, *args: Any) -> None:
        if len(args) == 1 and isinstance(args[0], str) and _WORKER_TRACEBACK.match(args[0]):
            last = args[0].rstrip().splitlines()[-1]
            args = (re.sub(r"^[\w.]+: ", "", last, count=1),)  # "bayesncl.data.sources.DataError: ..."
        super().__init__(*args)


class ShardDataError(DataError):
    """A data problem met while training on one process's shard (an image folder's image that cannot
    be decoded, found only when read): under ``torchrun`` only the process reading it meets it, so
    that process prints it, not its node's first process (which never sees it)."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the model and the reports need to know about a dataset (cheap: no augmentation).

    ``image_size`` is the effective side S in px the loaders yield; ``num_train``/``num_test``
    count the (subset) splits; ``mean``/``std`` are the per-channel normalisation statistics (of
    pixels in [0, 1]); ``train_class_counts``: the (subset) train split's images per class, in
    class order.
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
    labeled: bool = True  # False: one placeholder class (data.labels=none, a folder without classes)


@dataclass
class Split:
    """One split as loaded: ``images`` uint8 ``(N, C, H, W)`` for tensor datasets, ``paths`` for
    image folders; ``skipped``: the corrupt files dropped upfront."""

    labels: np.ndarray  # (N,) int64
    class_names: tuple[str, ...]
    source: str
    images: torch.Tensor | None = None
    paths: list[str] | None = None
    skipped: list[str] = field(default_factory=list)
    labeled: bool = True  # False: ``labels`` are all 0, ``class_names`` is (UNLABELED,)
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # image_stats, once measured
    places: np.ndarray | None = None  # (N,) int64 background labels (bayesncl.data.backgrounds)
    factors: np.ndarray | None = None  # (N, F) int64 generative factor codes (bayesncl.data.dsprites)

    def __len__(self) -> int:
        return len(self.labels)


class _Key(NamedTuple):
    """What selects one full split on disk (the cache key)."""

    name: str
    root: str | None
    download: bool
    split: str  # "train" | "test"
    skip_corrupt: bool
    classes: str | None
    labels: str = "auto"  # "none": the pretraining split without its labels (stl10: + unlabeled_X)
    bg_correlation: float = 0.0  # fashion-mnist-bg only (0.0 for every other dataset)
    sizes: tuple[int, int] = (0, 0)  # dsprites only: (train_subset, test_subset), the images generated


def _expand(p: str | Path) -> Path:
    return Path(os.path.expanduser(str(p)))


def _default_bases() -> list[Path]:
    return [Path.cwd() / "data", _expand(CACHE_DIR)]


# ============================================================================ downloads
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


def _find_or_fetch(
    what: str, k: _Key, find: Callable[[str | None], Path | None], fetch: Callable[[str], None]
) -> Path | None:
    """The folder ``find(root)`` locates; with ``data.download`` and none found, download into
    ``data.root`` (or the cache dir) first."""
    d = find(k.root)
    if d is None and k.download:
        target = _expand(k.root or CACHE_DIR)
        _download(what, target, fetch)
        d = find(str(target))
    return d


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


def _find_fmnist(root: str | None) -> Path | None:
    stems = [s for pair in FMNIST_FILES.values() for s in pair]
    for b in [_expand(root)] if root else [DEBIAN_FMNIST, *_default_bases()]:
        for d in (b, b / "fashion-mnist", b / "FashionMNIST" / "raw"):
            if d.is_dir() and all(_fmnist_file(d, s) for s in stems):
                return d
    return None


def _fetch_fmnist(where: str) -> None:
    from torchvision.datasets import FashionMNIST

    for train in (True, False):
        FashionMNIST(where, train=train, download=True)


def _read_fmnist(k: _Key) -> Split:
    d = _find_or_fetch("Fashion-MNIST", k, _find_fmnist, _fetch_fmnist)
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


# ============================================================================ cifar
def _cifar_candidates(name: str, root: str | None) -> list[Path]:
    folder = CIFAR[name][0]
    if root:
        r = _expand(root)
        return [r / folder, r]
    return [b / folder for b in _default_bases()]


def _find_cifar(name: str, root: str | None) -> Path | None:
    _, train, test, meta, _, _ = CIFAR[name]
    for d in _cifar_candidates(name, root):
        if d.is_dir() and all((d / f).is_file() for f in (*train, *test, meta)):
            return d
    return None


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except Exception as e:  # noqa: BLE001 - a bad pickle is a data problem
        raise DataError(f"cannot read {path} as a CIFAR pickle: {type(e).__name__}: {e}") from None


def _fetch_cifar(name: str, where: str) -> None:
    from torchvision.datasets import CIFAR10, CIFAR100

    (CIFAR10 if name == "cifar10" else CIFAR100)(where, train=True, download=True)


def _read_cifar(k: _Key) -> Split:
    name, split = k.name, k.split
    folder, train_files, test_files, meta_file, names_key, labels_key = CIFAR[name]
    d = _find_or_fetch(
        name, k, functools.partial(_find_cifar, name), functools.partial(_fetch_cifar, name)
    )
    if d is None:
        searched = ", ".join(str(p) for p in _cifar_candidates(name, k.root))
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


# ============================================================================ synthetic
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


def _read_synthetic(k: _Key) -> Split:
    x, y = _synthetic(k.split)
    return Split(y, SYNTHETIC_CLASSES, f"synthetic(seed={SYNTHETIC_SEED})", images=x)


@functools.lru_cache(maxsize=1)
def _synthetic_stats() -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = _synthetic("train")[0].float().div_(255)
    return tuple(x.mean((0, 2, 3)).tolist()), tuple(x.std((0, 2, 3)).tolist())


# ============================================================================ imagefolder
CLASS_LISTS = {"imagenet100": Path(__file__).with_name("imagenet100_classes.txt")}
"""Class lists shipped in the package, by the name ``data.classes`` gives them."""


def read_class_list(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The class folder names listed in a text file (``data.classes``), sorted like torchvision's
    ImageFolder (a full ImageNet folder then labels ImageNet-100 as a ready-made one does).

    Names are separated by whitespace, commas or newlines; ``#`` starts a comment. ``path`` may name
    a shipped list (:data:`CLASS_LISTS`): ``imagenet100``, the CMC subset (Tian et al. 2020).
    Raises DataError (one line) if the file is missing or unreadable, lists nothing, or repeats a name.
    """
    f = CLASS_LISTS.get(str(path)) or _expand(str(path))
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


def corrupt_error(path: str, reason: str, more: int = 0) -> DataError:
    """The one-line error for a corrupt image ``path`` (``more``: how many others were found)."""
    extra = f" (and {more} more corrupt files)" if more else ""
    return DataError(
        f"corrupt image {path} ({reason.splitlines()[0] if reason else 'unreadable'}){extra}: "
        f"fix or remove it, or set data.skip_corrupt=true to skip unreadable images"
    )


def _verify_split(paths: list[str], d: Path, k: _Key) -> tuple[list[bool], list[str]]:
    """``(keep, skipped)``: which of the image ``paths`` of folder ``d`` are readable, and the corrupt
    ones, verified upfront for a split of at most :data:`VERIFY_MAX_FILES` files (else all are kept).
    A corrupt file raises DataError unless ``data.skip_corrupt``; so does a split of corrupt files only."""
    if len(paths) > VERIFY_MAX_FILES:
        return [True] * len(paths), []
    bad = {p: why for p in paths if (why := _verify_image(p)) is not None}
    if bad and not k.skip_corrupt:
        first = next(iter(bad))
        raise corrupt_error(first, bad[first], len(bad) - 1)
    if len(bad) == len(paths):
        raise DataError(f"every image in {d} is corrupt")
    return [p not in bad for p in paths], list(bad)


def _loose_images(d: Path) -> list[str]:
    """Every image file below ``d`` (sub-folders too, in sorted order)."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(d, followlinks=True):
        dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
        out += [os.path.join(dirpath, fn) for fn in sorted(filenames) if fn.lower().endswith(IMG_EXTENSIONS)]
    return out


def _unlabeled_pool(r: Path, k: _Key) -> Path | None:
    """The folder of an unlabeled image folder, or None for the ImageFolder layout: ``root`` itself
    when it has no ``train/`` (every image below it), ``root/train`` when that holds image files
    and no sub-folders, or ``root/train`` with ``data.labels=none`` (its class folders ignored)."""
    train = r / "train"
    if not train.is_dir():
        return r
    entries = list(os.scandir(train))
    images = any(e.name.lower().endswith(IMG_EXTENSIONS) for e in entries)
    flat = images and not any(e.is_dir() for e in entries)
    return train if flat or k.labels == "none" else None


def _read_unlabeled(d: Path, k: _Key) -> Split:
    """An unlabeled image folder's train split (every image below ``d``); its test split is empty:
    evaluation reads a labelled dataset (``eval.data.*``)."""
    if k.split == "test":
        return Split(np.zeros(0, dtype=np.int64), (UNLABELED,), str(d), paths=[], labeled=False)
    paths = _loose_images(d)
    if not paths:
        raise DataError(
            f"image folder {d} holds no images ({', '.join(IMG_EXTENSIONS)}): expected image files "
            "(unlabeled pretraining) or train/<class>/ folders"
        )
    keep, skipped = _verify_split(paths, d, k)
    paths = [p for p, ok in zip(paths, keep, strict=True) if ok]
    return Split(np.zeros(len(paths), dtype=np.int64), (UNLABELED,), str(d), paths=paths, skipped=skipped,
                 labeled=False)


def _read_folder(k: _Key) -> Split:
    hint = "expected root/train/<class>/*.jpg and root/val/<class>/*.jpg (e.g. an ImageNet-100 folder)"
    if not k.root:
        raise DataError(f"data.name=imagefolder needs data.root: {hint}")
    r = _expand(k.root)
    if not r.is_dir():
        raise DataError(f"image folder {r} does not exist: {hint}")
    pool = _unlabeled_pool(r, k)
    if pool is not None and not k.classes:
        return _read_unlabeled(pool, k)
    class_names = read_class_list(k.classes) if k.classes else None
    if k.split == "test" and class_names is None:
        if not (r / "train").is_dir():
            raise DataError(f"image folder {r} has no train/ sub-folder (needed for the class list)")
        class_names = tuple(sorted(e.name for e in os.scandir(r / "train") if e.is_dir()))
    if k.split == "train":
        d = r / "train"
    else:
        d = r / "val" if (r / "val").is_dir() or not (r / "test").is_dir() else r / "test"
    paths, labels, names = _scan_folder(d, class_names, subset=bool(k.classes))
    keep, skipped = _verify_split(paths, d, k)
    if skipped:
        labels, paths = labels[np.asarray(keep)], [p for p, ok in zip(paths, keep, strict=True) if ok]
        logger.warning("skipped %d corrupt image(s) in %s (data.skip_corrupt=true), first: %s",
                       len(skipped), d, skipped[0])
    return Split(labels, names, str(d), paths=paths, skipped=skipped)


# ============================================================================ registry, cache, subsets
# data.name -> reader of one full split; config.validate takes the allowed names from here.
READERS: dict[str, Callable[[_Key], Split]] = {
    "fashion-mnist": _read_fmnist, "cifar10": _read_cifar, "cifar100": _read_cifar,
    "imagefolder": _read_folder, "synthetic": _read_synthetic,
}
"""data.name -> reader. Readers in modules of their own add their row when imported (bayesncl.data
imports them): ``stl10`` (:mod:`bayesncl.data.stl10`), ``fashion-mnist-bg`` and ``waterbirds``
(:mod:`bayesncl.data.backgrounds`), ``python`` (:mod:`bayesncl.data.provided`), ``dsprites``
(:mod:`bayesncl.data.dsprites`)."""
GEOMETRY: dict[str, Callable[[Any], tuple[int, int]]] = {}
"""data.name -> (channels, native side) of a dataset whose geometry the config alone cannot tell
(``python``: the images handed over); others: :data:`NATIVE_SIZE`, 1 channel for fashion-mnist."""


@functools.lru_cache(maxsize=6)
def _read_cached(k: _Key) -> Split:
    s = READERS[k.name](k)
    return unlabeled(s) if k.labels == "none" and s.labeled else s


def _load_full(cfg: Any, split: str) -> Split:
    """The full (not subset) ``split`` ("train" or "test") of ``cfg``, cached in-process."""
    root = str(cfg.root) if cfg.root else None
    labels = getattr(cfg, "labels", "auto") if split == "train" else "auto"
    corr = float(cfg.bg_correlation) if cfg.name == "fashion-mnist-bg" else 0.0
    sizes = (int(cfg.train_subset), int(cfg.test_subset)) if cfg.name == "dsprites" else (0, 0)
    key = _Key(
        cfg.name, root, bool(cfg.download), split, bool(cfg.skip_corrupt), cfg.classes or None, labels, corr,
        sizes,
    )
    return _read_cached(key)


def unlabeled(s: Split) -> Split:
    """``s`` without its labels: every label 0, the one class :data:`UNLABELED`."""
    return dataclasses.replace(
        s, labels=np.zeros(len(s), dtype=np.int64), class_names=(UNLABELED,), labeled=False
    )


def clear_cache() -> None:
    """Forget the in-process cache of loaded splits (e.g. after files changed on disk)."""
    _read_cached.cache_clear()
    _synthetic.cache_clear()
    _SUBSET_WARNED.clear()


def stratified_subset(labels: np.ndarray, k: int, seed: int = SUBSET_SEED) -> np.ndarray:
    """Sorted indices of a class-stratified subset of size ``min(k, N)``, deterministic in ``seed``.

    Per-class quotas are ``k * n_c / N`` rounded by largest remainder (ties → lower class id);
    within a class the members are a seeded random choice. ``k <= 0``: every index.
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
    return stratified_subset(_load_full(cfg, split).labels, getattr(cfg, f"{split}_subset"))


# (split, subset size, source) of the subsets already warned about as larger than their split
_SUBSET_WARNED: set[tuple[str, int, str]] = set()


def load_split(cfg: Any, split: str) -> Split:
    """The (subset) ``split`` ("train" or "test") of ``cfg``. Raises DataError."""
    full = _load_full(cfg, split)
    k = getattr(cfg, f"{split}_subset")
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
    return Split(
        full.labels[idx], full.class_names, full.source,
        images=full.images[torch.from_numpy(idx)] if full.images is not None else None,
        paths=[full.paths[i] for i in idx] if full.paths is not None else None,
        skipped=full.skipped,
        places=full.places[idx] if full.places is not None else None,
        factors=full.factors[idx] if full.factors is not None else None,
    )


# ============================================================================ metadata
def image_geometry(cfg: Any) -> tuple[int, int]:
    """``(channels, image size in px)`` of the images ``cfg`` (a DataConfig) feeds the model, read
    from the config alone (no data files): 1 channel for fashion-mnist, else 3 (RGB)."""
    if cfg.name in GEOMETRY:
        channels, native = GEOMETRY[cfg.name](cfg)
        return channels, cfg.image_size or native
    return (1 if cfg.name == "fashion-mnist" else 3), cfg.image_size or NATIVE_SIZE[cfg.name]


def dataset_info(cfg: Any) -> DatasetInfo:
    """Classes, channels, effective image size and (subset) split sizes of ``cfg`` (a DataConfig).

    Reads the data files (cached in-process for the loaders), augments nothing. Raises DataError.
    """
    name = cfg.name
    train, test = load_split(cfg, "train"), load_split(cfg, "test")
    channels, image_size = image_geometry(cfg)
    if name in STATS:
        mean, std = STATS[name]
    elif name == "synthetic":
        mean, std = _synthetic_stats()
    else:  # stl10, python: measured once on the (full) train split's images
        full = _load_full(cfg, "train")
        if full.stats is None and full.images is not None:
            full.stats = image_stats(full.images)
        mean, std = full.stats or STATS["imagefolder"]
    num_classes = len(train.class_names)
    counts = np.bincount(np.asarray(train.labels, dtype=np.int64), minlength=num_classes)
    return DatasetInfo(
        num_classes=num_classes, channels=channels, image_size=image_size,
        class_names=tuple(train.class_names), num_train=len(train), num_test=len(test), mean=mean, std=std,
        name=name, train_class_counts=tuple(int(c) for c in counts), labeled=train.labeled,
    )


def image_stats(images: torch.Tensor, most: int = 5000) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 ``images`` (N, C, H, W) in [0, 1], over at most ``most``
    evenly spaced images (a 100k-image split costs as much as 5000). A channel of one value gets
    std 1 (normalising it must not divide by 0)."""
    x = images[:: max(1, -(-len(images) // most))]
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for lo in range(0, len(x), 256):
        chunk = x[lo : lo + 256].to(torch.float64).div_(255)
        total += chunk.sum((0, 2, 3))
        squares += chunk.square().sum((0, 2, 3))
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = total / n
    var = (squares / n - mean.square()).clamp_min(0) * n / max(n - 1, 1)
    std = [float(v) ** 0.5 if v > 0 else 1.0 for v in var.tolist()]
    return tuple(mean.tolist()), tuple(std)
