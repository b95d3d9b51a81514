"""The method registry: :data:`METHODS` by name (:func:`register_method` adds one: the built-in
ones in their files, a user's from Python or ``--plugin FILE``), and what config, model, loss and
logs read of it.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING, Any

from bayesncl.core.configs import ConfigError, ModelConfig
from bayesncl.core.methods.common import LOSS, PARTS
from bayesncl.core.methods.keys import KEYS, MethodConfig
from bayesncl.core.methods.spec import GATE_OUTPUTS, OUTPUTS, Batch, Key, LossTerm, Method, Statistic, Step

if TYPE_CHECKING:
    from torch import Tensor

    from bayesncl.core.methods.spec import ModelOutput

__all__ = [
    "METHODS", "register_method", "check_weights", "check_inputs", "get", "preset", "closest", "unread_keys",
    "check", "terms", "loss", "statistics", "all_statistics",
]

METHODS: dict[str, Method] = {}
"""The methods by name, in the order tables list them (built-ins first)."""


def register_method(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS` (``method.name=NAME`` selects it) and return it.

    Raises ConfigError (one line) if its name is taken (a built-in, or another file's method), a
    key of its own is a common ``method.*`` key, its statistics do not start with ``loss``, a loss
    term's ``weight`` is neither one of its own keys nor a common ``method.*`` key
    (:func:`check_weights`), or a term reads an output the model cannot give it
    (:func:`check_inputs`). A method from a user's file is checked on a test batch by
    :func:`bayesncl.core.plugins.check_method` (``bayesncl.register_method`` and ``--plugin`` do that)."""
    old = METHODS.get(method.name)
    if old is not None and not (old.source is not None and old.source == method.source):
        where = "a built-in method" if old.source is None else f"the method of that name in {old.source}"
        raise ConfigError(f"method {method.name!r} clashes with {where}; give it another name")
    if not method.name or any(c.isspace() or c in "=/" for c in method.name):
        raise ConfigError(f"method name {method.name!r}: expected a word without spaces, '=' or '/'")
    common = sorted(set(method.keys) & {*KEYS, "own"})
    if common:
        raise ConfigError(f"method {method.name!r}: its key method.{common[0]} is a common method key")
    if not method.terms or not method.stats or method.stats[0] != LOSS:
        raise ConfigError(f"method {method.name!r}: expected >= 1 loss term, statistics starting with LOSS")
    check_weights(method)
    check_inputs(method)
    METHODS[method.name] = method
    return method


def check_weights(method: Method) -> None:
    """ConfigError (one line) if a loss term's ``weight`` names no key of ``method`` (its own keys or a
    common ``method.*`` key): such a term used to register and fail at the first training step."""
    for term in method.terms:
        if term.weight is not None and term.weight not in {*KEYS, *method.keys}:
            own = ", ".join(method.keys) or "none"
            raise ConfigError(
                f"method {method.name!r}: its loss term {term.name!r} is weighted by method.{term.weight}, "
                f"which is not a key of the method (its own keys: {own}; or a common method.* key)"
            )


def check_inputs(method: Method) -> None:
    """ConfigError (one line) if a loss term declares an input (``LossTerm.inputs``) that is no
    :class:`~bayesncl.core.methods.spec.ModelOutput` field, names a head (``heads.NAME``) the
    method does not declare, or is a gate's output (:data:`~bayesncl.core.methods.spec.GATE_OUTPUTS`)
    while the method cannot have a gate (``gateable=False``: the gate's outputs are always None); or
    if ``inputs`` is not a tuple (list) of such names (a bare string, ``inputs="z"``)."""
    for term in method.terms:
        if not isinstance(term.inputs, tuple | list) or not all(isinstance(n, str) for n in term.inputs):
            own = f"method {method.name!r}: its loss term {term.name!r}"
            raise ConfigError(f"{own} has inputs={term.inputs!r}; expected a tuple of output names, e.g. "
                              "inputs=('z_tilde',)")
        for name in term.inputs:
            where = f"method {method.name!r}: its loss term {term.name!r} reads out.{name}"
            field, dot, head = name.partition(".")
            if field not in OUTPUTS or (dot and (field != "heads" or not head)):
                raise ConfigError(f"{where}, which is no model output (expected one of {', '.join(OUTPUTS)}, "
                                  "or heads.NAME)")
            if head and head not in method.heads:
                raise ConfigError(f"{where}, a head the method does not declare (its heads: "
                                  f"{', '.join(method.heads) or 'none'})")
            if field in GATE_OUTPUTS and not method.gateable:
                raise ConfigError(f"{where}, a gate's output, but the method cannot have a gate "
                                  "(gateable=False)")


