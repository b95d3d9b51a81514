"""bayesncl: interpretable self-supervised learning with NCL and Bayesian gated NCL (BayesNCL).

The main API (each loads torch only when first used, so ``import bayesncl`` stays cheap)::

    cfg = bayesncl.build_config(["method.name=bayesncl", "train.epochs=3"])
    metrics = bayesncl.pretrain(cfg, "runs/x")       # train, checkpoint, evaluate (app.train)
    report = bayesncl.evaluate("runs/x")             # the CLI's ``evaluate`` (app.evaluate)
    model = bayesncl.load_encoder("runs/x")          # the trained model, eval mode
    bayesncl.metrics.semantic_consistency(...)       # the metrics package
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from bayesncl.config import Config
    from bayesncl.core.model import ContrastiveModel

__version__ = "0.1.0"
__all__ = ["build_config", "evaluate", "load_encoder", "metrics", "pretrain"]

_LAZY = {  # name -> (module, attribute; None for the module itself)
    "pretrain": ("bayesncl.app.train", "pretrain"),
    "evaluate": ("bayesncl.app.evaluate", "evaluate_command"),
    "metrics": ("bayesncl.metrics", None),
}


def build_config(overrides: list[str] | None = None, config: str | Path | None = None) -> Config:
    """A validated :class:`~bayesncl.config.Config`: the defaults, the method's preset, the YAML
    ``config`` (a path or a shipped recipe name, e.g. ``"cifar100-bayesncl"``), then the
    ``key=value`` ``overrides``. Raises ConfigError (one line) for an unknown key or a bad value."""
    from bayesncl.app.cli import resolve_config_path
    from bayesncl.config import build_config as resolve

    return resolve(resolve_config_path(None if config is None else str(config)), overrides)


def load_encoder(
    run_dir_or_file: str | Path, device: torch.device | None = None, overrides: list[str] | None = None
) -> ContrastiveModel:
    """The trained model (backbone, projector, gate; eval mode) of a run dir, a checkpoint, an
    ``encoder.safetensors`` or an official BayesNCL/NCL checkpoint, read safely
    (:func:`bayesncl.app.evaluate.load_trained`; ``device`` default CUDA where there is one).
    Raises EvalError (one line) for anything it cannot read."""
    from bayesncl.app.evaluate import load_trained

    return load_trained(run_dir_or_file, device, overrides)[0]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'bayesncl' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value
