"""Readers of the released distribution-shift test sets, from ``data.root``-style folders, and
the evaluation loaders over shifted images (tensors or files).

* ImageNet-C (Hendrycks & Dietterich 2019): ``ROOT/<corruption>/<severity 1-5>/<wnid>/<image>``.
* ImageNet-Sketch (Wang et al. 2019) and Stylized-ImageNet (Geirhos et al. 2019):
  ``ROOT/<wnid>/<image>`` (Sketch's ``sketch/`` sub-folder is looked in too).

Labels follow the *train* classes (``class_names``, the clean train split's folder names): a
class folder of a shifted set that the model's train classes lack is refused (one line); train
classes missing there are simply absent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.data.folders import IMG_EXTENSIONS, image_files
from bayesncl.data.sources import DataError


class FolderSet:
    """One shifted set on disk: image ``paths`` and int64 ``labels`` (indices into the train classes)."""

    def __init__(self, name: str, paths: list[str], labels: np.ndarray) -> None:
        self.name, self.paths, self.labels = name, paths, labels


def class_folder_set(root: str | os.PathLike[str], class_names: Sequence[str], name: str = "") -> FolderSet:
    """The images of ``root/<class>/...`` labelled by ``class_names``' order (ImageNet-Sketch,
    Stylized-ImageNet, one ImageNet-C severity folder). Raises DataError (one line) for a missing
    folder, one without class folders or images, or a class folder the train classes lack."""
    d = Path(os.path.expanduser(str(root)))
    if not d.is_dir():
        raise DataError(f"shifted test set {d} does not exist (expected <class>/<image files> below it)")
    if (d / "sketch").is_dir() and not any(e.name in class_names for e in os.scandir(d) if e.is_dir()):
        d = d / "sketch"  # ImageNet-Sketch as released: sketch/<wnid>/
    found = sorted(e.name for e in os.scandir(d) if e.is_dir())
    if not found:
        raise DataError(f"shifted test set {d} has no class sub-folders (expected <class>/<image files>)")
    index = {c: i for i, c in enumerate(class_names)}
    unknown = [c for c in found if c not in index]
    if unknown:
        raise DataError(
            f"shifted test set {d} has class folders the model's train classes lack: {', '.join(unknown[:5])}"
        )
    paths: list[str] = []
    labels: list[int] = []
    for c in found:
        files = image_files(d / c)
        paths += files
        labels += [index[c]] * len(files)
    if not paths:
        raise DataError(f"shifted test set {d} holds no images ({', '.join(IMG_EXTENSIONS)})")
    return FolderSet(name or d.name, paths, np.asarray(labels, dtype=np.int64))


def imagenet_c_sets(
    root: str | os.PathLike[str], class_names: Sequence[str], corruptions: Sequence[str] | None = None,
    severities: Sequence[int] = (1, 2, 3, 4, 5),
) -> dict[tuple[str, int], FolderSet]:
    """``{(corruption, severity): FolderSet}`` of an ImageNet-C folder
    ``root/<corruption>/<severity>/<class>/``; ``corruptions`` None: every corruption folder there.
    Raises DataError for a missing root or a named corruption / severity folder that is absent."""
    r = Path(os.path.expanduser(str(root)))
    if not r.is_dir():
        raise DataError(f"ImageNet-C folder {r} does not exist (expected <corruption>/<severity>/<class>/)")
    names = list(corruptions) if corruptions else sorted(e.name for e in os.scandir(r) if e.is_dir())
    if not names:
        raise DataError(
            f"ImageNet-C folder {r} holds no corruption folders (<corruption>/<severity>/<class>/ expected)"
        )
    out = {}
    for n in names:
        for s in severities:
            if not (r / n / str(s)).is_dir():
                raise DataError(f"ImageNet-C folder {r} lacks {n}/{s}/ (corruption {n}, severity {s})")
            out[n, int(s)] = class_folder_set(r / n / str(s), class_names, f"{n}-{s}")
    return out


def shifted_eval_loader(
    images: torch.Tensor | FolderSet, labels: np.ndarray | None, data_cfg: Any, batch_size: int, device: Any,
) -> Any:
    """An eval loader (``(x, y, idx)`` batches, the dataset's eval transform and normalisation) over
    shifted uint8 ``images`` (N, C, H, W) with ``labels``, or over a :class:`FolderSet`."""
    from bayesncl.data.loaders import eval_loader
    from bayesncl.data.sources import dataset_info

    if isinstance(images, FolderSet):
        images, labels = images.paths, images.labels  # type: ignore[assignment]
    assert labels is not None
    info, workers = dataset_info(data_cfg), data_cfg.num_workers
    return eval_loader(images, labels, info, batch_size, torch.device(device), num_workers=workers)
