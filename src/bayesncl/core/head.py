"""Everything after the backbone, as one module (:class:`ModelHead`): the projector, φ, TopK, the
gating head and gate, the prevalence π, the online probe and the method's own heads; the method's
loss on its output (:func:`contrastive_loss`); and :class:`ContrastiveHead`, the same module plus
the loss for other training loops (the backbone, the optimiser, the schedule and the data stay the
caller's; docs/api.md shows it in a plain PyTorch loop and in a Lightning module). The full model
(:class:`bayesncl.core.model.ContrastiveModel`) is a backbone plus a :class:`ModelHead`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from bayesncl.core import distributed, methods, parts
from bayesncl.core.configs import ConfigError
from bayesncl.core.methods.spec import ModelOutput
from bayesncl.core.parts import Gate, GatingHead, NonNegative, Prevalence, Projector

if TYPE_CHECKING:
    from bayesncl.core.configs import CoreConfig as Config
    from bayesncl.core.configs import ModelConfig
    from bayesncl.core.methods import MethodConfig

__all__ = ["ModelHead", "ContrastiveHead", "contrastive_loss"]


class ModelHead(nn.Module):
    """Everything after the backbone (PAPER-NOTES §1): h → projector → p → φ → [TopK] → z →
    [gating head, gate] → z̃, the prevalence π of ``method.ipw``, the online probe, and every head the
    method declares (:class:`~bayesncl.core.methods.Head`: CE's classifier, a plugin's), run by
    :meth:`project`.

    The full model (:class:`~bayesncl.core.model.ContrastiveModel`, with ``backbone``) and
    :class:`ContrastiveHead` are both one. Parameter names follow the authors' layout, in this order:
    ``backbone.*``, ``projector.*``, ``gating_head.*``, ``prevalence.pi``, ``heads.NAME.*``,
    ``classifier.*`` (stored checkpoints and optimiser states map onto them by name and by
    position); the modules draw their initial weights in the order projector, gating head, online
    probe, heads, so that a seeded run gives the same numbers as before.

    Args:
        h_dim: H, the width of the backbone's features h.
        model_cfg: the checked ``model.*`` config (``proj_hidden``, ``proj_dim`` = D are read).
        method_cfg: the checked ``method.*`` config (φ, TopK, the gate, the prevalence).
        num_classes: C, the classes of the labels: the output width of the online probe and of the
            method's heads (``Head.build(D, C)``).
        probe: add the online probe ``classifier``, Linear(H, C) (the training step runs it on sg(h)).
        backbone: registered first, as ``backbone`` (the full model); None for the head alone.
        spec: the method whose heads are built; default the registered ``method_cfg.name``
            (:func:`bayesncl.core.plugins.check_method` passes a method before it registers).

    Raises ConfigError (one line) if ``method_cfg.name`` is not registered and no ``spec`` is given.
    """

    def __init__(
        self, h_dim: int, model_cfg: ModelConfig, method_cfg: MethodConfig, num_classes: int = 0, *,
        probe: bool = False, backbone: nn.Module | None = None, spec: methods.Method | None = None,
    ) -> None:
        super().__init__()
        mo, m = model_cfg, method_cfg
        if backbone is not None:
            self.backbone = backbone
        self.h_dim = h_dim
        self.projector = Projector(h_dim, mo.proj_hidden, mo.proj_dim)
        self.nonneg = NonNegative(m.nonneg)
        self.topk = round(m.rho * mo.proj_dim) if m.topk else 0
        self.gating_head: GatingHead | None = None
        self.gate: Gate | None = None
        if m.gate != "none":
            self.gating_head = GatingHead(
                h_dim, m.gate_hidden or mo.proj_hidden, mo.proj_dim, depth=m.gate_depth, detach=m.detach,
                tau=m.gate_tau,
            )
            self.gate = Gate(m.gate, m.threshold, m.gumbel_noise, tau=m.gate_tau)
        self.prevalence = Prevalence(mo.proj_dim, m.ipw_momentum, m.ipw_eps) if m.ipw else None
        # eval mode only: gate z̃ with alpha instead of the hard mask (the authors' eval.use_soft_gating,
        # main_eval.py:104-113), the mask staying 0/1; set by app.evaluate.extract_split
        self.soft_eval_gate = False
        self.heads = nn.ModuleDict()  # registered before the probe (the checkpoints' order) ...
        if probe:
            self.classifier = nn.Linear(h_dim, num_classes)
        for name, head in (spec or methods.get(m.name)).heads.items():  # ... and built after it (the RNG's)
            self.heads[name] = head.build(mo.proj_dim, num_classes)

    def project(self, h: Tensor) -> ModelOutput:
        """Run everything after the backbone on h: (B, H) → :class:`ModelOutput` (shapes there). In
        training mode a ``method.ipw`` model updates π with this batch first."""
        p = self.projector(h)
        z = self.nonneg(p)
        if self.topk:
            z = parts.topk_mask(z, self.topk)
        logits = alpha = mask = None
        if self.gating_head is not None and self.gate is not None:
            logits = self.gating_head(h)
            mask, alpha = self.gate(logits)
            if not self.training and self.gate.kind == "soft":
                # evaluation uses the hard mask (PAPER-NOTES §3), soft ablation included
                mask = (alpha > self.gate.threshold).to(alpha.dtype)
            soft = not self.training and self.soft_eval_gate  # eval.use_soft_gating: z̃ = normalize(ẑ ⊙ α)
            z_tilde = parts.gated_features(z, alpha if soft else mask)
        else:
            z_tilde = parts.eval_features(z)
        weights = None
        if self.prevalence is not None:
            if self.training:
                self.prevalence.update(z)  # this batch enters π before π weighs it
            weights = self.prevalence.weights()
        heads = {name: head(parts.raw_features(z, mask)) for name, head in self.heads.items()}
        return ModelOutput(h, p, z, logits, alpha, mask, z_tilde, weights, heads)


def contrastive_loss(
    out: ModelOutput, method: MethodConfig, *, gather: bool | None = None, index: Tensor | None = None,
    labels: Tensor | None = None, spec: methods.Method | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of the method ``method.name`` on one batch: the weighted sum of its loss terms and
    its parts' (:func:`bayesncl.core.methods.loss`), e.g. InfoNCE(z̃, τ) + λ·KL(Bern(α) ‖ Bern(ρ))
    for BayesNCL (PAPER-NOTES §1). Returns the fp32 loss and each term's detached value by name
    (``{"info_nce"}``, ``{"info_nce", "kl"}`` with a gate), means over the 2n local rows.

    out.z_tilde must hold this process's 2n views laid out ``[view1; view2]``. gather: take the
    contrastive negatives from every process (``None``, the default: whenever torch.distributed runs
    with more than one process; ``False``: local negatives only, not the paper's objective under
    DDP). index: (n,) the dataset index of each image (every view of the same image is a positive).
    labels: (n,) class labels, for the terms of supervised methods. spec: the registered
    :class:`~bayesncl.core.methods.Method` of ``method.name``, resolved once per run (None: looked up).
    """
    gather = distributed.is_distributed() if gather is None else gather
    return methods.loss(out, method, methods.Batch(labels=labels, index=index, gather=gather), spec)