def get(name: str) -> Method:
    """The method ``name``; ConfigError naming the registered ones (and the close ones) if none."""
    if name in METHODS:
        return METHODS[name]
    close = difflib.get_close_matches(name, METHODS, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(
        f"method.name={name!r}: expected one of {', '.join(METHODS)}{hint}; a method from a user's file "
        "needs --plugin FILE.py (bayesncl.register_method in Python)"
    )


def preset(name: str) -> dict[str, Any]:
    """The ``method.*`` values (without the prefix) that ``method.name=name`` sets: the method's parts,
    its own keys' defaults, and 0 for the weight of each term of a part it lacks (``lam`` for a
    method without a gate)."""
    method = get(name)
    out: dict[str, Any] = dict(method.parts)
    parts = MethodConfig(**method.parts)
    for part in PARTS.values():
        if not part.present(parts):
            out.update({t.weight: 0.0 for t in part.terms if t.weight})
    return out | {k: key.default for k, key in method.keys.items()}


def closest(m: MethodConfig) -> str:
    """The method a configuration of parts is: the registered method that agrees on, in this order,
    the loss terms of ``m.name``'s method (so a gate switched on a method keeps it that method),
    having a gate, TopK, the inverse-prevalence similarity, and a non-negativity map (φ ≠ identity);
    ties go to ``m.name`` (the configured method), then to the method with the same gate kind, then
    to the first registered.

    So the ablations of a method (a soft gate, another φ, another head depth, no detach) stay that
    method, while switching its defining part off (or another method's on) makes it another, e.g.
    ncl with ``method.gate=ste`` is bayesncl.
    """
    own = METHODS.get(m.name)

    def distance(item: tuple[str, Method]) -> tuple[bool, ...]:
        key, s = item
        return (
            own is not None and s.terms != own.terms,
            s.gated != (m.gate != "none"), s.topk != m.topk, s.ipw != m.ipw,
            (s.nonneg == "identity") != (m.nonneg == "identity"), key != m.name, s.gate != m.gate,
        )

    return min(METHODS.items(), key=distance)[0]


def terms(m: MethodConfig, method: Method | None = None) -> tuple[LossTerm, ...]:
    """The loss terms of a run of ``m``: its method's (``method``, default the registered
    ``m.name``), then those of the parts it has (λ·KL of the gate)."""
    extra = tuple(t for part in PARTS.values() if part.present(m) for t in part.terms)
    return (method or get(m.name)).terms + extra


def unread_keys(m: MethodConfig) -> set[str]:
    """The keys (without ``method.``) that parts or terms read but none of ``m``'s: e.g.
    ``{"gumbel_noise", "ipw_momentum", "ipw_eps"}`` for the STE gate. Every other key is read (a
    part's switch always: it decides whether the part is there)."""
    every = {k for p in PARTS.values() for k in p.settings()} | {
        k for p in PARTS.values() for t in p.terms for k in (*t.reads, t.weight) if k
    }
    read = {k for p in PARTS.values() if p.present(m) for k in p.settings()}
    read |= {k for t in terms(m) for k in (*t.reads, t.weight) if k}
    return every - read


def loss(
    out: ModelOutput, m: MethodConfig, batch: Batch, method: Method | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of a run of ``m`` on one batch: Σ weight · term over :func:`terms` (the first term
    unweighted when it has no weight key), and each term's detached value by name. ``method``: the
    run's :class:`Method`, resolved once (None: looked up by ``m.name``)."""
    total: Tensor | None = None
    values: dict[str, Tensor] = {}
    for term in terms(m, method):
        value = term.fn(out, batch, m)
        values[term.name] = value.detach()
        weighted = value if term.weight is None else getattr(m, term.weight) * value
        total = weighted if total is None else total + weighted
    assert total is not None
    return total, values


def statistics(m: MethodConfig, step: Step, labeled: bool = True) -> dict[str, Tensor]:
    """The method's statistics of one step by name (0-d tensors on the device): a run without a gate
    has none of the gate's (``Statistic.gated``); ``labeled``: False leaves out those that need
    labels (no online probe). ``step.method`` None: ``m`` is handed to the statistics as it."""
    if step.method is None:
        step = dataclasses.replace(step, method=m)
    return {s.name: s.fn(step) for s in get(m.name).logged(m, labeled)}


def all_statistics() -> dict[str, Statistic]:
    """Every registered method's statistics by name (the first definition of a name wins), in
    registration order: what the logs and the curves know how to show."""
    out: dict[str, Statistic] = {}
    for method in METHODS.values():
        for s in method.stats:
            out.setdefault(s.name, s)
    return out


def check(m: MethodConfig, mo: ModelConfig) -> None:
    """Raise ConfigError naming the first bad ``method.*`` value: the common keys (each checked as
    the method config or its part declares it, :data:`~bayesncl.core.methods.keys.KEYS`), the model's
    sizes, each present part's own check (PAPER-NOTES §1), the method's own keys, then its own
    ``check``."""
    for name, key in KEYS.items():
        _check_key(m, name, key)
    _check(0 <= mo.stem_padding <= 3, f"model.stem_padding={mo.stem_padding}: expected 0 to 3")
    _check(mo.proj_dim >= 1, f"model.proj_dim={mo.proj_dim}: expected >= 1")
    _check(mo.proj_hidden >= 1, f"model.proj_hidden={mo.proj_hidden}: expected >= 1")
    for part in PARTS.values():
        if part.check is not None and part.present(m):
            part.check(m, mo)
    method = get(m.name)
    _check(
        method.gateable or m.gate == "none",
        f"method.gate={m.gate} with method.name={m.name}: its loss reads no features a gate could gate; "
        "use method.gate=none",
    )
    for name, key in method.keys.items():
        _check_key(m, name, key)
    if method.check is not None:
        method.check(m, mo)


def _check_key(m: MethodConfig, name: str, key: Key) -> None:
    """``method.NAME=value: expected ...`` unless ``key.check`` passes ``m``'s value of it."""
    value = getattr(m, name)
    _check(key.check is None or bool(key.check(value)), f"method.{name}={value!r}: expected {key.expected}")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)
