"""The two training loader paths (resident batched / per-sample DataLoader) and the eval loaders.

Loader paths: ``resident=auto`` uses the resident path for fashion-mnist/cifar/synthetic and the
per-sample path for imagefolder, which holds the folder decoded in memory when it fits (its size
against the free memory, :func:`bayesncl.data.images.memory_decision`; the batches are the same as
from the files); ``resident=false`` reads every image from disk each time; ``resident=true`` for
imagefolder decodes every image once at "shorter side S, centre crop S" into memory (training
crops then come from that square, a different distribution). On the per-sample path training
crops come from the native image and are resized to S.

Determinism: the epoch permutation comes from a ``torch.Generator`` seeded with
``mix_seed(seed, epoch)`` (same on every rank, then rank-strided); the augmentation of step
``t`` (resident) or of the ``j``-th sample of the rank's epoch order (per-sample) runs under a
forked global RNG seeded with ``mix_seed(seed, epoch, rank, t or j)``. So the batches of an
epoch are a function of ``(seed, epoch, rank)`` only — independent of ``num_workers``, of
earlier epochs and of the caller's RNG, which is left untouched. Call ``set_epoch(e)`` before
each epoch (like ``DistributedSampler``); iterating twice without it replays the same epoch.

Eval ``idx`` values index the (subset) split, as :func:`bayesncl.data.load_split_images` does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from bayesncl.data.augment import (
    AugmentSpec,
    BatchAugment,
    eval_folder_transform,
    mix_seed,
    preset_views,
    sample_transform,
    seeded,
)
from bayesncl.data.images import (
    FolderImages,
    MemoryFolder,
    decode_folder_square,
    memory_decision,
    resize_float,
    tensor_pil,
)
from bayesncl.data.sources import DataError, DatasetInfo, ShardDataError, dataset_info, load_split, logger

Batches = Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def uses_resident(cfg: Any) -> bool:
    """Whether ``cfg`` selects the resident (batched, on-device) training path."""
    folders = ("imagefolder", "waterbirds")  # datasets of image files
    return cfg.resident == "true" or (cfg.resident == "auto" and cfg.name not in folders)


def augment_spec(cfg: Any, info: DatasetInfo | None = None) -> AugmentSpec:
    """The training augmentation distribution for ``cfg`` (PAPER-NOTES §2)."""
    info = info or dataset_info(cfg)
    return AugmentSpec.simclr(
        info.image_size, info.channels, info.mean, info.std, crop_min_scale=float(cfg.crop_min_scale),
        blur_prob=float(cfg.blur_prob), interpolation=str(getattr(cfg, "crop_interpolation", "bilinear")),
    )


def augment_views(cfg: Any, info: DatasetInfo | None = None) -> tuple[AugmentSpec, AugmentSpec]:
    """The two views' distributions for ``cfg``: ``data.augment``'s preset on :func:`augment_spec`
    (:func:`bayesncl.data.augment.preset_views`; ``default``: the same spec twice)."""
    info = info or dataset_info(cfg)
    return preset_views(augment_spec(cfg, info), str(getattr(cfg, "augment", "default")), str(cfg.name))


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
    ``spec`` (view 1's AugmentSpec), ``spec2`` (view 2's: ``spec`` unless ``data.augment`` gives the
    views different pipelines), ``num_skipped`` (corrupt images skipped so far), ``note`` (a line
    for the log on where the images come from; empty for tensor datasets).
    """

    resident: bool = False
    note: str = ""

    def __init__(
        self, n: int, batch_size: int, spec: AugmentSpec, *, seed: int, device: torch.device,
        rank: int, world_size: int, spec2: AugmentSpec | None = None,
    ) -> None:
        self.n, self.batch_size, self.spec, self.seed, self.device = n, batch_size, spec, int(seed), device
        self.spec2 = spec if spec2 is None else spec2
        self.rank, self.world_size, self.num_samples = rank, world_size, n // world_size
        self.epoch = self.start_step = 0

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select ``epoch``; ``start_step`` > 0 skips the first steps (mid-epoch resume)."""
        self.epoch = int(epoch)
        self.start_step = int(start_step)

    def _order(self) -> torch.Tensor:
        return _epoch_order(self.n, self.seed, self.epoch, self.rank, self.world_size)

    @property
    def num_skipped(self) -> int:
        return 0

    def __iter__(self) -> Batches:
        raise NotImplementedError


class ResidentTwoViewLoader(TwoViewLoader):
    """The split as one uint8 ``(N, C, H, W)`` tensor on ``device``; both views of a batch are
    augmented in ONE :class:`BatchAugment` call on the ``2B`` stacked copies (independent
    parameters per copy) under a seed of ``(seed, epoch, rank, step)``; views of different specs
    (``spec2``): view 1's call then view 2's, under that seed."""

    resident = True

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, spec: AugmentSpec, *,
        seed: int, device: torch.device, rank: int = 0, world_size: int = 1, spec2: AugmentSpec | None = None,
    ) -> None:
        super().__init__(
            len(images), batch_size, spec, seed=seed, device=device, rank=rank, world_size=world_size,
            spec2=spec2,
        )
        self.images = images.to(device)
        self.labels = labels.to(device)
        self.augment = BatchAugment(spec)
        self.augment2 = None if self.spec2 == spec else BatchAugment(self.spec2)

    def __iter__(self) -> Batches:
        order = self._order()
        if self.device.type == "cuda":  # pinned: each step's indices go over without a host wait
            order = order.pin_memory()
        b = self.batch_size
        for step in range(self.start_step, len(self)):
            idx = order[step * b : (step + 1) * b].to(self.device, non_blocking=True)
            x = self.images[idx].float().div_(255.0)
            # One kornia call for both views (2B samples, each with its own parameters): half the
            # per-call overhead, which dominates on a GPU.
            with seeded(mix_seed(self.seed, self.epoch, self.rank, step), self.device):
                if self.augment2 is None:
                    views = self.augment(torch.cat([x, x]))
                else:
                    views = torch.cat([self.augment(x), self.augment2(x)])
            yield views[:b], views[b:], self.labels[idx]


_Getter = Callable[[int], tuple[Any, int]]  # index -> (PIL image, index actually used)


class _TwoViewDataset(torch.utils.data.Dataset):
    """Items are ``(index, seed)`` keys: the two views of image ``index`` under ``seed`` (view 2 by
    ``transform2`` where given)."""

    def __init__(
        self, get: _Getter, labels: np.ndarray, transform: Callable, transform2: Callable | None = None
    ) -> None:
        self.get = get
        self.labels = labels
        self.transform = transform
        self.transform2 = transform if transform2 is None else transform2

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
            v2 = self.transform2(img).as_subclass(torch.Tensor)
        return v1, v2, int(self.labels[j])


class _KeySampler(torch.utils.data.Sampler):
    """Yields ``(index, seed)`` for this rank's epoch order. Holds its own copy of the epoch state
    (no reference back to the loader: a cycle would delay the DataLoader's finaliser to the garbage
    collector, and its persistent workers then took 5 s to shut down)."""

    def __init__(self, n: int, batch_size: int, steps: int, seed: int, rank: int, world_size: int) -> None:
        self.n, self.batch_size, self.steps = n, batch_size, steps
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = self.start_step = 0

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
        folder: FolderImages | MemoryFolder | None = None, skipped_upfront: int = 0,
        spec2: AugmentSpec | None = None,
    ) -> None:
        super().__init__(
            len(labels), batch_size, spec, seed=seed, device=device, rank=rank, world_size=world_size,
            spec2=spec2,
        )
        self._folder = folder
        self._skipped_upfront = skipped_upfront
        second = None if self.spec2 == spec else sample_transform(self.spec2)
        self.dataset = _TwoViewDataset(get, labels, sample_transform(spec), second)
        self._sampler = _KeySampler(self.n, batch_size, len(self), self.seed, rank, world_size)
        self.loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=batch_size, sampler=self._sampler, drop_last=True,
            num_workers=num_workers, pin_memory=device.type == "cuda", persistent_workers=num_workers > 0,
            worker_init_fn=_worker_init if num_workers > 0 else None,
            generator=torch.Generator().manual_seed(mix_seed(seed, rank, 0xDA7A)),
        )

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        super().set_epoch(epoch, start_step)
        self._sampler.epoch, self._sampler.start_step = self.epoch, self.start_step

    @property
    def num_skipped(self) -> int:
        return self._skipped_upfront + (self._folder.num_skipped if self._folder is not None else 0)

    def __iter__(self) -> Batches:
        nb = self.device.type == "cuda"
        for batch in self.loader:
            x1, x2, y = (t.to(self.device, non_blocking=nb) for t in batch)
            yield x1, x2, y


def check_batch_size(batch_size: int, n: int, name: str, world_size: int = 1) -> None:
    """DataError for a batch larger than each rank's share of the ``n`` training samples of ``name``:
    a command checks it before it prints or writes anything (``DatasetInfo.num_train``), the loader again."""
    per_rank = n // world_size
    if batch_size > per_rank:
        shard = f" ({per_rank} per rank with world_size={world_size})" if world_size > 1 else ""
        raise DataError(
            f"batch_size={batch_size} is larger than the {n} training samples{shard} of {name}: "
            f"lower train.batch_size or raise data.train_subset"
        )


def build_train_loader(
    cfg: Any, batch_size: int, *, seed: int, device: torch.device | str, rank: int = 0, world_size: int = 1,
    crop_flip_only: bool = False, info: DatasetInfo | None = None,
) -> TwoViewLoader:
    """The two-view training loader of ``cfg`` (a DataConfig): resident or per-sample (see module doc).

    Yields ``(x1, x2, y)``: two float ``(B, C, S, S)`` normalised views and int64 ``(B,)`` labels.
    ``crop_flip_only``: random resized crop and horizontal flip only (no colour jitter, grayscale
    or blur), the same for both views whatever ``data.augment``: the augmentation of the paper's
    linear-probe protocol (PAPER-NOTES §2). Otherwise the views of ``data.augment``
    (:func:`augment_views`).

    Raises DataError for missing data, ``batch_size < 2`` or ``batch_size`` larger than this
    rank's share of the training split. ``info``: ``dataset_info(cfg)`` where the caller has it.
    """
    device = torch.device(device)
    if batch_size < 2:
        raise DataError(f"batch_size={batch_size}: expected >= 2 (InfoNCE needs negatives)")
    info = info or dataset_info(cfg)
    data = load_split(cfg, "train")
    n = len(data)
    check_batch_size(batch_size, n, info.name, world_size)
    if crop_flip_only:
        # the authors' classification loader crops with torchvision's default, bilinear
        # (solo/data/classification_dataloader.py), whatever the pretraining crop was
        spec = dataclasses.replace(augment_spec(cfg, info), jitter_p=0.0, gray_p=0.0, blur_p=0.0,
                                   solarize_p=0.0, interpolation="bilinear")  # fmt: skip
        spec2 = spec
    else:
        spec, spec2 = augment_views(cfg, info)
    kw = dict(seed=seed, device=device, rank=rank, world_size=world_size, spec2=spec2)
    if uses_resident(cfg):
        images = data.images
        if images is None:
            assert data.paths is not None
            logger.info("decoding %d folder images at %dpx (data.resident=true)", n, info.image_size)
            images = decode_folder_square(data.paths, info.image_size, cfg.skip_corrupt)
        return ResidentTwoViewLoader(images, torch.from_numpy(data.labels.copy()), batch_size, spec, **kw)
    if data.images is not None:
        get = functools.partial(tensor_pil, data.images)
        return PerSampleTwoViewLoader(get, data.labels, batch_size, spec, num_workers=cfg.num_workers, **kw)
    assert data.paths is not None
    folder: FolderImages | MemoryFolder = FolderImages(data.paths, cfg.skip_corrupt)
    note = "image folder read from disk (data.resident=false)"
    if cfg.resident == "auto":  # held decoded when it fits: the same batches, no file read per sample
        hold, note = memory_decision(data.paths, copies=world_size)
        logger.info(note)
        folder = MemoryFolder(folder) if hold else folder
    loader = PerSampleTwoViewLoader(
        folder.get, data.labels, batch_size, spec, num_workers=cfg.num_workers, folder=folder,
        skipped_upfront=len(data.skipped), **kw,
    )
    loader.note = note
    return loader


# ============================================================================ eval loaders
class EvalLoader:
    """Deterministic, unaugmented ``(x, y, idx)`` batches of a (subset) split on ``device``;
    ``idx`` indexes the split as returned by :func:`bayesncl.data.load_split_images`.
    ``len()`` = batches."""

    def __init__(self, n: int, batch_size: int, device: torch.device) -> None:
        self.n, self.batch_size, self.device, self.num_skipped = n, batch_size, device, 0

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self) -> Batches:
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

    def __iter__(self) -> Batches:
        nb = self.device.type == "cuda"
        for lo in range(0, self.n, self.batch_size):
            hi = min(lo + self.batch_size, self.n)
            x = self.images[lo:hi].to(self.device, non_blocking=nb).float().div_(255.0)
            x = (resize_float(x, self.size) - self.mean) / self.std
            yield x, self.labels[lo:hi].to(self.device), torch.arange(lo, hi, device=self.device)


class _FolderEvalDataset(torch.utils.data.Dataset):
    def __init__(self, folder: FolderImages, labels: np.ndarray, transform: Callable) -> None:
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

    def __iter__(self) -> Batches:
        nb = self.device.type == "cuda"
        for x, y, idx in self.loader:
            yield x.to(self.device, non_blocking=nb), y.to(self.device), idx.to(self.device)


def build_eval_loader(
    cfg: Any, split: str, batch_size: int, *, device: torch.device | str, info: DatasetInfo | None = None
) -> EvalLoader:
    """Unaugmented ``(x, y, idx)`` batches of ``split`` ("train" or "test"; folders: test = val/):
    float ``(B, C, S, S)`` resized to S if needed and normalised, int64 labels and split indices,
    in split order (no drop_last). ``info``: ``dataset_info(cfg)`` where the caller has it. Raises
    DataError."""
    data = load_split(cfg, split)
    images = data.images if data.images is not None else data.paths
    assert images is not None
    loader = eval_loader(
        images, data.labels, info or dataset_info(cfg), batch_size, torch.device(device),
        num_workers=cfg.num_workers, skip_corrupt=cfg.skip_corrupt,
    )
    loader.num_skipped = len(data.skipped)
    return loader


def eval_loader(
    images: torch.Tensor | list[str], labels: np.ndarray, info: DatasetInfo, batch_size: int,
    device: torch.device, *, num_workers: int = 0, skip_corrupt: bool = False,
) -> EvalLoader:
    """Unaugmented ``(x, y, idx)`` batches of uint8 ``images`` (N, C, H, W) or of image files (their
    paths, at the evaluation geometry) with int ``labels`` (N,), normalised with ``info``'s statistics."""
    if isinstance(images, torch.Tensor):
        y = torch.from_numpy(np.asarray(labels, dtype=np.int64).copy())
        return _TensorEvalLoader(images, y, batch_size, device, info.image_size, info.mean, info.std)
    tf = eval_folder_transform(info.image_size, info.mean, info.std)
    ds = _FolderEvalDataset(FolderImages(images, skip_corrupt), labels, tf)
    return _FolderEvalLoader(ds, batch_size, device, num_workers)
