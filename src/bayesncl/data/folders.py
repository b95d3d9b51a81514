"""The ``imagefolder`` reader: ``root/train/<class>/*`` and ``root/val/<class>/*`` (``root/test``
without ``val``; ``split="test"`` means it), classes = the train folder's sub-folders, sorted, or
the list ``data.classes`` names; a folder without class folders is an unlabeled train split. A
split of at most :data:`VERIFY_MAX_FILES` files is verified upfront (``PIL.Image.verify``): a
corrupt file raises :class:`DataError`, or with ``data.skip_corrupt=true`` is dropped with a
warning; larger splits are checked when read (``data.images``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bayesncl.data.download import expand
from bayesncl.data.sources import UNLABELED, DataError, Split, SplitKey, logger, reader

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
VERIFY_MAX_FILES = 20_000  # imagefolder splits up to this size are verified upfront

CLASS_LISTS = {"imagenet100": Path(__file__).with_name("imagenet100_classes.txt")}
"""Class lists shipped in the package, by the name ``data.classes`` gives them."""


def read_class_list(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The class folder names listed in a text file (``data.classes``), sorted like torchvision's
    ImageFolder (a full ImageNet folder then labels ImageNet-100 as a ready-made one does).

    Names are separated by whitespace, commas or newlines; ``#`` starts a comment. ``path`` may name
    a shipped list (:data:`CLASS_LISTS`): ``imagenet100``, the CMC subset (Tian et al. 2020).
    Raises DataError (one line) if the file is missing or unreadable, lists nothing, or repeats a name.
    """
    f = CLASS_LISTS.get(str(path)) or expand(str(path))
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
        files = image_files(d / c)
        paths += files
        labels += [ci] * len(files)
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


def _verify_split(paths: list[str], d: Path, k: SplitKey) -> tuple[list[bool], list[str]]:
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


def image_files(d: Path, skip_hidden: bool = False) -> list[str]:
    """Every image file below ``d`` (sub-folders too, in sorted order; ``skip_hidden``: not in
    folders named ``.*``); none when ``d`` is not a folder."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(d, followlinks=True):
        dirnames[:] = sorted(n for n in dirnames if not (skip_hidden and n.startswith(".")))
        out += [os.path.join(dirpath, fn) for fn in sorted(filenames) if fn.lower().endswith(IMG_EXTENSIONS)]
    return out


def _unlabeled_pool(r: Path, k: SplitKey) -> Path | None:
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


def _read_unlabeled(d: Path, k: SplitKey) -> Split:
    """An unlabeled image folder's train split (every image below ``d``); its test split is empty:
    evaluation reads a labelled dataset (``eval.data.*``)."""
    if k.split == "test":
        return Split(np.zeros(0, dtype=np.int64), (UNLABELED,), str(d), paths=[], labeled=False)
    paths = image_files(d, skip_hidden=True)
    if not paths:
        raise DataError(
            f"image folder {d} holds no images ({', '.join(IMG_EXTENSIONS)}): expected image files "
            "(unlabeled pretraining) or train/<class>/ folders"
        )
    keep, skipped = _verify_split(paths, d, k)
    paths = [p for p, ok in zip(paths, keep, strict=True) if ok]
    return Split(np.zeros(len(paths), dtype=np.int64), (UNLABELED,), str(d), paths=paths, skipped=skipped,
                 labeled=False)


@reader("imagefolder")
def read_folder(k: SplitKey) -> Split:
    hint = "expected root/train/<class>/*.jpg and root/val/<class>/*.jpg (e.g. an ImageNet-100 folder)"
    if not k.root:
        raise DataError(f"data.name=imagefolder needs data.root: {hint}")
    r = expand(k.root)
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
