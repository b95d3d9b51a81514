"""The fast linear probe fitted once on clean train features, then scored on any number of test
sets (NCL's out-of-distribution protocol; docs/metrics.md, "Out-of-distribution transfer"), kept as
a :class:`FittedProbe` so that each shifted set costs one matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .inputs import EvalError, class_indices, validate_features, validate_train_test
from .probe import DEFAULT_L2_GRID, _fit, _select_l2, _standardise, _topk_correct

__all__ = ["FittedProbe", "fit_probe"]


@dataclass
class FittedProbe:
    """A probe fitted on train features: ``mean``/``std`` (D,), ``w`` (C, D), ``b`` (C,), ``classes``
    (C,) the sorted train labels, ``l2`` the chosen strength."""

    mean: torch.Tensor
    std: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    classes: torch.Tensor
    l2: float

    def accuracy(self, features: Any, labels: Any) -> dict[str, float]:
        """``{"acc1", "acc5"}`` in percent on (N, D) ``features`` with (N,) ``labels`` (a label the
        train split lacks counts as an error; Acc@5 is Acc@C below 5 classes). Raises EvalError."""
        x, y = validate_features(features, labels)
        if x.shape[1] != self.w.shape[1]:
            fitted = self.w.shape[1]
            raise EvalError(f"shifted features have D={x.shape[1]}; the probe was fitted on D={fitted}")
        assert y is not None
        _, y_idx, c = class_indices(self.classes, y)
        logits = torch.addmm(self.b, (x.to(torch.float32) - self.mean) / self.std, self.w.T)
        acc1, acc5 = _topk_correct(logits, y_idx, [1, min(5, c)])
        return {"acc1": acc1, "acc5": acc5}


def fit_probe(features: Any, labels: Any, *, seed: int = 0, max_iter: int = 100) -> FittedProbe:
    """Fit the fast probe (module doc) on (N, D) train ``features`` with (N,) ``labels``.
    Raises EvalError for bad input or fewer than 2 classes."""
    x, y, _, _ = validate_train_test(features, labels, features[:1], labels[:1], "fit_probe")
    classes, y_idx = torch.unique(y, return_inverse=True)
    if classes.numel() < 2:
        raise EvalError(f"the probe needs at least 2 classes in the train labels; got {classes.numel()}")
    x = x.to(torch.float32)
    grid = sorted(DEFAULT_L2_GRID, reverse=True)
    l2, _ = _select_l2(x, y_idx, classes.numel(), grid, 0.1, seed, max_iter)
    mean, std = _standardise(x)
    w, b = _fit((x - mean) / std, y_idx, classes.numel(), l2, None, max_iter)
    return FittedProbe(mean, std, w, b, classes, l2)
