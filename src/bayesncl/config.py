"""Typed configuration: dataclass defaults, method presets, YAML files and dotted overrides.

Resolution order (later wins):

1. dataclass defaults below;
2. the preset named by ``method.name`` (:data:`METHOD_PRESETS`);
3. the YAML file given with ``--config``;
4. ``key=value`` overrides from the command line;

or a run's saved config, overrides on top (``--resume``, a reloaded run): :func:`build_config` builds both.

An unknown key is an error naming the key and the closest valid keys; values are coerced to the
field's type and range-checked by :func:`validate` before any training starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import re
import types
import typing
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bayesncl.core import methods
from bayesncl.core.configs import ConfigError, MethodConfig, ModelConfig, TrainConfig
from bayesncl.core.methods.plugins import PLUGINS_FILE, load_plugin

RECIPES_DIR = Path(__file__).parent / "configs"  # the shipped recipes (--config NAME)


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
        "eval.probe": ("fast", "none"),
    }


def _keys_of(tp: Any, prefix: str = "") -> list[str]:
    keys: list[str] = []
    own = {f.name for f in dataclasses.fields(tp) if f.metadata.get("own")}
    for name, ftp in typing.get_type_hints(tp).items():
        if name not in own:
            sub = dataclasses.is_dataclass(ftp)
            keys += _keys_of(ftp, f"{prefix}{name}.") if sub else [f"{prefix}{name}"]
    return keys


def valid_keys(method: str | None = None) -> list[str]:
    """Every dotted key that ``key=value`` accepts, e.g. ``method.rho``, ``eval.data.root``, with
    the own keys of ``method`` (a registered ``method.name``). A dict-valued key
    (``model.backbone_kwargs``) also takes ``KEY.NAME`` for one of its entries."""
    own = list(methods.METHODS[method].keys) if method in methods.METHODS else []
    return _keys_of(Config) + [f"method.{k}" for k in own]


def _keys_of_kind(origin: type) -> list[str]:
    hints = typing.get_type_hints(Config)
    return [
        f"{sec}.{name}"
        for sec, tp in hints.items() if dataclasses.is_dataclass(tp)
        for name, ftp in typing.get_type_hints(tp).items() if typing.get_origin(ftp) is origin
        and not any(f.name == name and f.metadata.get("own") for f in dataclasses.fields(tp))
    ]


def dict_keys() -> list[str]:
    """The dotted keys whose value is a dict of free entries, e.g. ``model.backbone_kwargs``."""
    return _keys_of_kind(dict)


def list_keys() -> list[str]:
    """The dotted keys whose value is a list, e.g. ``eval.retrieval_dims``."""
    return _keys_of_kind(list)


def _dict_entry(key: str) -> tuple[str, str] | None:
    """``("model.backbone_kwargs", "img_size")`` for ``model.backbone_kwargs.img_size``, else None."""
    head, _, entry = key.rpartition(".")
    return (head, entry) if head in dict_keys() and entry.isidentifier() else None


def _unknown_key(key: str, method: str | None = None) -> ConfigError:
    owners = [m.name for m in methods.METHODS.values() if key.removeprefix("method.") in m.keys]
    if key.startswith("method.") and owners and method not in owners:
        return ConfigError(f"config key '{key}' is a key of method.name={owners[0]}, not of {method}")
    close = difflib.get_close_matches(key, valid_keys(method), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see `bayesncl pretrain --help`"
    return ConfigError(f"unknown config key '{key}'{hint}")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Coerce a YAML/CLI value to the annotated type ``tp``; raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null", ""))
        if is_none and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, value, inner[0])
    if origin is dict:  # model.backbone_kwargs={img_size: 32}; entries are checked by validate
        if isinstance(value, str) and value.strip().lower() in ("", "{}", "none", "null"):
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping, e.g. {key}.img_size=32")
        return dict(value)
    if origin is list:  # a single value is a one-element list for key=value only (load_yaml refuses it)
        if isinstance(value, str):
            value = [v for v in value.replace(" ", "").split(",") if v]  # key=32,64 means [32, 64]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]  # key=64 means [64]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r}: expected a list")
        return [_coerce(key, v, args[0]) for v in value]
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            s = str(value).lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if tp is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, int):  # exact: through a float, seed=2**64-1 became 2**64
                return value
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    return int(value.strip())  # "12", "18446744073709551615"; "1e3" goes on below
            f = float(value)
            if f != int(f):
                raise ValueError
            return int(f)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            f = float(value)
            if not math.isfinite(f):
                raise ConfigError(f"{key}={value!r}: expected a finite number")
            return f
        if tp is str:
            if isinstance(value, bool):
                return "true" if value else "false"
            return str(value)
    except ConfigError:
        raise
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key}={value!r}: expected {tp.__name__}") from None
    raise ConfigError(f"{key}: unsupported type {tp}")


def flatten(d: dict[str, Any], prefix: str = "", source: Path | None = None) -> dict[str, Any]:
    """``{"train": {"epochs": 2}}`` -> ``{"train.epochs": 2}``. ``source``: the config file ``d`` was
    read from, where a key given twice (``train: {epochs: 2}`` and ``train.epochs: 3``) is an error."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        items = flatten(v, key + ".", source) if isinstance(v, dict) else {key: v}
        if source is not None and (twice := sorted(items.keys() & out.keys())):
            raise ConfigError(
                f"config file '{source}': {twice[0]} is given twice (in its section and as a dotted key); "
                "give it once"
            )
        out.update(items)
    return out


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["method.rho=0.8", ...]`` → ``{"method.rho": "0.8"}``. Raises ConfigError on bad syntax."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value (e.g. method.rho=0.8)")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


