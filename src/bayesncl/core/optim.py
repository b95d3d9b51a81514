"""TODO docstring."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from bayesncl.core.model import ContrastiveModel

if TYPE_CHECKING:  # config imports core's registries; core reads a checked config
    from bayesncl.config import Config


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
def warmup_cosine(
    base: float, total_steps: int, warmup_steps: int, start: float = 3e-5, final: float = 0.0
) -> np.ndarray:
    """Per-iteration learning rates: linear warmup ``start → base``, then cosine ``base → final``.

    returns: (total_steps,) float64 array (PAPER-NOTES §2, stepped per iteration).
    """
    warmup_steps = min(warmup_steps, total_steps)
    warm = np.linspace(start, base, warmup_steps, endpoint=False) if warmup_steps else np.zeros(0)
    n = total_steps - warmup_steps
    t = np.arange(n) / max(n, 1)
    cos = final + 0.5 * (base - final) * (1 + np.cos(np.pi * t))
    return np.concatenate([warm, cos])


def _is_bias_or_norm(name: str, p: nn.Parameter) -> bool:
    return p.ndim <= 1 or name.endswith(".bias")


def param_groups(model: ContrastiveModel, cfg: Config) -> list[dict[str, Any]]:
    """Named parameter groups; ``lr_scale`` multiplies the scheduled backbone lr.

    Bias and norm parameters get no weight decay and no LARS adaptation (solo-learn #301). The
    gating head trains at ``method.gate_lr_ratio`` × the backbone lr; the online probe at
    ``train.probe_lr`` relative to the unscaled base lr, without weight decay.
    """
    wd = cfg.train.weight_decay
    buckets: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        part = name.split(".")[0]
        part = part if part in ("gating_head", "classifier") else "encoder"
        kind = "plain" if _is_bias_or_norm(name, p) else "weight"
        buckets.setdefault(f"{part}/{kind}", []).append(p)
    groups = []
    for key, params in buckets.items():
        part, kind = key.split("/")
        scale = {"encoder": 1.0, "gating_head": cfg.method.gate_lr_ratio, "classifier": 0.0}[part]
        g: dict[str, Any] = {"name": key, "params": params, "lr_scale": scale}
        adapt = kind == "weight" and part != "classifier"
        g["weight_decay"] = wd if adapt else 0.0
        g["always_adapt"] = False
        if part == "classifier":
            g["fixed_lr"] = cfg.train.probe_lr
        groups.append(g)
    return groups


def build_optimizer(groups: list[dict[str, Any]], cfg: Config) -> torch.optim.Optimizer:
    """LARS from timm (trust_coeff = eta, trust_clip = clip_lr), or SGD / AdamW.

    timm's LARS adapts only groups with weight decay > 0, which is how bias/norm are excluded.
    """
    t = cfg.train
    if t.optimizer == "lars":
        from timm.optim import Lars

        return Lars(groups, lr=t.base_lr, momentum=t.momentum, trust_coeff=t.lars_eta, trust_clip=t.clip_lr)
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=t.base_lr, momentum=t.momentum)
    return torch.optim.AdamW(groups, lr=t.base_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float, probe_factor: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = g["fixed_lr"] * probe_factor if "fixed_lr" in g else lr * g["lr_scale"]
