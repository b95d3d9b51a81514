"""bayesncl: interpretable self-supervised learning with NCL and Bayesian gated NCL (BayesNCL).

The main API (each loads torch only when first used, so ``import bayesncl`` stays cheap; docs/api.md)::

    cfg = bayesncl.build_config(["method.name=bayesncl", "train.epochs=3"])
    metrics = bayesncl.pretrain(cfg, run_dir="runs/x")   # train, checkpoint, evaluate (app.api)
    metrics = bayesncl.pretrain(cfg, dataset=ds)         # a torch Dataset or a uint8 N x C x H x W tensor
    report = bayesncl.evaluate("runs/x")                 # the CLI's ``evaluate``
    result = bayesncl.finetune("runs/x", overrides=["train.epochs=3"])  # backbone + head end to end
    model = bayesncl.load_encoder("runs/x")              # the trained model, eval mode
    bayesncl.metrics.compute_all(features, labels)       # the metrics package
    head = bayesncl.ContrastiveHead(h_dim, cfg)          # projector + gate + loss for your own loop
    bayesncl.register_method(bayesncl.methods.Method(...))  # a method of your own (docs/extending.md)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bayesncl.config import Config

__version__ = "0.1.0"
__all__ = [
    "CheckpointError", "ConfigError", "ContrastiveHead", "DataError", "EvalError", "RunDirError",
    "build_config", "evaluate", "finetune", "load_encoder", "load_plugin", "metrics", "methods", "pretrain",
    "register_method",
]

_LAZY = {  # name -> (module, attribute; None for the module itself)
    "pretrain": ("bayesncl.app.api", "pretrain"),
    "evaluate": ("bayesncl.app.api", "evaluate"),
    "finetune": ("bayesncl.app.finetune", "finetune"),
    "load_encoder": ("bayesncl.app.api", "load_encoder"),
    "ContrastiveHead": ("bayesncl.core.head", "ContrastiveHead"),
    "metrics": ("bayesncl.metrics", None),
    "methods": ("bayesncl.core.methods", None),  # Method, LossTerm, Statistic, Key, INFO_NCE, ...
    "register_method": ("bayesncl.core.plugins", "register_checked"),
    "load_plugin": ("bayesncl.core.plugins", "load_plugin"),
    # the one-line errors a call raises (all ValueError; docs/api.md, docs/bad-inputs.md)
    "ConfigError": ("bayesncl.core.configs", "ConfigError"),
    "DataError": ("bayesncl.data.sources", "DataError"),
    "EvalError": ("bayesncl.metrics.inputs", "EvalError"),
    "RunDirError": ("bayesncl.runs.messages", "RunDirError"),
    "CheckpointError": ("bayesncl.runs.safe_load", "CheckpointError"),
}


def build_config(
    overrides: list[str] | None = None, config: str | Path | None = None, *, plugins: Any = ()
) -> Config:
    """A validated :class:`~bayesncl.config.Config`: the defaults, the method's preset, the YAML
    ``config`` (a path or a shipped recipe name, e.g. ``"cifar100-bayesncl"``), then the
    ``key=value`` ``overrides`` (``model.backbone_kwargs.patch_size=4`` sets one entry of a dict
    key), after loading the ``plugins`` (files that register methods, as ``--plugin``); what
    ``bayesncl pretrain [--config CONFIG] [--plugin FILE] OVERRIDES`` trains. Raises ConfigError
    (one line) for an unknown key or a bad value."""
    from bayesncl.config import ConfigError
    from bayesncl.config import build_config as resolve

    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides={overrides!r}: expected a list of key=value strings, e.g. [{overrides!r}]"
        )
    return resolve(config, overrides, plugins=plugins)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'bayesncl' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API (``help(bayesncl)`` lists the lazy names with their signatures too)."""
    return sorted({*__all__, "__version__"})
