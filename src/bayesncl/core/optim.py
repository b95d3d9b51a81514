"""Precision choice, parameter groups, optimiser and learning-rate schedule (PAPER-NOTES §2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from bayesncl.core.distributed import scaled_lr
from bayesncl.core.model import ContrastiveModel

if TYPE_CHECKING:
    from bayesncl.core.configs import CoreConfig as Config


# ----------------------------------------------------------------------------- devices, precision
def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype, or None for fp32.

    ``auto``: bf16 on a CUDA device that supports it, else fp16 there (the paper's fp16 mixed
    precision, PAPER-NOTES §2); fp32 on CPU (bf16 autocast gave no speed-up on CPU here). bf16 has
    fp32's range, so it needs no GradScaler, whose inf check waits for the device every step. The
    loss, the KL and the logs are fp32 whatever the autocast dtype (``bayesncl.core.losses``).
    """
    if name == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


# ----------------------------------------------------------------------------- optimisation
@dataclass(frozen=True)
class LrSchedule:
    """Per-iteration warmup-cosine schedule, as pl_bolts' ``LinearWarmupCosineAnnealingLR`` that
    the authors step every iteration (solo/methods/base.py:355-375; PAPER-NOTES §2).

    For a parameter group whose peak is ``peak``, at step t (0-based), W = ``warmup_steps``,
    T = ``total_steps``: ``start + t·(peak − start)/max(1, W − 1)`` for t < W (every group starts
    at the same absolute ``start`` and reaches its peak at t = W − 1), then
    ``final + ½(peak − final)(1 + cos(π(t − W)/(T − W)))``. Rates are in the optimiser's units.
    """

    total_steps: int
    warmup_steps: int
    start: float = 3e-5
    final: float = 0.0

    def at(self, step: int, peak: float) -> float:
        """The rate at ``step`` of a group whose peak rate is ``peak``."""
        w = min(self.warmup_steps, self.total_steps)
        if step < w:
            return self.start + step * (peak - self.start) / max(1, w - 1)
        n = self.total_steps - w
        return self.final + 0.5 * (peak - self.final) * (1 + math.cos(math.pi * (step - w) / max(n, 1)))

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every group's ``lr`` at ``step`` from its ``peak_lr`` (:func:`param_groups`); returns
        the first group's rate (the encoder's, the one logged)."""
        for g in optimizer.param_groups:
            g["lr"] = self.at(step, g["peak_lr"])
        return optimizer.param_groups[0]["lr"]


def warmup_cosine(
    base: float, total_steps: int, warmup_steps: int, start: float = 3e-5, final: float = 0.0
) -> np.ndarray:
    """:class:`LrSchedule` for one group of peak ``base``: a (total_steps,) float64 array."""
    schedule = LrSchedule(total_steps, warmup_steps, start, final)
    return np.array([schedule.at(t, base) for t in range(total_steps)], dtype=np.float64)



def peak_lrs(cfg: Config, global_batch: int) -> dict[str, float]:
    """Peak learning rate of each part for a global batch of ``global_batch`` images.

    encoder (backbone + projector): ``train.base_lr × global_batch/256``; online classifier:
    ``train.probe_lr × global_batch/256`` (both scaled as solo/args/pretrain.py:146-152 does);
    gating head: ``method.gate_lr`` as given, not scaled (the authors' ``optimizer.gating_head_lr``,
    solo/methods/simclr.py:63,118-122), or, with ``gate_lr=0``, ``method.gate_lr_ratio`` × the
    encoder's peak (the paper's Table 15 wording).
    """
    encoder = scaled_lr(cfg.train.base_lr, global_batch)
    m = cfg.method
    gate = m.gate_lr if m.gate_lr > 0 else m.gate_lr_ratio * encoder
    probe = scaled_lr(cfg.train.probe_lr, global_batch)
    return {"encoder": encoder, "gating_head": gate, "classifier": probe}


def param_groups(model: ContrastiveModel, cfg: Config, global_batch: int) -> list[dict[str, Any]]:
    """Named parameter groups, each with its ``peak_lr`` (:func:`peak_lrs`) as its initial ``lr``.

    Bias and norm parameters (1-D, or named ``.bias``) get no weight decay and no LARS adaptation
    (solo-learn #301). The online classifier has no weight decay, but LARS adapts its weight as
    the authors' LARS does (solo/utils/lars.py:140-150 adapts every tensor that is not 1-D).
    """
    wd = cfg.train.weight_decay
    peaks = peak_lrs(cfg, global_batch)
    buckets: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        part = name.split(".")[0]
        part = part if part in ("gating_head", "classifier") else "encoder"
        kind = "plain" if p.ndim <= 1 or name.endswith(".bias") else "weight"  # bias or norm
        buckets.setdefault(f"{part}/{kind}", []).append(p)
    groups = []
    for key, params in buckets.items():
        part, kind = key.split("/")
        decay = kind == "weight" and part != "classifier"
        groups.append({
            "name": key, "params": params, "peak_lr": peaks[part], "lr": peaks[part],
            "weight_decay": wd if decay else 0.0, "always_adapt": kind == "weight" and part == "classifier",
        })
    return groups


def build_optimizer(groups: list[dict[str, Any]], cfg: Config) -> torch.optim.Optimizer:
    """LARS from timm (trust_coeff = eta, trust_clip = clip_lr), or SGD / AdamW.

    timm's LARS adapts the groups with weight decay > 0 or ``always_adapt``, which is how bias and
    norm are excluded.
    """
    t = cfg.train
    if t.optimizer == "lars":
        from timm.optim import Lars

        return Lars(groups, lr=t.base_lr, momentum=t.momentum, trust_coeff=t.lars_eta, trust_clip=t.clip_lr)
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.base_lr, momentum=t.momentum)
    return torch.optim.AdamW(groups, lr=t.base_lr)