class ContrastiveHead(ModelHead):
    """Projector → φ → [TopK] → [gating head, gate] → loss, on backbone features h.

    ``h_dim``: the width H of the backbone's features; ``config``: a :class:`bayesncl.config.Config`
    (``bayesncl.build_config([...])``; its ``method.*`` and ``model.proj_hidden`` / ``proj_dim``
    are read). Works with every registered method. Parameter names are the full model's
    (``projector.*``, ``gating_head.*``, ``heads.NAME.*``: the same :class:`ModelHead`), so a head's
    state dict loads into a :class:`~bayesncl.core.model.ContrastiveModel` of the same config.
    """

    def __init__(self, h_dim: int, config: Config, num_classes: int = 0) -> None:
        """``num_classes``: the classes of the labels, for a method with its own heads (``ce``'s
        classifier, a plugin's ``Head``); ConfigError (one line) if such a method gets none."""
        own = methods.get(config.method.name).heads
        if own and num_classes < 1:
            raise ConfigError(
                f"method {config.method.name!r} has its own head(s) ({', '.join(own)}), built for the "
                "number of classes: ContrastiveHead(h_dim, config, num_classes=C)"
            )
        super().__init__(h_dim, config.model, config.method, num_classes)
        self.method = config.method

    def forward(
        self, h1: Tensor, h2: Tensor, *, index: Tensor | None = None, gather: bool | None = None,
        labels: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of a batch of n images from their two views' features ``h1``, ``h2``: (n, H).

        Returns the fp32 scalar loss (the method's: InfoNCE over the 2n rows, + λ·KL with a gate)
        and the method's detached statistics by name but those that need the online probe, e.g.
        ``{"loss", "info_nce", "kl", "gate_open", "gate_mean_alpha", "rows_all_closed"}`` (the last
        four only with a gate): means over the 2n rows, gate_open the fraction of open gates
        (α > ``method.threshold``), gate_mean_alpha the mean α, rows_all_closed the fraction of rows
        with every gate closed. ``gather``: contrastive negatives from every process under
        torch.distributed (default: whenever it runs with > 1 process; :func:`contrastive_loss`).
        ``index``: (n,) dataset indices, for loaders that can put one image twice in a (global)
        batch, e.g. a padding ``DistributedSampler``: every view of the same index is then a
        positive (the authors' rule); without it row i's positive is row i+n, the same when no
        index repeats. ``labels``: (n,) class labels, for a supervised method (``needs_labels``:
        ``ce``, ``supcon``, ...; ConfigError, one line, if such a method gets none)."""
        if labels is None and methods.get(self.method.name).needs_labels:
            raise ConfigError(
                f"method {self.method.name!r} learns from labels: pass them, head(h1, h2, labels=y) with "
                "y (n,) the images' classes"
            )
        out = self.project(torch.cat([h1, h2]))
        loss, terms = contrastive_loss(out, self.method, gather=gather, index=index, labels=labels)
        with torch.no_grad():
            stats = methods.statistics(self.method, methods.Step(loss, terms, out), labeled=False)
        return loss, stats

    @torch.no_grad()
    def features(self, h: Tensor) -> ModelOutput:
        """The head's outputs for backbone features h: (B, H), in eval mode (the hard gate):
        ``.z_tilde`` (B, D) are the evaluation features (PAPER-NOTES §3), ``.mask`` the gates."""
        was = self.training
        self.eval()
        out = self.project(h)
        self.train(was)
        return out

    def param_groups(self, lr: float, weight_decay: float = 0.0) -> list[dict[str, Any]]:
        """Optimiser groups: the projector (and the method's heads) at ``lr`` and the gating head at
        ``method.gate_lr`` where it is set (> 0; the authors' fixed ``gating_head_lr``, e.g. 0.1 in the
        CIFAR recipes), else ``method.gate_lr_ratio`` × ``lr`` (paper Table 15), as a run's
        :func:`bayesncl.core.optim.peak_lrs`; biases and norms without weight decay (``weight_decay``
        for the rest). Each group has ``name``, ``params``, ``lr``, ``weight_decay`` and ``lr_scale``
        (its lr / ``lr``, to reapply a schedule: ``g["lr"] = scheduled * g["lr_scale"]``)."""
        m = self.method
        gate_scale = m.gate_lr / lr if m.gate_lr > 0 else m.gate_lr_ratio
        groups: dict[str, dict[str, Any]] = {}
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            part = "gating_head" if name.startswith("gating_head.") else "projector"
            kind = "plain" if p.ndim <= 1 or name.endswith(".bias") else "weight"
            scale = gate_scale if part == "gating_head" else 1.0
            g = groups.setdefault(f"{part}/{kind}", {
                "name": f"{part}/{kind}", "params": [], "lr": lr * scale, "lr_scale": scale,
                "weight_decay": weight_decay if kind == "weight" else 0.0,
            })
            g["params"].append(p)
        return list(groups.values())
