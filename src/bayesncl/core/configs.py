"""The configuration types the core reads: the model and the optimisation sections, and what it reads
of the method's (:class:`MethodSettings`; the section itself, ``bayesncl.core.methods.MethodConfig``, is
built from the keys the method config and its parts declare).

:mod:`bayesncl.config` composes them with the data and evaluation sections into its ``Config``,
loads and checks it; nothing here imports it, so the core and the config do not import each other.
Core functions that read a whole run's config take any object with these sections
(:class:`CoreConfig`, e.g. ``bayesncl.config.Config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# train.compile_mode's values: torch.compile's modes ("default": its mode=None); the ones that capture CUDA
# graphs need core.engine's cudagraph_mark_step_begin() before each step
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class ConfigError(ValueError):
    """A configuration problem, reported to the user as one line."""


@dataclass
class ModelConfig:
    """Backbone f and projector (PAPER-NOTES §1)."""

    backbone: str = "resnet18"  # a name of bayesncl.core.model.BACKBONES, or timm:NAME (any timm model)
    backbone_kwargs: dict[str, Any] = field(default_factory=dict)  # timm: create_model's keyword arguments
    cifar_stem: str = "auto"  # auto | true | false; auto: true for images <= 64 px
    stem_padding: int = 2  # the CIFAR stem's conv1 padding: 2 as the authors' code, 1 the usual CIFAR ResNet
    bn_views: str = "per_view"  # per_view: BatchNorm over each view's n images (authors); joint: over 2n
    proj_hidden: int = 2048
    proj_dim: int = 256


class MethodSettings(Protocol):
    """What the core reads of a run's ``method.*`` config: its keys as attributes (``m.name``,
    ``m.rho``, a method's own ``m.l1_weight``). :class:`bayesncl.core.methods.MethodConfig` is one: its
    fields are built from the keys the method config and each part declare
    (:data:`bayesncl.core.methods.KEYS`), so they are not spelt out here (nothing in ``core.configs``
    imports the methods, which import it)."""

    name: str

    def __getattr__(self, key: str) -> Any: ...


@dataclass
class TrainConfig:
    """Optimisation (PAPER-NOTES §2)."""

    epochs: int = 200
    batch_size: int = 256
    optimizer: str = "lars"  # lars | sgd | adamw
    base_lr: float = 0.4  # scaled by global batch / 256
    weight_decay: float = 1e-4
    momentum: float = 0.9
    lars_eta: float = 0.02
    clip_lr: bool = True
    warmup_epochs: float = 10.0
    warmup_start_lr: float = 3e-5
    min_lr: float = 0.0
    probe_lr: float = 0.1  # online linear probe on sg(h)
    # auto | fast | fp32 | fp16 | bf16 (auto: bf16 on CUDA if supported, else fp16 there; on a CPU
    # with native bf16 (AVX512-BF16 or AMX) bf16 autocast + channels-last, fp32 on other CPUs;
    # fast: as auto, plus channels-last on CUDA; fp32: fp32 everywhere, as the CPU's auto was before)
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    channels_last: bool = False
    # torch.compile of the training step, forward + loss (core.engine.compile_plan): auto: on for CUDA,
    # off on a CPU (where it paid 1.07x after ~78 s of compiling, issue 23); true | false. Out of a run's
    # identity (paper.variants): same computation, rounded otherwise (fp32 within ~1e-6 per step)
    compile: str = "auto"
    # torch.compile's mode: default | reduce-overhead (CUDA graphs: static shapes, which the loaders'
    # drop_last batches give) | max-autotune (autotuned kernels and CUDA graphs) | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    sync_bn: bool = False
    checkpoint_every: int = 10  # also write epoch-NNNN.pt every this many epochs (0: only last)
    progress: bool = True
    # held-out test images scored every epoch (SC, H_sum, active dims, effective rank, open rate) into
    # log.csv's heldout_* columns (bayesncl.app.heldout); 0: none
    monitor_samples: int = 2000
    monitor_every: int = 1  # score it every this many epochs, and after the last (long runs: ~10 points)
    loggers: list[str] = field(default_factory=lambda: ["csv"])  # some of LOGGERS (runs.loggers)


class CoreConfig(Protocol):
    """What the core reads of a run's config (``bayesncl.config.Config`` is one)."""

    model: ModelConfig
    method: MethodSettings
    train: TrainConfig
    seed: int
