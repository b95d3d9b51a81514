"""Corrupted copies of a built-in dataset's test split ("Fashion-MNIST-C", "CIFAR-10-C") with the
ImageNet-C corruption functions (Hendrycks & Dietterich 2019) of the ``imagecorruptions`` module
(the package, the padding of small images, the gray images and the seeding: docs/decisions.md).

* :data:`CORRUPTIONS`: the 15 benchmark corruptions of ImageNet-C; :data:`EXTRA_CORRUPTIONS`: the
  package's 4 validation ones (accepted by name); severities 1-5.
* A (corruption, severity) copy depends only on (images, corruption, severity, seed);
  :func:`corrupted_test_split` caches it as ``<cache>/<data.name>-<N>-<sha1 of the clean
  images>-<corruption>-<severity>-seed<seed>.npy`` (default cache ``~/.cache/bayesncl/corrupted``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.data.sources import DataError, load_split

CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)
EXTRA_CORRUPTIONS = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
SEVERITIES = (1, 2, 3, 4, 5)
MIN_SIDE = 32  # the package refuses smaller images
DEFAULT_CACHE = Path("~/.cache/bayesncl/corrupted")
_SEEDED = ("impulse_noise", "glass_blur")  # the corruptions that take a seed argument


def check_corruptions(names: Any, severities: Any) -> tuple[list[str], list[int]]:
    """Validate corruption ``names`` and ``severities`` before anything is made or written.
    Raises DataError (one line) for an unknown name (listing the valid ones) or a severity that is
    not an integer 1-5."""
    known = (*CORRUPTIONS, *EXTRA_CORRUPTIONS)
    names = [str(n) for n in names]
    for n in names:
        if n not in known:
            raise DataError(f"unknown corruption {n!r}: expected one of {', '.join(known)}")
    out = []
    for s in severities:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 1 <= int(s) <= 5:
            raise DataError(f"corruption severity {s!r}: expected an integer from 1 to 5")
        out.append(int(s))
    if not names or not out:
        raise DataError("no corruption or no severity given: name at least one of each")
    return names, out


def _pad(img: np.ndarray) -> tuple[np.ndarray, tuple[int, int]]:
    h, w = img.shape[:2]
    ph, pw = max(0, MIN_SIDE - h), max(0, MIN_SIDE - w)
    if not ph and not pw:
        return img, (0, 0)
    pads = ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0))
    return np.pad(img, pads, mode="edge"), (ph // 2, pw // 2)


def corrupt_images(
    images: torch.Tensor | np.ndarray, name: str, severity: int, seed: int = 0
) -> torch.Tensor:
    """uint8 ``(N, C, H, W)`` images (C = 1 or 3) corrupted by ``name`` at ``severity`` (module doc),
    the same shape and dtype. Call :func:`check_corruptions` first (nothing is checked here)."""
    import imagecorruptions

    x = images.numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    n, c, h, w = x.shape
    idx = (*CORRUPTIONS, *EXTRA_CORRUPTIONS).index(name)
    out = np.empty_like(x)
    state = np.random.get_state()
    try:
        for i in range(n):
            img = np.repeat(x[i], 3, axis=0) if c == 1 else x[i]
            padded, (top, left) = _pad(np.ascontiguousarray(img.transpose(1, 2, 0)))
            s = int(np.random.SeedSequence([seed, idx, severity, i]).generate_state(1)[0])
            np.random.seed(s)
            extra = {"seed": s} if name in _SEEDED else {}
            y = imagecorruptions.corrupt(padded, severity=severity, corruption_name=name, **extra)
            y = np.asarray(y, dtype=np.float64)[top : top + h, left : left + w]
            if c == 1:
                luma = y @ np.array([0.299, 0.587, 0.114])
                out[i, 0] = np.clip(np.rint(luma), 0, 255).astype(np.uint8)
            else:
                out[i] = np.clip(np.rint(y), 0, 255).astype(np.uint8).transpose(2, 0, 1)
    finally:
        np.random.set_state(state)
    return torch.from_numpy(out)


def corrupted_test_split(
    cfg: Any, name: str, severity: int, *, seed: int = 0, cache: str | os.PathLike[str] | None = None
) -> tuple[torch.Tensor, np.ndarray]:
    """``(uint8 images (N, C, H, W), labels (N,))``: the (subset) test split of ``cfg`` (a DataConfig
    of a tensor dataset) corrupted by ``name`` at ``severity``, from the cache when made before.
    Raises DataError for a bad name or severity, a folder dataset (read ImageNet-C from disk instead:
    :mod:`bayesncl.data.shifted`), or a cache that cannot be written."""
    check_corruptions([name], [severity])
    split = load_split(cfg, "test")
    if split.images is None:
        raise DataError(
            f"data.name={cfg.name}: corrupted copies are made of tensor datasets (fashion-mnist, cifar10, "
            "...); for image folders read the released sets (ImageNet-C, -Sketch, Stylized-ImageNet) "
            "from data.root"
        )
    digest = hashlib.sha1(split.images.numpy().tobytes()).hexdigest()[:12]
    folder = Path(os.path.expanduser(str(cache or DEFAULT_CACHE)))
    path = folder / f"{cfg.name}-{len(split)}-{digest}-{name}-{severity}-seed{seed}.npy"
    if path.is_file():
        arr = np.load(path, allow_pickle=False)
        if arr.shape == tuple(split.images.shape) and arr.dtype == np.uint8:
            return torch.from_numpy(arr), split.labels
    out = corrupt_images(split.images, name, severity, seed)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
        np.save(tmp, out.numpy(), allow_pickle=False)
        os.replace(tmp, path)
    except OSError as e:
        raise DataError(f"the corrupted-image cache {folder} cannot be written: {e.strerror or e}") from None
    return out, split.labels
