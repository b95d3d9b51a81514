"""The methods: one file each (``cl``, ``ncl``, ``ncl_topk``, ``bayesncl``, ``bayesncl_gs``,
``ncl_ipw``, then the NCL paper's others, :data:`BUILT_IN`), registered in :data:`METHODS` in the
order tables list them.

A method is a :class:`Method` (:mod:`.spec`, with :class:`ModelOutput`, what the model hands its loss
terms); a run's ``method.*`` section is a :class:`MethodConfig` (:mod:`.keys`, built from the keys
the method config and each part of :data:`PARTS` declare); :mod:`.registry` is what config, model,
loss and logs read; :mod:`bayesncl.core.plugins` loads a user's file (``--plugin FILE.py``).
docs/extending.md.
"""

import importlib

from bayesncl.core.methods.common import (
    CONTRASTIVE_STATS,
    FINETUNE_STATS,
    INFO_NCE,
    KL,
    LOSS,
    PARTS,
    class_accuracy,
    term_statistic,
    top1_accuracy,
)
from bayesncl.core.methods.keys import KEYS, MethodConfig
from bayesncl.core.methods.registry import (
    METHODS,
    all_statistics,
    check,
    closest,
    get,
    loss,
    preset,
    register_method,
    statistics,
    terms,
    unread_keys,
)
from bayesncl.core.methods.spec import Batch, Head, Key, LossTerm, Method, ModelOutput, Part, Statistic, Step

__all__ = [
    "METHODS", "MethodConfig", "KEYS", "Method", "LossTerm", "Statistic", "Key", "Part", "Head", "Batch",
    "Step", "ModelOutput",
    "register_method", "get", "preset", "closest", "unread_keys", "check", "terms", "loss", "statistics",
    "all_statistics",
    "INFO_NCE", "KL", "LOSS", "PARTS", "CONTRASTIVE_STATS", "FINETUNE_STATS", "term_statistic",
    "class_accuracy", "top1_accuracy", "BUILT_IN",
]

BUILT_IN = (
    "cl", "ncl", "ncl_topk", "bayesncl", "bayesncl_gs", "ncl_ipw",
    "cl_l1", "ncl_l1", "scl", "ncl_scl", "scl_l1", "supcon", "ncl_supcon", "ce", "nce",
)
"""The files of the built-in methods, imported (so registered) in this order: the tables' order."""
for _file in BUILT_IN:
    importlib.import_module(f"{__name__}.{_file}")
