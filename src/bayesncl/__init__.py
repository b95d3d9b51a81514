"""bayesncl: interpretable self-supervised learning with NCL and Bayesian gated NCL (BayesNCL).

The Python API (docs/api.md)::

    import bayesncl
    cfg = bayesncl.build_config(["method.name=bayesncl", "data.name=fashion-mnist"])
    metrics = bayesncl.pretrain(cfg, dataset=None, run_dir="runs/x")   # or dataset=a torch Dataset
    result = bayesncl.evaluate("runs/x")
    model = bayesncl.load_encoder("runs/x")                            # an nn.Module
    bayesncl.metrics.compute_all(features, labels)
    head = bayesncl.ContrastiveHead(h_dim, cfg)                         # the method in your own loop

Names are imported on first use, so ``import bayesncl`` (and ``bayesncl --help``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "build_config": "bayesncl.app.api",
    "pretrain": "bayesncl.app.api",
    "evaluate": "bayesncl.app.api",
    "load_encoder": "bayesncl.app.api",
    "ContrastiveHead": "bayesncl.core.head",
    "Config": "bayesncl.config",
    "ConfigError": "bayesncl.config",
    "DataError": "bayesncl.data",
}
__all__ = [*_EXPORTS, "metrics", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "metrics":
        return importlib.import_module("bayesncl.metrics")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bayesncl' has no attribute {name!r}")