# An example entry of each section, for the error a non-mapping section gets.
_SECTION_EXAMPLES = {
    "data": "data: {name: cifar10}", "model": "model: {backbone: resnet18}", "method": "method: {rho: 0.5}",
    "train": "train: {epochs: 10}", "eval": "eval: {batch_size: 512}",
}


def refuse_fixed_keys(overrides: typing.Iterable[str], fixed: typing.Iterable[str], what: str) -> None:
    """Raise ConfigError if a ``key=value`` of ``overrides`` sets one of the ``fixed`` keys, which a
    command sets itself, e.g. ``method.name defines the variants of table 2; it cannot be overridden
    here``. ``what`` completes "defines ..."."""
    clash = sorted({o.split("=", 1)[0].strip() for o in overrides} & set(fixed))
    if clash:
        one = len(clash) == 1
        raise ConfigError(
            f"{', '.join(clash)} {'defines' if one else 'define'} {what}; "
            f"{'it' if one else 'they'} cannot be overridden here"
        )


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: a second ``method:`` section dropped every key of the first)."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    first: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: merged keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first.get(key)
        except TypeError:  # an unhashable key: SafeLoader's own error follows
            continue
        if seen is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first at line {seen + 1})", key_node.start_mark
            )
        first[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into flat dotted keys.

    Raises ConfigError (one line, naming the file) if it is missing, a directory, not UTF-8 text,
    not valid YAML (a key given twice in one mapping too), not a mapping of sections, has a section
    (``method:``, ...) that is not a mapping of keys, or gives a single value for a list key
    (``retrieval_dims: 64``: a YAML file writes a list as one, ``[64]``; the command line's
    ``eval.retrieval_dims=64`` or ``=32,64`` is the short form for ``key=value``, where brackets
    would need quoting)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file '{p}' is a directory, not a YAML file")
    if p.exists() and not p.is_file():
        raise ConfigError(f"config file '{p}' is not a regular file (a device, a pipe, ...), not a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file '{p}' does not exist")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file '{p}' is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
            "expected a YAML file"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file '{p}' cannot be read: {e.strerror or e}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader) or {}  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"config file '{p}' is not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file '{p}' must hold a mapping of sections, got {type(raw).__name__}")
    for section, value in list(raw.items()):
        if section in _SECTION_EXAMPLES and value is None:  # a section with every key commented out
            del raw[section]
        elif section in _SECTION_EXAMPLES and not isinstance(value, dict):
            raise ConfigError(
                f"config file '{p}': section '{section}' must be a mapping of keys "
                f"(e.g. {_SECTION_EXAMPLES[section]}), got {value!r}"
            )
    flat = flatten(raw, source=p)
    for key in list_keys():
        if key in flat and not isinstance(flat[key], list):
            example = f"{key.split('.')[-1]}: [32, 64]"
            raise ConfigError(f"config file '{p}': {key}={flat[key]!r}: expected a list, e.g. {example}")
    return flat


