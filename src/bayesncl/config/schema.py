"""The config's types and keys: the sections (data, eval; core's from :mod:`bayesncl.core.configs`),
the method presets, the allowed values of each key (:func:`choices`) and the dotted keys
``key=value`` accepts (:func:`valid_keys`, :func:`check_keys`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from dataclasses import asdict, dataclass, field
from typing import Any

from bayesncl.core import methods
from bayesncl.core.configs import COMPILE_MODES, ConfigError, ModelConfig, TrainConfig
from bayesncl.core.methods import MethodConfig


@dataclass
class DataConfig:
    """Where the images come from and how the two SimCLR views are made (PAPER-NOTES §2)."""

    name: str = "fashion-mnist"  # a name of bayesncl.data.DATASETS
    root: str | None = None  # None: search the usual places (see bayesncl.data)
    download: bool = False  # allow torchvision to download when online
    image_size: int = 0  # 0: the dataset's native size (28 FMNIST, 32 CIFAR, 224 folders)
    train_subset: int = 0  # 0: the whole train split; else a class-stratified subset of this size
    test_subset: int = 0  # 0: the whole test split
    num_workers: int = 0  # DataLoader workers (per-sample path only)
    # auto | true | false: hold the dataset as one uint8 tensor on device (batched augmentation); image
    # folders: auto = per-sample augmentation from the folder held decoded in memory when it fits
    # (the same batches as false, which reads the files each time)
    resident: str = "auto"
    crop_min_scale: float = 0.08
    # bilinear | bicubic: the training crop's resampling (the authors' pretraining loader: bicubic,
    # solo/data/pretrain_dataloader.py:221-231; bilinear keeps the older runs' numbers and hashes)
    crop_interpolation: str = "bilinear"
    blur_prob: float = 0.5
    skip_corrupt: bool = False  # imagefolder: skip unreadable images instead of failing
    classes: str | None = None  # imagefolder: a file listing the class folders to use (e.g. ImageNet-100)
    labels: str = "auto"  # auto | none; none: pretrain without labels (no online probe; stl10: + unlabeled)
    bg_correlation: float = 0.0  # fashion-mnist-bg: P(train place follows the class); test stays independent
    # the two views' pipelines, a preset of bayesncl.data.augment.PRESETS: default (the authors'
    # symmetric.yaml) | asymmetric (view 1 always blurred, view 2 solarized with p 0.2; weaker jitter) |
    # symmetric-weak (jitter 0.4/0.4/0.4/0.1; CIFAR's file for cifar*, ImageNet-100's otherwise) |
    # symmetric-weak-cifar | symmetric-weak-imagenet
    augment: str = "default"


#: The allowed ``eval.probe_protocol`` / ``eval.finetune_protocol`` values (bayesncl.metrics.protocols).
PROTOCOL_CHOICES: tuple[str, ...] = ("auto", "cifar", "imagenet")

#: The allowed ``train.loggers`` names (``bayesncl.runs.loggers`` runs them).
LOGGERS: tuple[str, ...] = ("csv", "tensorboard", "wandb")


@dataclass
class EvalDataConfig:
    """The labelled data evaluation reads (``eval.data.*``) when it is not the training data: an
    unlabeled pretraining set, or an encoder trained elsewhere. ``name`` empty: the training data
    (``data.*``, with its labels). The geometry (``data.image_size``) stays the training one."""

    name: str = ""  # "" (the training data) or a name of bayesncl.data.DATASETS
    root: str | None = None
    download: bool = False
    train_subset: int = 0
    test_subset: int = 0
    classes: str | None = None
    skip_corrupt: bool = False


@dataclass
class EvalConfig:
    """End-of-pretraining evaluation."""

    probe: str = "fast"  # fast (precomputed features, L2 chosen on held-out train) | none
    retrieval_dims: list[int] = field(default_factory=list)
    batch_size: int = 512
    # gated methods: evaluation features gate z with alpha, not the hard mask 1[alpha > threshold]
    # (the authors' eval.use_soft_gating, main_eval.py; off there too)
    use_soft_gating: bool = False
    # auto | cifar | imagenet: `evaluate --probe paper`'s optimiser and schedule (bayesncl.metrics.protocols):
    # cifar = LARS 0.4, warmup-cosine; imagenet = SGD 1.0, x0.1 at epochs 60, 80; auto: imagenet for
    # data.name=imagefolder, cifar otherwise (the authors' scripts/linear/{cifar,imagenet-100})
    probe_protocol: str = "auto"
    finetune_protocol: str = "auto"  # the same for `bayesncl finetune` (scripts/finetuning/...)
    # the feature-selection probe (reproduce ncl-fs, evaluate's selection probe): fast (our L-BFGS probe
    # on slices of z̃) | authors (the NCL code's SGD probe on slices of the projector output p, top-K by
    # expected activation: metrics.authors_selection; docs/metrics.md)
    selection_probe: str = "fast"
    # draw the evaluation's figures (top_activations.png, suppressed_features.png; evaluate's
    # embedding.png): false skips them (seconds per evaluation on a CPU); the numbers are the same
    figures: bool = True
    data: EvalDataConfig = field(default_factory=EvalDataConfig)


@dataclass
class Config:
    """The whole run. ``bayesncl pretrain key=value`` addresses fields as ``section.field``."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The config as nested dicts; the method's own keys sit beside the common ``method.*`` keys."""
        d = asdict(self)
        d["method"].update(d["method"].pop("own"))
        return d


