"""The pure parts of the gradient-dynamics protocol (BayesNCL paper Table 3; the protocol is in
:mod:`bayesncl.app.dynamics` and docs/metrics.md): per-dimension gradient variance GV_k of the
training loss, and the Spearman correlations of AF, GV and SC over the feature dimensions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bayesncl.config import Config
from bayesncl.core.model import ContrastiveModel, contrastive_loss


def gradient_variance(
    model: ContrastiveModel, loader: Any, cfg: Config, samples: int
) -> tuple[np.ndarray, int]:
    """GV_k, the variance over samples of the per-sample ∂L/∂z_k (L: :func:`contrastive_loss` on the
    two views; its batch mean is undone by a factor 2B), as a (D,) float64 array, and the number of
    train images it used: whole batches of ``loader`` (yielding ``(x1, x2, y)``) until ``samples``
    is reached or the loader ends; ``y`` reaches the loss as the labels of a supervised method (CE,
    SupCon). The model runs in eval mode; its gradients are cleared after."""
    was_training = model.training
    model.eval()
    grads = []
    seen = 0
    for x1, x2, y in loader:
        out = model(torch.cat([x1, x2]))
        out.z.retain_grad()
        loss, _ = contrastive_loss(out, cfg.method, labels=y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        assert out.z.grad is not None
        grads.append((out.z.grad * out.z.shape[0]).double().cpu())
        seen += x1.shape[0]
        if seen >= samples:
            break
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    g = torch.cat(grads)
    return g.var(dim=0, unbiased=False).numpy(), seen


def dynamics_correlations(af: np.ndarray, gv: np.ndarray, sc: np.ndarray) -> dict[str, float]:
    """Spearman correlations over dims where AF > 0 and SC is defined. Inputs (D,); returns
    ``{"AF-GV", "GV-SC", "AF-SC", "dims"}`` (NaN correlation when fewer than 3 dims qualify)."""
    from scipy.stats import spearmanr

    keep = (af > 0) & np.isfinite(sc) & np.isfinite(gv)
    out: dict[str, float] = {"dims": int(keep.sum())}
    for name, a, b in (("AF-GV", af, gv), ("GV-SC", gv, sc), ("AF-SC", af, sc)):
        if keep.sum() < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
            out[name] = float("nan")  # undefined for fewer than 3 dims or a constant input
        else:
            out[name] = float(spearmanr(a[keep], b[keep]).statistic)
    return out