def load_run_yaml(path: str | Path) -> dict[str, Any]:
    """A run's ``config.yaml`` (its whole resolved config) as flat dotted keys, for
    :func:`build_config`. Raises ConfigError naming the file where :func:`load_yaml` does, and
    when the file is empty (no key at all: every setting would silently be a default)."""
    flat = load_yaml(path)
    if not flat:
        raise ConfigError(f"config file '{path}' is empty, expected the run's resolved config")
    return flat


def path_arg(value: str | None, name: str, expected: str) -> Path | None:
    """``Path(value)``, or None for an option not given. An empty value (``--run-dir ""``) is a
    ConfigError naming ``name`` and what was ``expected``, never a silent fallback to a default
    location or to the current folder."""
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{name} {value!r}: expected {expected}, not an empty path")
    return Path(value)


def resolve_config_path(value: str | None) -> Path | None:
    """``--config`` takes a YAML path or the name of a shipped recipe (e.g. ``cifar100-bayesncl``)."""
    p = path_arg(value, "--config", "a YAML file or recipe name")
    if p is None:
        return None
    if p.exists() or p.suffix in (".yaml", ".yml"):
        return p
    shipped = RECIPES_DIR / f"{value}.yaml"
    if shipped.exists():
        return shipped
    names = ", ".join(sorted(q.stem for q in RECIPES_DIR.glob("*.yaml")))
    raise ConfigError(f"--config {value}: no such file or recipe; recipes: {names}")


def check_keys(keys: typing.Iterable[str], method: str | None = None) -> None:
    """Raise ConfigError for the first dotted key that is not a config key (with the own keys of
    ``method``), naming the closest ones."""
    valid = set(valid_keys(method))
    for k in keys:
        if k not in valid and _dict_entry(k) is None:
            raise _unknown_key(k, method)


def build_config(
    base: str | Path | dict[str, Any] | Config | None = None,
    overrides: list[str] | dict[str, Any] | None = None, *,
    plugins: typing.Iterable[str | Path] = (), source: str | Path | None = None, warn_inert: bool = True,
) -> Config:
    """The one way to a checked Config. ``base``: None or a YAML file or recipe name (e.g.
    ``cifar100-bayesncl``): defaults → the method's preset → the file; or a run's saved config (a
    Config or dict; ``source``: its file, named by its errors) as it is. Then ``overrides``
    (``key=value`` strings or dotted keys), after loading the ``plugins``; :func:`validate` once.

    Raises ConfigError (one line) for an unknown key, a value of the wrong type or out of range.
    ``warn_inert``: warn about command-line method keys that have no effect with the method
    (:func:`warn_inert_keys`); False for a caller that decides itself (the demo's two runs).
    """
    for p in plugins:
        load_plugin(p)
    command_line = parse_overrides(overrides) if isinstance(overrides, list) else {}
    given = command_line or flatten(overrides or {})
    reload = not isinstance(base, (str, Path, type(None)))
    if reload:
        cfg = _reloaded(base.to_dict() if isinstance(base, Config) else base, source)
        for k, v in given.items():
            set_key(cfg, k, v)
    else:
        cfg, source = _fresh(base, given), None
    try:
        validate(cfg)
    except ConfigError as e:  # a bad value of the file, unless the overrides set it
        key = re.match(r"[\w.]*", str(e)).group()  # type: ignore[union-attr]
        if source is None or key in given:
            raise
        raise ConfigError(f"the config in {source}: {e}") from None
    if reload:
        return cfg
    if warn_inert:  # command-line keys only: a recipe file may serve several methods
        warn_inert_keys(cfg.method, inert_method_keys(cfg.method, command_line), stacklevel=3)
    became = preset_of(cfg.method)
    changed = [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in command_line.items() if k in ("method.nonneg", "method.topk", "method.gate")
    ]
    if changed and became != cfg.method.name:
        warnings.warn(
            f"{', '.join(changed)} turn{'s' if len(changed) == 1 else ''} "
            f"method.name={cfg.method.name} into {became}; its results are still labelled "
            f"{cfg.method.name} (use method.name={became} if that is what you want)",
            stacklevel=2,
        )
    t = cfg.train
    if t.warmup_epochs > t.epochs:
        warnings.warn(
            f"train.warmup_epochs={t.warmup_epochs:g} is more than train.epochs={t.epochs}: the warmup is "
            "cut to the run's length, so the whole run warms up and the cosine decay never starts "
            "(set train.warmup_epochs < train.epochs)",
            stacklevel=2,
        )
    return cfg


