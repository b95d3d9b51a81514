"""Typed configuration: the dataclass defaults → the preset of ``method.name`` → the YAML file of
``--config`` → ``key=value`` overrides (later wins); or a run's saved config, overrides on top
(``--resume``, a reloaded run). :func:`build_config` builds either and checks it once; an unknown key
is an error naming the closest valid keys. The modules: docs/architecture.md."""

from __future__ import annotations

import re
import typing
import warnings
from pathlib import Path
from typing import Any

from bayesncl.config.checks import (
    check_device,
    eval_data,
    inert_method_keys,
    preset_of,
    validate,
    warn_inert_keys,
)
from bayesncl.config.files import RECIPES_DIR, load_run_yaml, load_yaml, path_arg, resolve_config_path
from bayesncl.config.parse import (
    diff_configs,
    dump_yaml,
    flatten,
    ignored,
    parse_overrides,
    refuse_fixed_keys,
    set_key,
)
from bayesncl.config.schema import (
    LOGGERS,
    METHOD_PRESETS,
    Config,
    DataConfig,
    EvalConfig,
    EvalDataConfig,
    check_keys,
    choices,
    list_keys,
    valid_keys,
)
from bayesncl.core import methods
from bayesncl.core.configs import ConfigError, ModelConfig, TrainConfig
from bayesncl.core.methods import MethodConfig
from bayesncl.core.plugins import PLUGINS_FILE, load_plugin

__all__ = [
    "LOGGERS", "METHOD_PRESETS", "RECIPES_DIR", "Config", "ConfigError", "DataConfig", "EvalConfig",
    "EvalDataConfig", "MethodConfig", "ModelConfig", "TrainConfig", "build_config", "check_device",
    "check_keys", "choices", "diff_configs", "dump_yaml", "eval_data", "flatten", "ignored",
    "inert_method_keys", "list_keys", "load_run_yaml", "load_yaml", "parse_overrides", "path_arg",
    "preset_of", "refuse_fixed_keys", "resolve_config_path", "set_key", "valid_keys", "validate",
    "warn_inert_keys",
]


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
