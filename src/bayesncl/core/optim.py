"""Precision choice, parameter groups, optimiser and learning-rate schedule (PAPER-NOTES §2)."""

from __future__ import annotations

import functools
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
#: The x86 ``/proc/cpuinfo`` flags of native bf16 arithmetic, and the name each is reported by.
NATIVE_BF16_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags of the first CPU in ``cpuinfo`` (Linux); empty where the file is absent."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_cpu_bf16(flags: frozenset[str] | set[str] | None = None) -> str | None:
    """The instruction set that gives this CPU native bf16 arithmetic (``"AMX-BF16"`` or
    ``"AVX512-BF16"``), or None (then bf16 autocast is emulated, and slower than fp32).

    Detected, not guessed: the CPU must report the flag (``flags``, default :func:`cpu_flags`) AND
    this torch build must run its AVX-512 kernels (``torch.backends.cpu.get_cpu_capability()``) with
    oneDNN's bf16 path (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``, which alone is true for
    any AVX-512 CPU, hence the flag).
    """
    flags = cpu_flags() if flags is None else flags
    found = next((name for flag, name in NATIVE_BF16_FLAGS.items() if flag in flags), None)
    if found is None:
        return None
    try:
        capable = torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX")
        onednn = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without these probes
        return None
    return found if capable and onednn else None


@dataclass(frozen=True)
class Precision:
    """What a run computes in: the autocast ``dtype`` (None: fp32), the channels-last memory format,
    and ``why`` (one line for the log, e.g. ``"bf16 autocast + channels-last (train.precision=auto:
    this CPU has AVX512-BF16)"``)."""

    dtype: torch.dtype | None
    channels_last: bool
    why: str

    @property
    def name(self) -> str:
        """``"fp32"``, ``"bf16"`` or ``"fp16"``."""
        return dtype_name(self.dtype)