def _fresh(base: str | Path | None, given: dict[str, Any]) -> Config:
    """Defaults → the preset of the method ``base`` and ``given`` name → ``base`` → ``given``."""
    user: dict[str, Any] = {}
    path = resolve_config_path(None if base is None else str(base))
    if path is not None:
        user.update(load_yaml(path))
    user.update(given)
    cfg = Config()
    name = str(user.get("method.name", cfg.method.name))
    methods.get(name)  # a method that is not registered: one line naming those that are
    check_keys(user, name)
    flat = {"method.name": name, **{f"method.{k}": v for k, v in methods.preset(name).items()}}
    flat.update({k: v for k, v in user.items() if k != "method.name"})
    for k, v in flat.items():
        set_key(cfg, k, v)
    return cfg


def _reloaded(d: Any, source: str | Path | None) -> Config:
    """A run's resolved config ``d`` (nested sections) as a Config, no preset applied, unchecked."""
    try:
        if not isinstance(d, dict):
            raise ConfigError(f"expected a mapping of config sections, got {type(d).__name__}")
        flat, record = flatten(d), Path(source or ".").parent / PLUGINS_FILE
        files = record.read_text().split() if source and record.is_file() else []
        name = flat.get("method.name")
        if files and isinstance(name, str) and name not in methods.METHODS:  # a plugin's: name its file
            raise ConfigError(
                f"method.name={name} was registered by the plugin {', '.join(files)} ({record}): pass "
                f"{' '.join(f'--plugin {f}' for f in files)}"
            )
        cfg = Config()
        for k, v in sorted(flat.items(), key=lambda kv: kv[0] != "method.name"):  # the method first
            set_key(cfg, k, v)
    except ConfigError as e:
        if source is None:
            raise
        raise ConfigError(f"the config in {source}: {e}") from None
    return cfg


def warn_inert_keys(method: MethodConfig, inert: list[str], stacklevel: int = 2) -> None:
    """Warn that the method keys ``inert`` (from :func:`inert_method_keys`) have no effect with
    ``method``; nothing when there are none."""
    if inert:
        warnings.warn(
            f"{', '.join(inert)} {'has' if len(inert) == 1 else 'have'} no effect with "
            f"method.name={method.name} (method.gate={method.gate}, method.topk={str(method.topk).lower()})",
            stacklevel=stacklevel + 1,
        )


def preset_of(method: MethodConfig) -> str:
    """The preset whose defining parts ``method`` has (:func:`bayesncl.core.methods.closest`), e.g.
    ncl for ``method.name=ncl-topk method.topk=false``; ablations (a soft gate, another
    non-negativity map, no detach, ...) keep their preset."""
    return methods.closest(method)


