"""Images handed over from Python (``bayesncl.pretrain(config, dataset=...)``): ``data.name=python``.

:func:`provide` turns a uint8 tensor ``(N, C, H, W)`` or a torch ``Dataset`` into a split held in
this process and returns the token that ``data.root`` then names; the loaders read it like any
tensor dataset (resident on the training device by default). A Dataset's items are ``(image,
label)`` or an image alone (then the split is unlabeled: no online probe, and evaluation reads
``eval.data.*``). An image is a PIL image, a ``(C, H, W)`` tensor (uint8, or float in [0, 1]) or
an ``(H, W)`` / ``(H, W, C)`` uint8 NumPy array. A Dataset is read once, into memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bayesncl.data.sources import UNLABELED, DataError, Split, clear_cache, reader

_PROVIDED: dict[str, dict[str, Split]] = {}
_COUNTER = itertools.count(1)
EXPECTED = (
    "expected (image, label) or an image alone, the image a PIL image, a (C, H, W) uint8 or float tensor "
    "in [0, 1], or an (H, W) / (H, W, C) uint8 NumPy array, the label an int"
)


def provide(train: Any, test: Any = None, *, image_size: int = 0, labels: Any = None) -> str:
    """Hold ``train`` (and ``test``, for the end-of-training evaluation) in this process; returns
    the token for ``data.root`` (with ``data.name=python``). ``image_size``: a Dataset whose images
    differ in size is resized to this side (shorter side, centre crop); 0 refuses mixed sizes.
    ``labels``: int labels (N,) for a tensor ``train``. Raises DataError (one line)."""
    splits = {"train": as_split(train, "dataset", image_size, labels)}
    if test is not None:
        splits["test"] = as_split(test, "eval_dataset", image_size)
        if splits["test"].images.shape[1] != splits["train"].images.shape[1]:
            raise DataError("eval_dataset's images have another channel count than dataset's")
    token = f"memory:{next(_COUNTER)}"
    _PROVIDED[token] = splits
    return token


def release(token: str) -> None:
    """Forget the images held for ``token`` (and the loaders' cache of them)."""
    _PROVIDED.pop(token, None)
    clear_cache()


def _entry(token: str | None) -> dict[str, Split]:
    if token not in _PROVIDED:
        raise DataError(
            "data.name=python reads images handed over from Python in this process "
            "(bayesncl.pretrain(config, dataset=...)), gone once it ended: give the data to evaluate on as "
            "data.name=NAME data.root=DIR, or from Python bayesncl.evaluate(run, dataset=...)"
        )
    return _PROVIDED[token]


@reader("python", geometry=lambda cfg: geometry(cfg.root))
def read(k: Any) -> Split:
    """The ``k.split`` split held for ``k.root``; an empty unlabeled test split if none was given."""
    entry = _entry(k.root)
    if k.split in entry:
        return entry[k.split]
    x = entry["train"].images
    assert x is not None
    return Split(np.zeros(0, dtype=np.int64), (UNLABELED,), k.root, images=x[:0], labeled=False)


def geometry(token: str | None) -> tuple[int, int]:
    """(channels, side in px) of the images held for ``token``."""
    x = _entry(token)["train"].images
    assert x is not None
    return int(x.shape[1]), int(x.shape[-1])


def as_split(obj: Any, what: str, image_size: int = 0, labels: Any = None) -> Split:
    """A :class:`Split` of a uint8 tensor ``(N, C, H, W)`` or a Dataset (see the module doc)."""
    if isinstance(obj, torch.Tensor):
        return _tensor_split(obj, what, labels)
    if not (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")):
        raise DataError(
            f"{what}: got a value of type {type(obj).__name__}; expected a torch Dataset or a uint8 tensor "
            "N x C x H x W"
        )
    n = len(obj)
    if n == 0:
        raise DataError(f"{what} is empty")
    images, ys = [], []
    for i in range(n):
        item = obj[i]
        img, y = (item[0], item[1]) if isinstance(item, (tuple, list)) and len(item) == 2 else (item, None)
        images.append(_image(img, what, i))
        ys.append(_label(y, what, i))
    if len({y is None for y in ys}) > 1:
        raise DataError(f"{what}: some items have a label and some do not; {EXPECTED}")
    x = _stack(images, what, image_size)
    if ys[0] is None:
        return Split(np.zeros(n, dtype=np.int64), (UNLABELED,), what, images=x, labeled=False)
    y_arr = np.asarray(ys, dtype=np.int64)
    return Split(y_arr, _class_names(obj, y_arr, what), what, images=x)


def _tensor_split(x: torch.Tensor, what: str, labels: Any) -> Split:
    if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] not in (1, 3) or len(x) == 0:
        raise DataError(
            f"{what}: a tensor of dtype {x.dtype} and shape {tuple(x.shape)}; expected uint8 N x C x H x W "
            "with C = 1 or 3 (and N >= 1)"
        )
    if x.shape[-1] != x.shape[-2]:
        raise DataError(f"{what}: {x.shape[-2]}x{x.shape[-1]} px images; expected square images (H = W)")
    x = x.detach().cpu().contiguous()
    if labels is None:
        return Split(np.zeros(len(x), dtype=np.int64), (UNLABELED,), what, images=x, labeled=False)
    y = np.asarray(torch.as_tensor(labels).cpu(), dtype=np.int64).reshape(-1)
    if len(y) != len(x) or (len(y) and y.min() < 0):
        raise DataError(f"{what}: {len(y)} labels for {len(x)} images; expected one int >= 0 per image")
    return Split(y, tuple(str(c) for c in range(int(y.max()) + 1)), what, images=x)


def _image(img: Any, what: str, i: int) -> torch.Tensor:
    """Item ``i``'s image as a uint8 (C, H, W) tensor, C = 1 or 3."""
    from PIL import Image

    if isinstance(img, Image.Image):
        img = np.asarray(img.convert("L" if img.mode in ("L", "1", "I", "F") else "RGB"))
    if isinstance(img, np.ndarray) and img.dtype == np.uint8 and img.ndim in (2, 3):
        t = torch.from_numpy(img.copy())
        t = t[None] if t.dim() == 2 else t.permute(2, 0, 1)
    elif isinstance(img, torch.Tensor) and img.dim() == 3:
        t = img.detach().cpu()
        if t.is_floating_point():
            t = (t.clamp(0, 1) * 255).round().to(torch.uint8)
        elif t.dtype != torch.uint8:
            t = None
    else:
        t = None
    if t is None or t.shape[0] not in (1, 3):
        kind = f"a {type(img).__name__}"
        if isinstance(img, (torch.Tensor, np.ndarray)):
            kind += f" of dtype {img.dtype} and shape {tuple(img.shape)}"
        raise DataError(f"{what}[{i}] holds {kind}; {EXPECTED}")
    return t


def _label(y: Any, what: str, i: int) -> int | None:
    if y is None:
        return None
    if isinstance(y, torch.Tensor) and y.numel() == 1 and not y.is_floating_point():
        y = int(y)
    if isinstance(y, (int, np.integer)) and not isinstance(y, bool) and y >= 0:
        return int(y)
    raise DataError(f"{what}[{i}] has the label {y!r} ({type(y).__name__}); expected an int >= 0")


def _stack(images: Sequence[torch.Tensor], what: str, size: int) -> torch.Tensor:
    """One uint8 (N, C, S, S) tensor: the images as they are when all are S x S (and ``size`` is 0),
    else each resized (shorter side ``size``, centre crop). Grayscale joins RGB as three channels."""
    channels = max(t.shape[0] for t in images)
    images = [t.expand(channels, -1, -1) if t.shape[0] != channels else t for t in images]
    shapes = {tuple(t.shape[1:]) for t in images}
    if size == 0:
        first = tuple(images[0].shape[1:])
        if len(shapes) > 1 or first[0] != first[1]:
            j = next((j for j, t in enumerate(images) if tuple(t.shape[1:]) != first), 0)
            raise DataError(
                f"{what}: images of different or non-square sizes ({what}[0] is {first[0]}x{first[1]} px, "
                f"{what}[{j}] {images[j].shape[1]}x{images[j].shape[2]}): set data.image_size=S to "
                "resize them (shorter side S, centre crop)"
            )
        return torch.stack(images).contiguous()
    from torchvision.transforms import v2 as T

    tf = T.Compose([T.Resize(size, antialias=True), T.CenterCrop(size)])
    return torch.stack([tf(t) for t in images]).contiguous()


def _class_names(obj: Any, y: np.ndarray, what: str) -> tuple[str, ...]:
    n = int(y.max()) + 1
    names = getattr(obj, "classes", None)
    if isinstance(names, (list, tuple)) and len(names) >= n and all(isinstance(c, str) for c in names):
        return tuple(names)
    return tuple(str(c) for c in range(n))
