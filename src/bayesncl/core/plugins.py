"""Methods from a user's file: :func:`load_plugin` (``--plugin FILE.py``) and :func:`check_method`.

A plugin is a Python file that calls :func:`bayesncl.register_method` when imported (e.g.
examples/ncl_l1.py; docs/extending.md). A run trained with one records the file in its run dir
(``plugins.txt``) so that reloading the run without it says what is missing. This module sits above
the model (it checks a method on a real :class:`~bayesncl.core.head.ModelHead`), so the methods
package below it never imports the model.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from bayesncl.core.configs import ConfigError, ModelConfig
from bayesncl.core.methods import MethodConfig, registry
from bayesncl.core.methods.spec import Batch, Method, Step

__all__ = ["load_plugin", "check_method", "register_checked", "PLUGINS_FILE"]

PLUGINS_FILE = "plugins.txt"
"""The run dir's record of the plugin files its method came from, one absolute path a line."""
_LOADED: dict[Path, list[str]] = {}  # a file loaded in this process: the methods it registered


def load_plugin(path: str | Path) -> list[str]:
    """Import the Python file ``path`` and return the names of the methods it registered (each
    checked by :func:`check_method`). Loading the same file again does nothing.

    Raises ConfigError (one line naming the file) if it does not exist or is not a regular file,
    raises (or calls sys.exit) on import, registers no method, or registers one that clashes with a
    registered name or whose loss term fails on a test batch or returns a non-scalar."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"--plugin {path}: no such file")
    if not p.is_file():
        raise ConfigError(f"--plugin {path}: not a regular file (expected a Python file)")
    p = p.resolve()
    if p in _LOADED:
        return _LOADED[p]
    before = dict(registry.METHODS)
    name = f"bayesncl_plugin_{abs(hash(str(p))):x}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--plugin {path}: cannot be imported as Python (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _SOURCE.append(str(p))
    try:
        spec.loader.exec_module(module)
    except ConfigError as e:
        _forget(before, name)
        raise ConfigError(f"--plugin {path}: {e}") from None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a user's file may raise anything, sys.exit too
        _forget(before, name)
        text = str(e).strip().splitlines()
        raise ConfigError(
            f"--plugin {path} raised {type(e).__name__} on import{': ' + text[0] if text else ''}"
        ) from None
    finally:
        _SOURCE.pop()
    added = [m for m in registry.METHODS if m not in before]
    if not added:
        _forget(before, name)
        raise ConfigError(f"--plugin {path} registers no method (expected bayesncl.register_method(...))")
    _LOADED[p] = added
    return added


_SOURCE: list[str] = []  # the plugin file being imported (register_checked records it as the source)


def _forget(before: dict[str, Method], module: str) -> None:
    """Undo a plugin that failed: its methods and its module."""
    registry.METHODS.clear()
    registry.METHODS.update(before)
    sys.modules.pop(module, None)


def register_checked(method: Method) -> Method:
    """:func:`~bayesncl.core.methods.registry.register_method` for a user's method, after
    :func:`check_method` ran it on a test batch; its source is the plugin file being loaded, else the
    file that calls this (``<python>`` for an interactive session). ``bayesncl.register_method``."""
    import dataclasses

    if method.source is None:
        caller = Path(sys._getframe(1).f_code.co_filename)
        source = _SOURCE[-1] if _SOURCE else str(caller.resolve()) if caller.is_file() else "<python>"
        method = dataclasses.replace(method, source=source)
    check_method(method)
    return registry.register_method(method)


def check_method(method: Method, n: int = 4, dim: int = 8, run: MethodConfig | None = None) -> None:
    """Run each loss term (its own and its parts': a preset gate's λ·KL), the weighted loss with one
    backward pass, and each statistic of ``method`` (with its parts, its own heads and its keys'
    defaults; ``run``: with a run's checked ``method.*`` settings instead, e.g. ``method.gate=none``)
    on the outputs of a :class:`~bayesncl.core.head.ModelHead` on random features, 2n rows ×
    ``dim`` dimensions; raise ConfigError (one line) if a term's weight is not a declared key, a
    term declares an input the model cannot give it (:func:`~bayesncl.core.methods.registry.check_inputs`),
    one of its heads (``Head.build`` or the module it builds) raises, or a term or statistic raises or
    returns anything but a 0-d tensor."""
    import dataclasses

    import torch

    from bayesncl.core.head import ModelHead

    model = ModelConfig(proj_dim=dim, proj_hidden=dim)
    if run is None:
        presets = {**method.parts, **{k: key.default for k, key in method.keys.items()}}
        cfg = MethodConfig(name=method.name, **{k: v for k, v in presets.items() if k not in method.keys},
                           own={k: key.default for k, key in method.keys.items()})
        if method.check is not None:
            try:
                method.check(cfg, model)
            except ConfigError as e:
                raise ConfigError(f"method {method.name!r}: its defaults fail its own check: {e}") from None
        registry.check_weights(method)  # before the weighted loss below reads them
        registry.check_inputs(method)
    else:  # a run's settings (checked by then): the gate's width is the test's, whatever the run's
        cfg = dataclasses.replace(run, gate_hidden=0)
    changed = [f"method.{k}={getattr(cfg, k)}" for k, v in method.parts.items() if getattr(cfg, k) != v]
    who = f"method {method.name!r}" + (f" with {', '.join(changed)}" if changed else "")
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2 * n, dim, generator=gen)
    try:  # a Head's build or forward is the user's code too
        out = ModelHead(dim, model, cfg, num_classes=2, spec=method).project(h)
    except Exception as e:  # noqa: BLE001 - a user's function may raise anything
        heads = ", ".join(method.heads) or "none"
        message = f"{who}: its model head (heads: {heads}) raises {_raised(e)}"
        raise ConfigError(message) from None
    batch = Batch(labels=torch.arange(n) % 2, index=torch.arange(n), gather=False)
    terms, total = {}, None
    for term in registry.terms(cfg, method):
        value = _run(who, f"loss term {term.name!r}", lambda t=term: t.fn(out, batch, cfg))
        terms[term.name] = value.detach()
        weighted = value if term.weight is None else getattr(cfg, term.weight) * value
        total = weighted if total is None else total + weighted
    if total is not None and total.requires_grad:  # the weighted loss, as a run sums it, and its backward
        _run(who, "weighted loss's backward pass", lambda: (total.backward(), total.detach())[1])
    step = Step(terms[method.terms[0].name], terms, out, torch.randn(2 * n, 2, generator=gen),
                torch.cat([batch.labels, batch.labels]), cfg)
    for stat in method.stats:
        if cfg.gate != "none" or not stat.gated:  # a gate's statistics are logged only with one
            _run(who, f"statistic {stat.name!r}", lambda s=stat: s.fn(step))


def _run(who: str, what: str, fn: object) -> object:
    """``fn()``, a 0-d tensor, or ConfigError ``{who}: its {what} raises ...`` (or returns ...)."""
    import torch

    try:
        value = fn()  # type: ignore[operator]
    except Exception as e:  # noqa: BLE001 - a user's function may raise anything
        raise ConfigError(f"{who}: its {what} raises {_raised(e)}") from None
    if not isinstance(value, torch.Tensor) or value.ndim != 0:
        tensor = isinstance(value, torch.Tensor)
        got = f"a tensor of shape {tuple(value.shape)}" if tensor else type(value).__name__
        raise ConfigError(f"{who}: its {what} returns {got}, expected a scalar (0-d tensor)")
    return value


def _raised(e: BaseException) -> str:
    """``TypeName on a test batch: the first line of its message`` (no message: no colon)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__} on a test batch{': ' + text[0] if text else ''}"
