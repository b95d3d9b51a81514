"""Typed configuration: dataclass defaults, method presets, YAML files and dotted overrides.

Resolution order (later wins):

1. the dataclass defaults (:mod:`~bayesncl.config.schema`);
2. the preset named by ``method.name`` (:data:`METHOD_PRESETS`);
3. the YAML file given with ``--config``;
4. ``key=value`` overrides from the command line;

or a run's saved config, overrides on top (``--resume``, a reloaded run): :func:`build_config` builds both.

An unknown key is an error naming the key and the closest valid keys; values are coerced to the
field's type and range-checked by :func:`validate` before any training starts.

Modules, one job each: :mod:`~bayesncl.config.schema` (the types, presets, allowed values and keys),
:mod:`~bayesncl.config.parse` (values, overrides, YAML out, diffs), :mod:`~bayesncl.config.files`
(YAML files, recipes), :mod:`~bayesncl.config.checks` (:func:`validate`) and
:mod:`~bayesncl.config.build` (:func:`build_config`); this package re-exports their public names.
"""

from bayesncl.config.build import build_config
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
from bayesncl.core.configs import ConfigError, MethodConfig, ModelConfig, TrainConfig

__all__ = [
    "LOGGERS", "METHOD_PRESETS", "RECIPES_DIR", "Config", "ConfigError", "DataConfig", "EvalConfig",
    "EvalDataConfig", "MethodConfig", "ModelConfig", "TrainConfig", "build_config", "check_device",
    "check_keys", "choices", "diff_configs", "dump_yaml", "eval_data", "flatten", "ignored",
    "inert_method_keys", "list_keys", "load_run_yaml", "load_yaml", "parse_overrides", "path_arg",
    "preset_of", "refuse_fixed_keys", "resolve_config_path", "set_key", "valid_keys", "validate",
    "warn_inert_keys",
]
