"""Datasets and the SimCLR two-view augmentation: :func:`dataset_info`, :func:`build_train_loader`,
:func:`build_eval_loader`, :func:`load_split_images` of a validated
:class:`bayesncl.config.DataConfig`, and :class:`DataError` (contract and modules:
docs/architecture.md, ``bayesncl.data``)."""

# each reader module registers its data.name(s) in sources.READERS as imported, in this order (DATASETS')
from bayesncl.data import fmnist, cifar, folders, synthetic, backgrounds, dsprites, provided, stl10  # noqa: F401, I001
from bayesncl.data.augment import AugmentSpec, BatchAugment, mix_seed, sample_transform
from bayesncl.data.images import LazyImages, load_split_images
from bayesncl.data.loaders import TwoViewLoader, augment_spec, build_eval_loader, build_train_loader
from bayesncl.data.sources import (
    READERS,
    DataError,
    DatasetInfo,
    clear_cache,
    dataset_info,
    image_geometry,
    stratified_subset,
)

DATASETS: tuple[str, ...] = tuple(READERS)  # the allowed data.name values, the readers' registry

__all__ = [
    "DATASETS", "AugmentSpec", "BatchAugment", "DataError", "DatasetInfo", "LazyImages", "TwoViewLoader",
    "augment_spec", "build_eval_loader", "build_train_loader", "clear_cache", "dataset_info",
    "image_geometry", "load_split_images", "mix_seed", "sample_transform", "stratified_subset",
]