def inert_method_keys(method: MethodConfig, keys: typing.Iterable[str]) -> list[str]:
    """Those of ``keys`` (dotted) that cannot change a run of ``method``: the gating head's settings
    when ``method.gate=none``, ``method.rho`` when there is neither gate nor TopK, the Gumbel noise
    without the Gumbel gate. E.g. ``method.lam`` for ``cl``."""
    inert = methods.unread_keys(method)
    return [k for k in keys if k.startswith("method.") and k.split(".", 1)[1] in inert]


def set_key(cfg: Config, key: str, value: Any) -> None:
    """Set dotted ``key`` on ``cfg`` with type coercion. Raises ConfigError if unknown or mistyped.

    ``KEY.NAME`` of a dict-valued key (``model.backbone_kwargs.img_size=32``) sets one entry, its
    value as YAML reads it (a number, a bool, a string, a list)."""
    entry = _dict_entry(key)
    if entry is not None:
        head, name = entry
        sec, field_name = head.split(".")
        getattr(getattr(cfg, sec), field_name)[name] = value
        return
    parts = key.split(".")
    obj: Any = cfg
    for p in parts[:-1]:
        if not hasattr(obj, p) or not dataclasses.is_dataclass(getattr(obj, p)):
            raise _unknown_key(key)
        obj = getattr(obj, p)
    hints = typing.get_type_hints(type(obj))
    if key == "method.name":  # the method's own keys start at its defaults
        cfg.method.name = _coerce(key, value, str)
        cfg.method.own = {k: spec.default for k, spec in methods.get(cfg.method.name).keys.items()}
    elif obj is cfg.method and parts[-1] in cfg.method.own:
        default = cfg.method.own[parts[-1]]
        cfg.method.own[parts[-1]] = _coerce(key, value, type(default))
    elif parts[-1] not in hints or dataclasses.is_dataclass(hints[parts[-1]]) or key == "method.own":
        raise _unknown_key(key, cfg.method.name)
    else:
        setattr(obj, parts[-1], _coerce(key, value, hints[parts[-1]]))


# Smallest data.image_size (besides 0, native): 8 px still trains with every backbone and stem; below
# that the augmentations degenerate (1 px crashes kornia's blur, 2-3 px train at chance).
MIN_IMAGE_SIZE = 8
# train.epochs: the per-iteration lr schedule is one array of epochs x steps; the papers use <= 1000.
MAX_EPOCHS = 100_000


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


TIMM_PREFIX = "timm:"
# Keyword arguments bayesncl sets itself when it builds a timm backbone.
TIMM_FIXED_KWARGS = ("num_classes", "in_chans", "pretrained")


@functools.cache
def timm_models() -> tuple[str, ...]:
    """Every model name timm can build (``timm.list_models()``), read once."""
    import timm

    return tuple(timm.list_models())


def _check_backbone(mo: ModelConfig) -> None:
    """``model.backbone=timm:NAME`` names a timm model (else the closest names); its
    ``model.backbone_kwargs`` are keyword names with plain values, none of those bayesncl sets."""
    kw = mo.backbone_kwargs
    if not mo.backbone.startswith(TIMM_PREFIX):
        _check(
            not kw,
            f"model.backbone_kwargs={kw}: keyword arguments are for timm backbones "
            f"(model.backbone=timm:NAME), not {mo.backbone}",
        )
        return
    name = mo.backbone[len(TIMM_PREFIX):]
    known = timm_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
        hint = f"; close names: {', '.join(close)}" if close else "; see timm.list_models()"
        raise ConfigError(f"model.backbone={mo.backbone}: timm has no model '{name}'{hint}")
    for k, v in kw.items():
        _check(
            k not in TIMM_FIXED_KWARGS,
            f"model.backbone_kwargs.{k}: set by bayesncl (no classifier, the data's channels, no pretrained "
            "weights); leave it out",
        )
        plain = (bool, int, float, str, type(None))
        _check(
            isinstance(v, plain) or (isinstance(v, list) and all(isinstance(x, plain) for x in v)),
            f"model.backbone_kwargs.{k}={v!r}: expected a number, a string, a bool or a list of them",
        )


