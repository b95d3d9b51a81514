"""Datasets and the SimCLR two-view augmentation (contract: docs/architecture.md, ``bayesncl.data``).

Public API::

    dataset_info(cfg) -> DatasetInfo
    build_train_loader(cfg, batch_size, *, seed, device, rank=0, world_size=1) -> TwoViewLoader
    build_eval_loader(cfg, split, batch_size, *, device) -> EvalLoader  # yields (x, y, idx)
    load_split_images(cfg, split) -> (uint8 (N, C, S, S) tensor or LazyImages, labels)
    DataError(ValueError)

``cfg`` is a :class:`bayesncl.config.DataConfig`. Details (search paths, subsets, corrupt images,
gray data, determinism) are in :mod:`bayesncl.data.datasets` and :mod:`bayesncl.data.augment`.
"""

from bayesncl.data.augment import AugmentSpec, BatchAugment, blur_kernel_size, mix_seed, sample_transform
from bayesncl.data.datasets import (
    DATASETS,
    DataError,
    DatasetInfo,
    EvalLoader,
    LazyImages,
    PerSampleTwoViewLoader,
    ResidentTwoViewLoader,
    TwoViewLoader,
    augment_spec,
    build_eval_loader,
    build_train_loader,
    clear_cache,
    dataset_info,
    image_geometry,
    load_split_images,
    stratified_subset,
    subset_indices,
    uses_resident,
)

__all__ = [
    "DATASETS",
    "AugmentSpec",
    "BatchAugment",
    "DataError",
    "DatasetInfo",
    "EvalLoader",
    "LazyImages",
    "PerSampleTwoViewLoader",
    "ResidentTwoViewLoader",
    "TwoViewLoader",
    "augment_spec",
    "blur_kernel_size",
    "build_eval_loader",
    "build_train_loader",
    "clear_cache",
    "dataset_info",
    "image_geometry",
    "load_split_images",
    "mix_seed",
    "sample_transform",
    "stratified_subset",
    "subset_indices",
    "uses_resident",
]
