"""The ``method.*`` section of a config, built from the keys that declare it: the method config's
own (:data:`COMMON_KEYS`: ``name``, ``nonneg``, ``temperature``) and each part's
(:data:`bayesncl.core.methods.common.PARTS`, ``Part.keys``), in that order (:data:`KEYS`), make the
fields of :class:`MethodConfig`; a method's own keys sit in its ``own`` dict. A new part's keys are
declared with the part, nowhere else: their defaults, help and checks come from there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bayesncl.core.methods.common import PARTS
from bayesncl.core.methods.spec import Key

__all__ = ["COMMON_KEYS", "KEYS", "MethodConfig"]

# method.temperature: a much smaller one overflows the logits, a much larger one flattens them.
TEMPERATURE_RANGE = (0.01, 10.0)

COMMON_KEYS: dict[str, Key] = {
    "name": Key("bayesncl", "a name of bayesncl.core.methods.METHODS"),
    "nonneg": Key("rep_relu", "φ, a name of bayesncl.core.parts.NONNEG"),
    "temperature": Key(
        0.2, "InfoNCE temperature", lambda v: TEMPERATURE_RANGE[0] <= v <= TEMPERATURE_RANGE[1],
        f"{TEMPERATURE_RANGE[0]} <= temperature <= {TEMPERATURE_RANGE[1]:g} (the paper uses 0.2)",
    ),
}
"""The keys of every method config that no part declares: the method, φ and InfoNCE's temperature."""


def _keys() -> dict[str, Key]:
    out = dict(COMMON_KEYS)
    for part_name, part in PARTS.items():
        for name, key in part.keys.items():
            if name in out or name == "own":
                raise ValueError(f"part {part_name!r}: method.{name} is declared twice")
            out[name] = key
    for part_name, part in PARTS.items():
        for name in (part.switch, *part.reads):
            if name and name not in out:
                raise ValueError(f"part {part_name!r}: it reads method.{name}, which nothing declares")
    return out


KEYS: dict[str, Key] = _keys()
"""Every common ``method.*`` key (all but a method's own), in the order ``config.yaml`` and
``bayesncl pretrain --help`` list them: :data:`COMMON_KEYS`, then each part's."""


def _getattr(self: Any, name: str) -> Any:  # only called for names that are not fields
    own = self.__dict__.get("own") or {}
    if name in own:
        return own[name]
    raise AttributeError(f"method has no key {name!r} (method.name={self.__dict__.get('name')})")


MethodConfig: Any = dataclasses.make_dataclass(
    "MethodConfig",
    [
        *((name, type(key.default), dataclasses.field(default=key.default)) for name, key in KEYS.items()),
        # the method's own keys (bayesncl.core.methods.Method.keys): method.NAME, read as cfg.method.NAME;
        # in the config's dict and YAML they sit beside the keys above
        ("own", dict[str, Any], dataclasses.field(default_factory=dict, metadata={"own": True})),
    ],
    namespace={"__getattr__": _getattr},
)
MethodConfig.__module__ = __name__
MethodConfig.__doc__ = """The method as a configuration of parts; ``name`` selects a preset of the fields.

A dataclass with one field per key of :data:`KEYS` (its default and type from the declaring
:class:`~bayesncl.core.methods.spec.Key`: ``rho: float = 0.8``, ...), then ``own``: the method's own
keys by name. ``cfg.method.NAME`` reads either; ``dataclasses.replace(m, rho=0.5)`` sets a field."""