def _check_eval_data(cfg: Config) -> None:
    """``eval.data.*``: a dataset name (or empty: the training data), and no setting without one."""
    from bayesncl.data import DATASETS

    e = cfg.eval.data
    if not e.name:
        given = [f"eval.data.{k}" for k, v in asdict(e).items() if k != "name" and v not in (None, False, 0)]
        _check(
            not given,
            f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect without eval.data.name "
            "(evaluation reads the training data): set eval.data.name",
        )
        return
    _check(e.name in DATASETS, f"eval.data.name={e.name!r}: expected one of {', '.join(DATASETS)}")
    _check(e.train_subset >= 0, f"eval.data.train_subset={e.train_subset}: expected >= 0")
    _check(e.test_subset >= 0, f"eval.data.test_subset={e.test_subset}: expected >= 0")
    _check(
        not e.classes or e.name == "imagefolder",
        f"eval.data.classes={e.classes}: a class list selects folders of eval.data.name=imagefolder, "
        f"not {e.name}",
    )


def eval_data(cfg: Config) -> DataConfig:
    """The DataConfig evaluation reads: ``data.*`` with its labels, or the ``eval.data.*`` dataset
    at the training geometry (``data.image_size``) and loader settings."""
    from bayesncl.data import image_geometry

    d = dataclasses.replace(cfg.data, labels="auto")
    if not cfg.eval.data.name:
        return d
    size = cfg.data.image_size or image_geometry(cfg.data)[1]
    return dataclasses.replace(d, **asdict(cfg.eval.data), image_size=size)


def validate(cfg: Config) -> None:
    """Range-check every field: the one place values are checked (the code in ``core`` trusts
    them). Raises ConfigError naming the first bad value and what was expected."""
    for key, allowed in choices().items():
        sec, name = key.split(".")
        val = getattr(getattr(cfg, sec), name)
        if key == "model.backbone" and str(val).startswith(TIMM_PREFIX):
            continue  # checked by _check_backbone
        more = " or timm:NAME (a timm model)" if key == "model.backbone" else ""
        _check(val in allowed, f"{key}={val!r}: expected one of {', '.join(allowed)}{more}")
    _check_backbone(cfg.model)
    _check_eval_data(cfg)
    methods.check(cfg.method, cfg.model)
    _check(
        not (methods.get(cfg.method.name).needs_labels and cfg.data.labels == "none"),
        f"method.name={cfg.method.name} learns from labels: it cannot train with data.labels=none",
    )
    t, d, mo = cfg.train, cfg.data, cfg.model
    _check(t.epochs >= 1, f"train.epochs={t.epochs}: expected >= 1")
    _check(t.epochs <= MAX_EPOCHS, f"train.epochs={t.epochs}: expected <= {MAX_EPOCHS}")
    _check(t.batch_size >= 2, f"train.batch_size={t.batch_size}: expected >= 2 (InfoNCE needs negatives)")
    _check(t.base_lr > 0, f"train.base_lr={t.base_lr}: expected > 0")
    _check(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay}: expected >= 0")
    _check(t.warmup_epochs >= 0, f"train.warmup_epochs={t.warmup_epochs}: expected >= 0")
    _check(0.0 <= t.momentum < 1.0, f"train.momentum={t.momentum}: expected 0 <= momentum < 1")
    _check(t.lars_eta > 0, f"train.lars_eta={t.lars_eta}: expected > 0")
    _check(t.probe_lr > 0, f"train.probe_lr={t.probe_lr}: expected > 0")
    _check(t.min_lr >= 0, f"train.min_lr={t.min_lr}: expected >= 0")
    _check(t.warmup_start_lr >= 0, f"train.warmup_start_lr={t.warmup_start_lr}: expected >= 0")
    _check(0.0 <= d.blur_prob <= 1.0, f"data.blur_prob={d.blur_prob}: expected 0 <= p <= 1")
    _check(cfg.eval.batch_size >= 1, f"eval.batch_size={cfg.eval.batch_size}: expected >= 1")
    _check(t.checkpoint_every >= 0, f"train.checkpoint_every={t.checkpoint_every}: expected >= 0")
    _check(t.monitor_samples >= 0, f"train.monitor_samples={t.monitor_samples}: expected >= 0 (0: off)")
    _check(t.monitor_every >= 1, f"train.monitor_every={t.monitor_every}: expected >= 1 (epochs)")
    bad = [name for name in t.loggers if name not in LOGGERS]
    _check(not bad, f"train.loggers={t.loggers}: unknown {', '.join(map(str, bad))}; expected some of "
           f"{', '.join(LOGGERS)}")
    _check(
        d.image_size == 0 or d.image_size >= MIN_IMAGE_SIZE,
        f"data.image_size={d.image_size}: expected 0 (the dataset's native size) or >= {MIN_IMAGE_SIZE} px",
    )
    _check(d.train_subset >= 0, f"data.train_subset={d.train_subset}: expected >= 0")
    _check(d.test_subset >= 0, f"data.test_subset={d.test_subset}: expected >= 0")
    _check(0.0 < d.crop_min_scale <= 1.0, f"data.crop_min_scale={d.crop_min_scale}: expected (0, 1]")
    _check(d.num_workers >= 0, f"data.num_workers={d.num_workers}: expected >= 0")
    _check(0.0 <= d.bg_correlation <= 1.0, f"data.bg_correlation={d.bg_correlation}: expected 0 <= p <= 1")
    _check(
        d.bg_correlation == 0.0 or d.name == "fashion-mnist-bg",
        f"data.bg_correlation={d.bg_correlation}: only data.name=fashion-mnist-bg has backgrounds to "
        f"correlate, not {d.name}",
    )
    _check(
        not d.classes or d.name == "imagefolder",
        f"data.classes={d.classes}: a class list selects folders of data.name=imagefolder, not {d.name}",
    )
    for k in cfg.eval.retrieval_dims:
        _check(1 <= k <= mo.proj_dim, f"eval.retrieval_dims: K={k}: expected 1 <= K <= D={mo.proj_dim}")
    _check(
        -(2**63) <= cfg.seed < 2**64,
        f"seed={cfg.seed}: expected an integer from -2**63 to 2**64 - 1 (the range torch's seed takes)",
    )
    check_device(t.device, "train.device")


