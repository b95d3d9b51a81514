"""Values and overrides: ``key=value`` parsing, type coercion, setting a dotted key, flattening,
the resolved config as YAML and the difference of two configs (a resume's check)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from bayesncl.config.schema import Config, dict_entry, unknown_key
from bayesncl.core import methods
from bayesncl.core.configs import ConfigError

#: The authors' spellings of our values, by key: ``key=value`` (command line, config files, a run's
#: saved config) takes them and stores ours. From their code and YAML files (PKU-ML/non_neg,
#: Cui-Peng-624/BayesNCL ``solo/methods/simclr.py``: ``supported_non_neg_list`` = None, relu, rep_relu,
#: gelu, sigmoid, softplus, exp, leakyrelu; ``gate_type`` in STE, gumbel_sigmoid; YAML
#: ``non_neg: None`` for plain SimCLR). Our other names are theirs already.
VALUE_ALIASES: dict[str, dict[str, str]] = {
    "method.nonneg": {"leakyrelu": "leaky_relu", "None": "identity", "none": "identity"},
    "method.gate": {"STE": "ste", "gumbel_sigmoid": "gumbel"},
}


def canonical(key: str, value: Any) -> Any:
    """``value`` of ``key`` in our spelling: an authors' name of :data:`VALUE_ALIASES` replaced (YAML's
    ``null`` reads as ``None``), anything else as given."""
    aliases = VALUE_ALIASES.get(key)
    if aliases is None or isinstance(value, bool) or not isinstance(value, (str, type(None))):
        return value
    return aliases.get(str(value), value)


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


def set_key(cfg: Config, key: str, value: Any) -> None:
    """Set dotted ``key`` on ``cfg`` with type coercion. Raises ConfigError if unknown or mistyped.

    ``KEY.NAME`` of a dict-valued key (``model.backbone_kwargs.img_size=32``) sets one entry, its
    value as YAML reads it (a number, a bool, a string, a list)."""
    entry = dict_entry(key)
    if entry is not None:
        head, name = entry
        sec, field_name = head.split(".")
        getattr(getattr(cfg, sec), field_name)[name] = value
        return
    parts = key.split(".")
    obj: Any = cfg
    for p in parts[:-1]:
        if not hasattr(obj, p) or not dataclasses.is_dataclass(getattr(obj, p)):
            raise unknown_key(key)
        obj = getattr(obj, p)
    hints = typing.get_type_hints(type(obj))
    if key == "method.name":  # the method's own keys start at its defaults
        cfg.method.name = _coerce(key, value, str)
        cfg.method.own = {k: spec.default for k, spec in methods.get(cfg.method.name).keys.items()}
    elif obj is cfg.method and parts[-1] in cfg.method.own:
        default = cfg.method.own[parts[-1]]
        cfg.method.own[parts[-1]] = _coerce(key, value, type(default))
    elif parts[-1] not in hints or dataclasses.is_dataclass(hints[parts[-1]]) or key == "method.own":
        raise unknown_key(key, cfg.method.name)
    else:
        setattr(obj, parts[-1], _coerce(key, canonical(key, value), hints[parts[-1]]))


def dump_yaml(cfg: Config) -> str:
    """The fully resolved config as YAML (written to ``RUN_DIR/config.yaml``)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# Keys that may change on --resume. All but train.epochs leave the trained weights as they would be
# (train.compile and train.compile_mode: the same computation, rounded otherwise; a run compiled on a GPU
# continues eagerly on a CPU); a larger train.epochs is the way to train longer (the lr schedule is
# recomputed for the new length).
RESUME_FREE_KEYS: tuple[str, ...] = (
    "train.epochs", "train.progress", "train.checkpoint_every", "data.num_workers", "data.root", "eval.",
    "train.loggers", "train.monitor_samples", "train.monitor_every", "train.compile", "train.compile_mode",
)


def diff_configs(a: Config, b: Config, ignore: tuple[str, ...] = RESUME_FREE_KEYS) -> list[str]:
    """Dotted keys whose values differ between two configs (used to refuse a mismatched resume).

    ``ignore``: keys, or prefixes ending in ``.``, left out of the comparison."""
    fa, fb = flatten(a.to_dict()), flatten(b.to_dict())
    return [k for k in fa if not ignored(k, ignore) and fa[k] != fb.get(k)]


def ignored(key: str, ignore: tuple[str, ...]) -> bool:
    """Whether dotted ``key`` is one of ``ignore``: a key, or a prefix ending in ``.``."""
    return any(key == i or (i.endswith(".") and key.startswith(i)) for i in ignore)
