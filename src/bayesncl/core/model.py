"""Model assembly: backbone f → h → projector → p → φ → z → [gating head, gate] → z̃.

A method is a configuration of these parts (``MethodConfig``, preset from a spec of
:data:`bayesncl.core.methods.METHODS`, one file each), never a subclass. Parameter names
follow the authors' layout (``backbone.*``, ``projector.*``, ``gating_head.*``, ``classifier.*``)
so their checkpoints map onto ours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torchvision
from torch import Tensor, nn

from bayesncl.core import parts
from bayesncl.core.parts import Gate, GatingHead, NonNegative, Prevalence, Projector

if TYPE_CHECKING:
    from bayesncl.core.configs import CoreConfig as Config
    from bayesncl.core.configs import MethodConfig, ModelConfig


def _conv_bn(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


def small_cnn(in_channels: int) -> nn.Module:
    """A 4-block CNN for quick CPU runs on 28-32 px images; output h: (B, 256)."""
    return nn.Sequential(_conv_bn(in_channels, 32, 1), _conv_bn(32, 64, 2), _conv_bn(64, 128, 2),
                         _conv_bn(128, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten())


BACKBONES: dict[str, tuple[Callable[..., nn.Module], int]] = {
    "resnet18": (torchvision.models.resnet18, 512), "resnet50": (torchvision.models.resnet50, 2048),
    "small_cnn": (small_cnn, 256),
}
"""The backbones by name (``model.backbone``): (builder, h_dim, the width of h). A torchvision
builder takes ``weights=None``, :func:`small_cnn` the input channels. ``timm:NAME`` is built by
:func:`timm_backbone`."""


class BackboneError(ValueError):
    """A backbone that cannot be built as configured (``timm:NAME`` with these arguments, channels or
    image size), reported as one line; :mod:`bayesncl.app.errors` prints it like a ConfigError."""


def timm_backbone(cfg: ModelConfig, in_channels: int, image_size: int) -> tuple[nn.Module, int]:
    """``model.backbone=timm:NAME``: timm's NAME without its classifier (``num_classes=0``), for
    ``in_channels`` input channels, with ``model.backbone_kwargs`` (e.g. ``patch_size=4``,
    ``depth=4``) and, for a model that takes it and unless given, ``img_size=image_size``.

    Returns ``(module mapping (B, C, S, S) -> h: (B, h_dim), h_dim)``, h_dim the width of the
    model's real output, measured by one forward of two blank images (timm's ``num_features`` is
    the last feature map's width; a model with a pre-logits head, e.g. MobileNetV3, puts out its
    ``head_hidden_size`` instead: 1024 against 288 for ``mobilenetv3_small_050``). Raises
    BackboneError (one line) if timm cannot build it that way (an argument the model does not take,
    a channel count it cannot take, an image size its patches do not divide) or its output is not
    one vector per image.
    """
    import timm

    name = cfg.backbone.split(":", 1)[1]
    kwargs = dict(cfg.backbone_kwargs)
    auto_size = "img_size" not in kwargs
    fixed = {"pretrained": False, "num_classes": 0, "in_chans": in_channels}
    what = f"model.backbone={cfg.backbone} for {in_channels}-channel {image_size} px images"
    try:
        try:
            size = {"img_size": image_size} if auto_size else {}
            net = timm.create_model(name, **fixed, **kwargs, **size)
        except TypeError as e:
            if not (auto_size and "img_size" in str(e)):
                raise
            net = timm.create_model(name, **fixed, **kwargs)  # a model without img_size (a CNN)
        net.eval()
        with torch.no_grad():
            h = net(torch.zeros(2, in_channels, image_size, image_size))
        net.train()
    except Exception as e:  # noqa: BLE001 - timm and the model's own checks raise many types
        arg = str(e).rsplit("argument", 1)[-1].strip(" '")
        if isinstance(e, TypeError) and "unexpected keyword" in str(e) and arg in kwargs:
            msg = f"model.backbone_kwargs.{arg}: timm's {name} takes no argument {arg}"
            raise BackboneError(msg) from None
        raise BackboneError(f"{what}: timm cannot build it ({_first_line(e)})") from None
    if h.ndim != 2 or h.shape[0] != 2:  # a model whose num_classes=0 output is not pooled
        shape = tuple(h.shape)[1:]
        raise BackboneError(f"{what}: its features have shape {shape} per image, expected a vector (D,)")
    return net, int(h.shape[1])


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def build_backbone(cfg: ModelConfig, in_channels: int, image_size: int) -> tuple[nn.Module, int]:
    """torchvision ResNet-18/50 (optionally with the CIFAR stem), :func:`small_cnn`, or
    ``timm:NAME`` (:func:`timm_backbone`).

    The CIFAR stem (3×3 stride-1 conv1 with padding ``stem_padding``, no max-pool; PAPER-NOTES §1)
    is used when ``cifar_stem`` is ``true``, or ``auto`` and ``image_size <= 64``. Its padding is 2
    in the authors' code (solo/methods/base.py:197-200: 34×34 maps after conv1 at 32 px).
    Returns ``(module mapping (B, C, S, S) → h: (B, h_dim), h_dim)``.
    """
    if cfg.backbone.startswith("timm:"):
        return timm_backbone(cfg, in_channels, image_size)
    build, h_dim = BACKBONES[cfg.backbone]
    if cfg.backbone == "small_cnn":
        return build(in_channels), h_dim
    net = build(weights=None)
    cifar = cfg.cifar_stem == "true" or (cfg.cifar_stem == "auto" and image_size <= 64)
    if cifar:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=cfg.stem_padding, bias=False)
        net.maxpool = nn.Identity()
    elif in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    net.fc = nn.Identity()
    return net, h_dim


@dataclass
class ModelOutput:
    """Everything one forward pass produces; shapes for a batch of B images, D = proj_dim.

    h: (B, H) backbone features; p: (B, D) raw projector output; z: (B, D) after φ (and TopK);
    logits: (B, D) gate logits / τ_s or None; alpha: (B, D) noise-free σ(logits) or None;
    mask: (B, D) gate mask (hard in forward) or None; z_tilde: (B, D) the features fed to InfoNCE,
    which are also the evaluation features in eval mode (PAPER-NOTES §3); ipw_weights: (D,)
    π^(-1/2) of ``method.ipw`` (the loss then runs on z ⊙ ipw_weights, z̃ stays normalize(z)) or None.
    """

    h: Tensor
    p: Tensor
    z: Tensor
    logits: Tensor | None
    alpha: Tensor | None
    mask: Tensor | None
    z_tilde: Tensor
    ipw_weights: Tensor | None = None
    heads: dict[str, Tensor] = field(default_factory=dict)


class ContrastiveModel(nn.Module):
    """Backbone + projector + non-negativity + optional TopK + optional gate + online probe."""

    def __init__(
        self, backbone: nn.Module, h_dim: int, model_cfg: ModelConfig, method: MethodConfig, num_classes: int
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self._build_parts(h_dim, model_cfg, method)
        self.classifier = nn.Linear(h_dim, num_classes)
        self.bn_views = model_cfg.bn_views
        self._build_heads(model_cfg, method, num_classes)  # last: the others' RNG draws stay

    def _build_heads(self, mo: ModelConfig, m: MethodConfig, num_classes: int) -> None:
        """The method's own modules (:class:`~bayesncl.core.methods.spec.Head`: CE's classifier, a
        plugin's), each built for D = ``model.proj_dim`` and ``num_classes``, into ``self.heads``;
        :class:`~bayesncl.core.head.ContrastiveHead` builds them too."""
        from bayesncl.core import methods  # the registry reads this module's types

        for name, head in methods.get(m.name).heads.items():
            self.heads[name] = head.build(mo.proj_dim, num_classes)

    def _build_parts(self, h_dim: int, mo: ModelConfig, m: MethodConfig) -> None:
        """Everything after the backbone (PAPER-NOTES §1), which :class:`~bayesncl.core.head.ContrastiveHead`
        builds too: projector, φ, TopK's k, gating head and gate, prevalence (in this order: it is the
        order their initialisation draws from the RNG)."""
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
        self.heads = nn.ModuleDict()  # a method's own modules (CE's classifier), filled by the model

    def project(self, h: Tensor) -> ModelOutput:
        """Run everything after the backbone on h: (B, H)."""
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
        heads = {name: head(raw_features(z, mask)) for name, head in self.heads.items()}
        return ModelOutput(h, p, z, logits, alpha, mask, z_tilde, weights, heads)

    def forward(self, x: Tensor, views: int = 1) -> ModelOutput:
        """x: (B, C, S, S) normalised images → :class:`ModelOutput`.

        views: x holds that many equal blocks, e.g. 2 for the training step's ``[view1; view2]``.
        With ``model.bn_views=per_view`` each block goes through the backbone alone, so BatchNorm
        normalises over one view's images, as the authors' training step does (solo/methods/
        base.py:494); the rest is row-wise, so one call on the concatenated h equals theirs per view.
        ``joint``: one backbone call on all B images.
        """
        if views > 1 and self.bn_views == "per_view":
            return self.project(torch.cat([self.backbone(v) for v in x.chunk(views)]))
        return self.project(self.backbone(x))


def raw_features(z: Tensor, mask: Tensor | None) -> Tensor:
    """The features of a loss that does its own scaling (the spectral loss, CE's classifier): z
    (after φ and TopK), gated ``z ⊙ m`` with a gate (the mask's straight-through gradient reaches
    the gating head), not L2-normalised. z, mask: (M, D). Returns (M, D) in z's dtype."""
    return z if mask is None else z * mask.to(z.dtype)


def build_model(cfg: Config, in_channels: int, image_size: int, num_classes: int) -> ContrastiveModel:
    """Assemble the model a config describes (PAPER-NOTES §1)."""
    backbone, h_dim = build_backbone(cfg.model, in_channels, image_size)
    return ContrastiveModel(backbone, h_dim, cfg.model, cfg.method, num_classes)


def contrastive_loss(
    out: ModelOutput, method: MethodConfig, *, gather: bool | None = None, index: Tensor | None = None,
    labels: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of the method ``method.name`` on one batch: the weighted sum of its loss terms and
    its parts' (:func:`bayesncl.core.methods.loss`), e.g. InfoNCE(z̃, τ) + λ·KL(Bern(α) ‖ Bern(ρ))
    for BayesNCL (PAPER-NOTES §1). Returns the fp32 loss and each term's detached value by name
    (``{"info_nce"}``, ``{"info_nce", "kl"}`` with a gate), means over the 2n local rows.

    out.z_tilde must hold this process's 2n views laid out ``[view1; view2]``. gather: take the
    contrastive negatives from every process (``None``, the default: whenever torch.distributed runs
    with more than one process; ``False``: local negatives only, not the paper's objective under
    DDP). index: (n,) the dataset index of each image (every view of the same image is a positive).
    labels: (n,) class labels, for the terms of supervised methods.
    """
    from bayesncl.core import distributed, methods

    gather = distributed.is_distributed() if gather is None else gather
    return methods.loss(out, method, methods.Batch(labels=labels, index=index, gather=gather))
