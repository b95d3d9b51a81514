"""TODO docstring."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from bayesncl.config import Config
from bayesncl.core.model import ContrastiveModel, contrastive_loss


def per_dim_gradient_variance(model: ContrastiveModel, loader: Any, cfg: Config, samples: int) -> np.ndarray:
    """GV_k: variance over samples of ∂L/∂z_k. loader yields ``(x1, x2, y)``. returns (D,) float64."""
    return _gradient_variance(model, loader, cfg, samples)[0]


def _gradient_variance(
    model: ContrastiveModel, loader: Any, cfg: Config, samples: int
) -> tuple[np.ndarray, int]:
    """:func:`per_dim_gradient_variance` and the number of train images it used: whole batches
    until ``samples`` is reached or the loader ends."""
    was_training = model.training
    model.eval()
    grads = []
    seen = 0
    for x1, x2, _ in loader:
        out = model(torch.cat([x1, x2]))
        out.z.retain_grad()
        loss, _ = contrastive_loss(out, cfg.method)
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
