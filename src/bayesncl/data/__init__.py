"""Datasets and the SimCLR two-view augmentation (contract: docs/architecture.md, ``bayesncl.data``).

Public API::

    DATASETS: the allowed data.name values
    dataset_info(cfg) -> DatasetInfo
    build_train_loader(cfg, batch_size, *, seed, device, rank=0, world_size=1) -> TwoViewLoader
    build_eval_loader(cfg, split, batch_size, *, device) -> EvalLoader  # yields (x, y, idx)
    load_split_images(cfg, split) -> (uint8 (N, C, S, S) tensor or LazyImages, labels)
    DataError(ValueError)

``cfg`` is a validated :class:`bayesncl.config.DataConfig`. Modules: :mod:`~bayesncl.data.sources`
(the readers' registry, subsets, metadata), a module per reader family (``fmnist``, ``cifar``,
``folders``, ``synthetic``, ``stl10``, ...), :mod:`~bayesncl.data.download`, :mod:`~bayesncl.data.images`
(decoding, figure images), :mod:`~bayesncl.data.loaders` (training and eval loaders, determinism),
:mod:`~bayesncl.data.augment`.
"""

# each reader module registers its data.name(s) in sources.READERS as imported, in this order (DATASETS')
from bayesncl.data import fmnist, cifar, folders, synthetic, backgrounds, dsprites, provided, stl10  # noqa: F401, I001
from bayesncl.data.augment import AugmentSpec, BatchAugment, mix_seed, sample_transform
from bayesncl.data.images import LazyImages, load_split_images
from bayesncl.data.loaders import (
    EvalLoader,
    PerSampleTwoViewLoader,
    ResidentTwoViewLoader,
    TwoViewLoader,
    augment_spec,
    build_eval_loader,
    build_train_loader,
    uses_resident,
)
from bayesncl.data.sources import (
    READERS,
    DataError,
    DatasetInfo,
    clear_cache,
    dataset_info,
    image_geometry,
    stratified_subset,
    subset_indices,
)

DATASETS: tuple[str, ...] = tuple(READERS)  # the allowed data.name values, the readers' registry

__all__ = [
    "DATASETS", "AugmentSpec", "BatchAugment", "DataError", "DatasetInfo", "EvalLoader", "LazyImages",
    "PerSampleTwoViewLoader", "ResidentTwoViewLoader", "TwoViewLoader", "augment_spec", "build_eval_loader",
    "build_train_loader", "clear_cache", "dataset_info", "image_geometry", "load_split_images", "mix_seed",
    "sample_transform", "stratified_subset", "subset_indices", "uses_resident"
]
