"""Model assembly: backbone f → h → the model head (projector → p → φ → z → [gating head, gate] → z̃,
the method's own heads; :class:`bayesncl.core.head.ModelHead`).

A method is a configuration of these parts (``MethodConfig``, preset from a spec of
:data:`bayesncl.core.methods.METHODS`, one file each), never a subclass. Parameter names
follow the authors' layout (``backbone.*``, ``projector.*``, ``gating_head.*``, ``classifier.*``)
so their checkpoints map onto ours. :class:`ModelOutput` and :func:`contrastive_loss` are
re-exported here from :mod:`bayesncl.core.methods.spec` and :mod:`bayesncl.core.head`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torchvision
from torch import Tensor, nn

from bayesncl.core.head import ModelHead, contrastive_loss
from bayesncl.core.methods.spec import ModelOutput

if TYPE_CHECKING:
    from bayesncl.core.configs import CoreConfig as Config
    from bayesncl.core.configs import ModelConfig
    from bayesncl.core.methods import MethodConfig

__all__ = [
    "BACKBONES", "BackboneError", "ContrastiveModel", "ModelOutput", "build_backbone", "build_model",
    "contrastive_loss", "small_cnn", "timm_backbone",
]


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


class ContrastiveModel(ModelHead):
    """The model: a backbone f plus the model head (:class:`~bayesncl.core.head.ModelHead`: projector,
    φ, optional TopK, optional gate, the method's own heads) and the online probe ``classifier``
    (Linear(H, C) on sg(h), run by the training step). Parameter names: ``backbone.*`` first, then
    the head's (``projector.*``, ``gating_head.*``, ``heads.NAME.*``, ``classifier.*``)."""

    backbone: nn.Module
    classifier: nn.Linear

    def __init__(
        self, backbone: nn.Module, h_dim: int, model_cfg: ModelConfig, method: MethodConfig, num_classes: int
    ) -> None:
        """backbone: maps (B, C, S, S) images to h: (B, h_dim); num_classes: C, the dataset's classes."""
        super().__init__(h_dim, model_cfg, method, num_classes, probe=True, backbone=backbone)
        self.bn_views = model_cfg.bn_views

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


def build_model(cfg: Config, in_channels: int, image_size: int, num_classes: int) -> ContrastiveModel:
    """Assemble the model a config describes (PAPER-NOTES §1)."""
    backbone, h_dim = build_backbone(cfg.model, in_channels, image_size)
    return ContrastiveModel(backbone, h_dim, cfg.model, cfg.method, num_classes)

