"""Image access: folder images decoded on demand, resizing, and the split images for figures.

Folder images that fail to decode when read (splits above ``folders.VERIFY_MAX_FILES`` are not
verified upfront, and ``verify`` cannot see every truncation) raise DataError naming the file, or
with ``data.skip_corrupt`` are replaced by the next readable image of the split and counted (in
that process: DataLoader workers count and warn separately).

Evaluation geometry: tensor datasets are resized to S (bilinear, antialiased); folder images
are "resize shorter side to S*256/224, centre crop S" (the ImageNet protocol).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bayesncl.data.augment import eval_folder_transform
from bayesncl.data.folders import corrupt_error
from bayesncl.data.sources import DataError, image_geometry, load_split, logger


def _open_rgb(path: str):
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


class FolderImages:
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
                    raise corrupt_error(self.paths[j], f"{type(e).__name__}: {e}") from None
                self.num_skipped += 1
                logger.warning("skipping corrupt image %s (%s: %s)", self.paths[j], type(e).__name__, e)
        raise DataError(f"no readable image near index {i} of {len(self.paths)} in the image folder")


# The share of the available memory that a training folder may take when held decoded in memory.
MEMORY_SHARE = 0.5


def available_memory() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable`` of /proc/meminfo, else the
    free physical pages); None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def decoded_size(paths: list[str], samples: int = 32) -> int:
    """Estimated bytes of every image of ``paths`` decoded as RGB uint8 (H x W x 3 each), from the
    headers of up to ``samples`` of them spread over the list (nothing is decoded); unreadable
    headers are left out of the estimate (0 when none is readable)."""
    from PIL import Image

    if not paths:
        return 0
    n, m = len(paths), min(samples, len(paths))
    picks = sorted({round(k * (n - 1) / max(m - 1, 1)) for k in range(m)})
    sizes = []
    for i in picks:
        try:
            with Image.open(paths[i]) as im:
                sizes.append(im.size[0] * im.size[1] * 3)
        except Exception:  # noqa: BLE001 - PIL raises many types for bad files; they are skipped later
            continue
    return round(sum(sizes) / len(sizes) * n) if sizes else 0


def memory_decision(paths: list[str], copies: int = 1) -> tuple[bool, str]:
    """Whether to hold the folder ``paths`` decoded in memory: when ``copies`` x its
    :func:`decoded_size` is at most :data:`MEMORY_SHARE` of :func:`available_memory` (``copies``:
    the processes that each hold one). Returns ``(hold, a line saying why)``."""
    need, free = decoded_size(paths) * copies, available_memory()
    copied = f" x {copies} processes" if copies > 1 else ""
    size = f"{len(paths):,} images, ~{need / 2**20:,.1f} MiB decoded{copied}"
    if free is None:
        return False, f"image folder read from disk ({size}; the free memory is unknown here)"
    budget = f"{MEMORY_SHARE:.0%} of the {free / 2**30:,.1f} GiB available"
    if need > MEMORY_SHARE * free:
        return False, f"image folder read from disk: {size} > {budget}"
    return True, f"image folder held in memory: {size} <= {budget} (data.resident=false reads it from disk)"


class MemoryFolder:
    """Every image of a :class:`FolderImages` decoded once, up front, and held as RGB uint8 arrays:
    ``get(i)`` returns the same PIL image and index as ``folder.get(i)`` (the corrupt-file policy
    applied once, here), so training on it gives the same batches as reading the files."""

    def __init__(self, folder: FolderImages) -> None:
        self.paths, self.skip_corrupt = folder.paths, folder.skip_corrupt
        held = [folder.get(i) for i in range(len(folder))]
        self.arrays = [np.asarray(img) for img, _ in held]
        self.used = [j for _, j in held]
        self.num_skipped = folder.num_skipped

    def __len__(self) -> int:
        return len(self.arrays)

    def get(self, i: int) -> tuple[Any, int]:
        """``(PIL RGB image, index actually used)``, as :meth:`FolderImages.get`."""
        from PIL import Image

        return Image.fromarray(self.arrays[i], "RGB"), self.used[i]


def tensor_pil(images: torch.Tensor, i: int) -> tuple[Any, int]:
    """``(PIL image of images[i], i)``: mode L for 1 channel, else RGB (``images``: uint8 (N, C, H, W))."""
    from PIL import Image

    a = images[i].numpy()
    img = Image.fromarray(a[0], mode="L") if a.shape[0] == 1 else Image.fromarray(a.transpose(1, 2, 0), "RGB")
    return img, i


def resize_float(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` (B, C, H, W) float resized to (B, C, size, size), bilinear with antialias (as is if already)."""
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


def _resize_uint8(x: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    if x.shape[-1] == size and x.shape[-2] == size:
        return x
    out = [
        resize_float(x[i : i + chunk].float(), size).round_().clamp_(0, 255).to(torch.uint8)
        for i in range(0, len(x), chunk)
    ]
    return torch.cat(out)


def decode_folder_square(paths: list[str], size: int, skip_corrupt: bool) -> torch.Tensor:
    """Every image of ``paths`` at "shorter side ``size``, centre crop ``size``": uint8 (N, 3, size, size)."""
    from torchvision.transforms import v2 as T

    src = FolderImages(paths, skip_corrupt)
    tf = T.Compose([T.Resize(size, antialias=True), T.CenterCrop(size), T.ToImage()])
    out = torch.empty((len(paths), 3, size, size), dtype=torch.uint8)
    for i in range(len(paths)):
        out[i] = tf(src.get(i)[0])
    return out


class LazyImages:
    """Folder images decoded on demand at the evaluation geometry, as uint8 tensors.

    ``images[i]`` → ``(C, S, S)``; ``images[list or tensor of indices]`` → ``(k, C, S, S)``;
    ``len(images)`` and ``images.shape`` work like a tensor's. Returned by
    :func:`load_split_images` for image folders, which can be too large to decode at once.
    """

    def __init__(self, paths: list[str], size: int, skip_corrupt: bool = False) -> None:
        self._src = FolderImages(paths, skip_corrupt)
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
    matches ``idx == i`` from :func:`bayesncl.data.build_eval_loader`. Raises DataError.
    """
    data = load_split(cfg, split)
    size = image_geometry(cfg)[1]
    labels = torch.from_numpy(data.labels.copy())
    if data.images is None:
        assert data.paths is not None
        return LazyImages(data.paths, size, bool(cfg.skip_corrupt)), labels
    return _resize_uint8(data.images, size), labels
