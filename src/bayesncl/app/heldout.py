"""Interpretability while it trains: a fixed labelled held-out batch of ``train.monitor_samples``
test images, evenly spaced over the test split and read once with the eval transforms, scored at
every epoch's end in eval mode into the ``heldout_*`` columns of ``log.csv`` (README, "Logs while it
trains"), from the ``bayesncl.metrics`` functions on z̃. No gradient, BatchNorm update or gate noise,
and torch's random state is put back, so training is unchanged.
"""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch


class HeldOut:
    """The held-out batch: ``x`` float (n, C, S, S) on the CPU, ``y`` int64 (n,) labels, scored in
    the evaluation's precision of a run at ``train.precision=precision``
    (:func:`bayesncl.core.optim.extraction_precision`: bf16 where ``auto`` is bf16 on the CPU), so
    that the last epoch's columns are the final evaluation's."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, precision: str = "fp32") -> None:
        self.x, self.y, self.batch_size, self.precision = x, y, batch_size, precision

    @torch.no_grad()
    def measure(self, model: Any, device: torch.device) -> dict[str, float | str]:
        """The ``heldout_*`` columns of ``model`` (a ContrastiveModel) on the batch, rounded as
        log.csv stores them (``heldout_gate_*`` only for a model with a gate; a non-finite value an
        empty cell). The model's train/eval mode is restored."""
        from bayesncl.core.optim import extraction_precision
        from bayesncl.metrics import active_dims, effective_rank, semantic_consistency, semantic_entropy_sum

        plan = extraction_precision(self.precision, device)
        autocast = torch.autocast(device.type, dtype=plan.dtype) if plan is not None else nullcontext()
        modes = [(m, m.training) for m in model.modules()]
        model.eval()
        feats, masks, alphas = [], [], []
        try:
            # torch's CPU (and CUDA) random state is put back after: whatever draws inside (a layer)
            # leaves the training's random stream as it was
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), autocast:
                for i in range(0, len(self.x), self.batch_size):
                    x = self.x[i : i + self.batch_size].to(device, non_blocking=True)
                    out = model(x.contiguous(memory_format=torch.channels_last) if plan is not None else x)
                    feats.append(out.z_tilde.float().cpu())
                    if out.mask is not None and out.alpha is not None:  # eval mode: the hard mask
                        masks.append(out.mask.float().cpu())
                        alphas.append(out.alpha.float().cpu())
        finally:
            for m, training in modes:
                m.training = training
        f, y = torch.cat(feats).numpy(), self.y.numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no active dim: the metrics' own 0.0 and note
            row: dict[str, float | str] = {
                "heldout_sc": round(semantic_consistency(f, y), 4),
                "heldout_h_sum": round(semantic_entropy_sum(f, y), 6), "heldout_active_dims": active_dims(f),
                "heldout_effective_rank": round(effective_rank(f), 4),
            }
        # the gate (a run without one has no such column): the share of α > method.threshold (eval
        # mode's mask is that hard mask for every gate, the soft one included) and the mean gate probability α
        if masks:
            row["heldout_gate_open"] = round(float(torch.cat(masks).mean()), 6)
            row["heldout_gate_mean_alpha"] = round(float(torch.cat(alphas).mean()), 6)
        for k, v in row.items():
            if isinstance(v, float) and not math.isfinite(v):
                row[k] = ""
        return row


def heldout_indices(n_test: int, n: int) -> np.ndarray:
    """``min(n, n_test)`` test-split positions evenly spaced from the first to the last (sorted)."""
    if n >= n_test:
        return np.arange(n_test)
    return np.unique(np.round(np.linspace(0, n_test - 1, n)).astype(np.int64))


def build_heldout(cfg: Any, info: Any) -> HeldOut | None:
    """The held-out batch of ``cfg`` (``train.monitor_samples`` images; None when 0): the test
    split of ``cfg.data`` (``info``: its DatasetInfo) read once through the evaluation loader,
    keeping :func:`heldout_indices`. Raises DataError."""
    from bayesncl.data import build_eval_loader

    n = cfg.train.monitor_samples
    if n <= 0:
        return None
    keep = heldout_indices(info.num_test, n)
    if len(keep) == 0:  # no test split to hold out (a dataset handed over from Python, say)
        return None
    wanted = torch.zeros(int(keep[-1]) + 1, dtype=torch.bool)
    wanted[torch.from_numpy(keep)] = True
    xs, ys = [], []
    with torch.random.fork_rng(devices=[]):  # a folder DataLoader draws its base seed: put it back
        for x, y, idx in build_eval_loader(cfg.data, "test", cfg.eval.batch_size, device="cpu", info=info):
            sel = wanted[idx.clamp(max=len(wanted) - 1)] & (idx < len(wanted))
            xs.append(x[sel])
            ys.append(y[sel])
            if int(idx.max()) >= keep[-1]:
                break
    return HeldOut(torch.cat(xs), torch.cat(ys).long(), cfg.eval.batch_size, cfg.train.precision)
