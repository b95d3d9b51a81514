"""Config files: a YAML file (or a shipped recipe, ``--config NAME``) read into flat dotted keys,
a run's saved ``config.yaml``, and path arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from bayesncl.config.parse import flatten
from bayesncl.config.schema import list_keys
from bayesncl.core.configs import ConfigError

RECIPES_DIR = Path(__file__).parents[1] / "configs"  # the shipped recipes (--config NAME)

# An example entry of each section, for the error a non-mapping section gets.
_SECTION_EXAMPLES = {
    "data": "data: {name: cifar10}", "model": "model: {backbone: resnet18}", "method": "method: {rho: 0.5}",
    "train": "train: {epochs: 10}", "eval": "eval: {batch_size: 512}",
}


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
