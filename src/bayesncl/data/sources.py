"""Dataset sources: the shared types (:class:`Split`, :class:`DatasetInfo`, :class:`DataError`),
the registry of readers (:data:`READERS`: ``data.name`` -> a reader module's function, added by
:func:`reader` as ``bayesncl.data`` imports the module), the in-process cache, subsets and metadata.

``train_subset`` / ``test_subset`` > 0: :func:`stratified_subset` (seed :data:`SUBSET_SEED`: the
same images for every method and seed). ``image_size=0``: :data:`NATIVE_SIZE`. ``cfg`` is a
validated :class:`bayesncl.config.DataConfig`: nothing here re-checks its values.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

logger = logging.getLogger("bayesncl.data")

NATIVE_SIZE = {
    "fashion-mnist": 28, "cifar10": 32, "cifar100": 32, "imagefolder": 224, "synthetic": 32, "stl10": 96,
    "fashion-mnist-bg": 32, "waterbirds": 224,
}
UNLABELED = "(unlabeled)"  # the one class name of a split without labels (data.labels=none, a flat folder)
SUBSET_SEED = 20240601  # fixed: the same subset for every method and run seed
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


class SplitKey(NamedTuple):
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


# ============================================================================ registry, cache, subsets
READERS: dict[str, Callable[[SplitKey], Split]] = {}
"""data.name -> reader of one full split, in the order ``bayesncl.data`` imports the reader modules
(:func:`reader` adds each)."""
GEOMETRY: dict[str, Callable[[Any], tuple[int, int]]] = {}
"""data.name -> (channels, native side) of a dataset whose geometry the config alone cannot tell
(``python``: the images handed over); others: :data:`NATIVE_SIZE`, 1 channel for fashion-mnist."""
CLEARS: list[Callable[[], None]] = []  # the reader modules' own caches, emptied by clear_cache
Reader = TypeVar("Reader", bound=Callable[[SplitKey], Split])


def reader(
    *names: str, geometry: Callable[[Any], tuple[int, int]] | None = None
) -> Callable[[Reader], Reader]:
    """Register the decorated function as the reader of each ``data.name`` in ``names`` (and, given,
    ``geometry(cfg) -> (channels, native side)``, for a dataset the config alone cannot tell)."""

    def register(read: Reader) -> Reader:
        for name in names:
            READERS[name] = read
            if geometry is not None:
                GEOMETRY[name] = geometry
        return read

    return register


@functools.lru_cache(maxsize=6)
def read_cached(k: SplitKey) -> Split:
    """The full split ``k`` selects, read once per process (:func:`clear_cache` forgets it)."""
    s = READERS[k.name](k)
    return unlabeled(s) if k.labels == "none" and s.labeled else s


def _load_full(cfg: Any, split: str) -> Split:
    """The full (not subset) ``split`` ("train" or "test") of ``cfg``, cached in-process."""
    root = str(cfg.root) if cfg.root else None
    labels = getattr(cfg, "labels", "auto") if split == "train" else "auto"
    corr = float(cfg.bg_correlation) if cfg.name == "fashion-mnist-bg" else 0.0
    sizes = (int(cfg.train_subset), int(cfg.test_subset)) if cfg.name == "dsprites" else (0, 0)
    key = SplitKey(
        cfg.name, root, bool(cfg.download), split, bool(cfg.skip_corrupt), cfg.classes or None, labels, corr,
        sizes,
    )
    return read_cached(key)


def unlabeled(s: Split) -> Split:
    """``s`` without its labels: every label 0, the one class :data:`UNLABELED`."""
    return dataclasses.replace(
        s, labels=np.zeros(len(s), dtype=np.int64), class_names=(UNLABELED,), labeled=False
    )


def clear_cache() -> None:
    """Forget the in-process cache of loaded splits (e.g. after files changed on disk)."""
    read_cached.cache_clear()
    for clear in CLEARS:
        clear()
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
    rows = {k: getattr(full, k)[idx] for k in ("labels", "places", "factors") if getattr(full, k) is not None}
    return dataclasses.replace(
        full, **rows, images=full.images[torch.from_numpy(idx)] if full.images is not None else None,
        paths=[full.paths[i] for i in idx] if full.paths is not None else None,
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
    else:  # the reader's (synthetic), or measured once on the (full) train split's images (stl10, python)
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