def dtype_name(dtype: torch.dtype | None) -> str:
    """``"fp32"`` for None (no autocast), ``"bf16"``, ``"fp16"``."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


def precision_text(name: str, channels_last: bool) -> str:
    """What a run computes in, for its log: ``"fp32"``, ``"bf16 autocast + channels-last"``, ..."""
    return (name if name == "fp32" else f"{name} autocast") + (" + channels-last" if channels_last else "")


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype, or None for fp32 (``train.precision``; :func:`precision_plan` says more).

    ``auto`` (the default): bf16 on a CUDA device that supports it, else fp16 there (the paper's fp16
    mixed precision, PAPER-NOTES §2); on a CPU, bf16 where it computes bf16 natively
    (:func:`native_cpu_bf16`: AVX512-BF16 or AMX; 1.45-2.7x as fast as fp32 there, Table 1 within
    its seed spread: docs/scaling.md, docs/decisions.md), fp32 on any other CPU. ``fast``: the same
    choice of dtype (an alias kept for the runs and commands that name it; it also adds
    channels-last on CUDA). bf16 has fp32's range, so it needs no GradScaler, whose inf check waits
    for the device every step. The loss, the KL, the statistics and the optimiser state are fp32
    whatever the autocast dtype (``bayesncl.core.losses``).
    """
    if name in ("auto", "fast"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if native_cpu_bf16() else None
    return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def precision_plan(name: str, channels_last: bool, device: torch.device) -> Precision:
    """The precision and memory format of ``train.precision=name``, ``train.channels_last`` on
    ``device``: channels-last where ``channels_last`` asks for it, wherever ``fast`` picks an
    autocast dtype, and wherever ``auto`` picks bf16 on a CPU (on CUDA ``auto`` keeps the memory
    format ``train.channels_last`` says). ``why`` names the choice and its reason, e.g.
    ``"bf16 autocast + channels-last (train.precision=auto: this CPU has AVX512-BF16)"``."""
    dtype = resolve_precision(name, device)
    cpu_auto = name == "auto" and device.type == "cpu"
    cl = channels_last or (dtype is not None and (name == "fast" or cpu_auto))
    if device.type == "cuda" or name not in ("auto", "fast"):
        reason = f"train.precision={name} on {device.type}"
        if device.type == "cpu" and dtype == torch.bfloat16 and not native_cpu_bf16():
            slow = "no native bf16 on this CPU, emulated and several times slower than fp32 (auto: fp32 here)"
            reason += f": {slow}"
    else:
        native = native_cpu_bf16()
        reason = f"train.precision={name}: " + (
            f"this CPU has {native}" if native else "this CPU has no native bf16 (AVX512-BF16 or AMX)"
        )
    return Precision(dtype, cl, f"{precision_text(dtype_name(dtype), cl)} ({reason})")


def identity_precision(name: str, device_name: str) -> str:
    """``train.precision`` as a run's identity holds it, so that a run in one precision is never
    reused for a run in another and every fp32 run stored before ``auto`` chose bf16 on some CPUs
    keeps its name: ``auto`` and ``fast`` are held with what they resolve to on this machine
    (``"auto:bf16"`` on a CPU with native bf16 or a CUDA GPU with bf16, ``"auto:fp16"`` on an older
    GPU, ``"fast:fp32"``, ...), except ``auto`` resolving to fp32, held as plain ``"auto"``; a CUDA
    device that is not there (refused when the run starts) is ``"<name>:cuda"``; every other value as
    is. ``device_name`` is ``train.device`` (``auto`` resolves to CUDA where it is available)."""
    if name not in ("auto", "fast"):
        return name
    device = torch.device("cuda" if device_name == "auto" and torch.cuda.is_available() else
                          "cpu" if device_name == "auto" else device_name)
    if device.type == "cuda" and not torch.cuda.is_available():
        return f"{name}:cuda"
    dtype = resolve_precision(name, device)
    return "auto" if name == "auto" and dtype is None else f"{name}:{dtype_name(dtype)}"


def extraction_precision(name: str, device: torch.device) -> Precision | None:
    """The precision a run trained with ``train.precision=name`` is evaluated in on ``device`` (the
    features of ``app.evaluate.extract_split`` and the held-out monitor of ``app.heldout``): its
    autocast + channels-last where ``fast``, or ``auto`` on a CPU, resolves to an autocast dtype
    there (bf16 on a CPU with native bf16), else None (fp32; ``auto`` on CUDA too, as before)."""
    if name == "fast" or (name == "auto" and device.type == "cpu"):
        plan = precision_plan(name, False, device)
        if plan.dtype is not None and plan.channels_last:
            return plan
    return None


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


@dataclass(frozen=True)
class StepSchedule:
    """Per-epoch step decay, as torch's ``MultiStepLR(milestones, gamma)`` that the authors'
    ImageNet-100 linear and fine-tuning protocol steps once per epoch (PKU-ML/non_neg
    ``scripts/linear/imagenet-100/simclr.yaml``: ``scheduler.name: step``, ``lr_decay_steps: [60, 80]``;
    ``solo/methods/linear.py``: ``MultiStepLR(..., gamma=0.1)``, a bare scheduler, so Lightning steps it
    per epoch). The same interface as :class:`LrSchedule` (``total_steps``, :meth:`at`, :meth:`apply`).

    At step t (0-based) of an epoch of ``steps_per_epoch`` steps, epoch e = t // steps_per_epoch:
    ``peak · gamma^#{m in milestones : m <= e}``. ``milestones`` are epochs.
    """

    total_steps: int
    steps_per_epoch: int
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1

    def at(self, step: int, peak: float) -> float:
        """The rate at ``step`` of a group whose peak (initial) rate is ``peak``."""
        epoch = step // max(self.steps_per_epoch, 1)
        return peak * self.gamma ** sum(1 for m in self.milestones if m <= epoch)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every group's ``lr`` at ``step`` from its ``peak_lr``; returns the first group's rate."""
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


def param_groups(model: ContrastiveModel, cfg: Config, peaks: dict[str, float]) -> list[dict[str, Any]]:
    """Named parameter groups, each with its part's ``peak_lr`` (``peaks``: :func:`peak_lrs`) as its
    initial ``lr``.

    Bias and norm parameters (1-D, or named ``.bias``) get no weight decay and no LARS adaptation
    (solo-learn #301). The online classifier has no weight decay, but LARS adapts its weight as
    the authors' LARS does (solo/utils/lars.py:140-150 adapts every tensor that is not 1-D).
    """
    wd = cfg.train.weight_decay
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