def check_device(device: str, what: str) -> None:
    """Raise ConfigError unless ``device`` is auto, cpu, cuda or cuda:N; ``what`` names the setting
    in the message (``train.device``, ``benchmark --device``)."""
    _check(
        re.fullmatch(r"auto|cpu|cuda(:\d+)?", device) is not None,
        f"{what}={device!r}: expected auto, cpu, cuda or cuda:N",
    )


def dump_yaml(cfg: Config) -> str:
    """The fully resolved config as YAML (written to ``RUN_DIR/config.yaml``)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# Keys that may change on --resume. All but train.epochs leave the trained weights as they would be;
# a larger train.epochs is the way to train longer (the lr schedule is recomputed for the new length).
RESUME_FREE_KEYS: tuple[str, ...] = (
    "train.epochs", "train.progress", "train.checkpoint_every", "data.num_workers", "data.root", "eval.",
    "train.loggers", "train.monitor_samples", "train.monitor_every",
)


def diff_configs(a: Config, b: Config, ignore: tuple[str, ...] = RESUME_FREE_KEYS) -> list[str]:
    """Dotted keys whose values differ between two configs (used to refuse a mismatched resume).

    ``ignore``: keys, or prefixes ending in ``.``, left out of the comparison."""
    fa, fb = flatten(a.to_dict()), flatten(b.to_dict())
    return [k for k in fa if not ignored(k, ignore) and fa[k] != fb.get(k)]


def ignored(key: str, ignore: tuple[str, ...]) -> bool:
    """Whether dotted ``key`` is one of ``ignore``: a key, or a prefix ending in ``.``."""
    return any(key == i or (i.endswith(".") and key.startswith(i)) for i in ignore)