METHOD_PRESETS: dict[str, dict[str, Any]] = {name: methods.preset(name) for name in methods.METHODS}
"""What ``method.name`` sets for each built-in method (:func:`bayesncl.core.methods.preset`, which
also knows the methods registered later): the parts that define the method; ablations override
single fields on top."""


def choices() -> dict[str, tuple[str, ...]]:
    """:func:`fixed_choices`, and ``method.name``: the methods registered now."""
    return {**fixed_choices(), "method.name": tuple(methods.METHODS)}


@functools.cache
def fixed_choices() -> dict[str, tuple[str, ...]]:
    """The allowed values of each key that has a fixed set, e.g. ``choices()["method.gate"]``.

    Most come from the registries next to the code that implements them; they are imported here,
    not at the top, so that reading a config (and ``bayesncl --help``) does not import torch. The
    optimisers and precisions are listed here: ``core.optim`` imports this module."""
    from bayesncl.core.model import BACKBONES
    from bayesncl.core.parts import GATE_KINDS, NOISES, NONNEG
    from bayesncl.data import DATASETS
    from bayesncl.data.augment import AUGMENT_PRESETS

    return {
        "data.name": tuple(DATASETS),
        "data.resident": ("auto", "true", "false"),
        "data.labels": ("auto", "none"),
        "data.crop_interpolation": ("bilinear", "bicubic"),
        "model.backbone": tuple(BACKBONES),
        "model.cifar_stem": ("auto", "true", "false"),
        "model.bn_views": ("per_view", "joint"),
        "method.nonneg": tuple(NONNEG),
        "method.gate": GATE_KINDS,
        "method.gumbel_noise": tuple(NOISES),
        "train.optimizer": ("lars", "sgd", "adamw"),
        "train.precision": ("auto", "fast", "fp32", "fp16", "bf16"),
        "train.compile": ("auto", "true", "false"),
        "train.compile_mode": COMPILE_MODES,
        "eval.probe": ("fast", "none"),
        "eval.probe_protocol": PROTOCOL_CHOICES,
        "eval.finetune_protocol": PROTOCOL_CHOICES,
        "data.augment": tuple(AUGMENT_PRESETS),
        "eval.selection_probe": ("fast", "authors"),
    }


def _fields(tp: Any = Config, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of the dataclass ``tp`` with its type (not the method's own keys)."""
    out: dict[str, Any] = {}
    own = {f.name for f in dataclasses.fields(tp) if f.metadata.get("own")}
    for name, ftp in typing.get_type_hints(tp).items():
        if name in own:
            continue
        key = prefix + name
        out.update(_fields(ftp, key + ".") if dataclasses.is_dataclass(ftp) else {key: ftp})
    return out


def valid_keys(method: str | None = None) -> list[str]:
    """Every dotted key that ``key=value`` accepts, e.g. ``method.rho``, ``eval.data.root``, with
    the own keys of ``method`` (a registered ``method.name``). A dict-valued key
    (``model.backbone_kwargs``) also takes ``KEY.NAME`` for one of its entries."""
    own = list(methods.METHODS[method].keys) if method in methods.METHODS else []
    return [*_fields(), *(f"method.{k}" for k in own)]


def list_keys() -> list[str]:
    """The dotted keys whose value is a list, e.g. ``eval.retrieval_dims``."""
    return [k for k, tp in _fields().items() if typing.get_origin(tp) is list]


def dict_entry(key: str) -> tuple[str, str] | None:
    """``("model.backbone_kwargs", "img_size")`` for ``model.backbone_kwargs.img_size`` (an entry of a
    key whose value is a dict of free entries), else None."""
    head, _, entry = key.rpartition(".")
    dict_valued = typing.get_origin(_fields().get(head)) is dict
    return (head, entry) if dict_valued and entry.isidentifier() else None


def unknown_key(key: str, method: str | None = None) -> ConfigError:
    owners = [m.name for m in methods.METHODS.values() if key.removeprefix("method.") in m.keys]
    if key.startswith("method.") and owners and method not in owners:
        return ConfigError(f"config key '{key}' is a key of method.name={owners[0]}, not of {method}")
    close = difflib.get_close_matches(key, valid_keys(method), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `bayesncl pretrain --help`"
    return ConfigError(f"unknown config key '{key}'{hint}")


def check_keys(keys: typing.Iterable[str], method: str | None = None) -> None:
    """Raise ConfigError for the first dotted key that is not a config key (with the own keys of
    ``method``), naming the closest ones."""
    valid = set(valid_keys(method))
    for k in keys:
        if k not in valid and dict_entry(k) is None:
            raise unknown_key(k, method)
