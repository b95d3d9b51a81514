"""The method as a module for other training loops: everything after the backbone, plus the loss
(:class:`ContrastiveHead`); the backbone, the optimiser, the schedule and the data stay the
caller's. docs/api.md shows it in a plain PyTorch loop and in a Lightning module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from bayesncl.core import methods
from bayesncl.core.configs import ConfigError
from bayesncl.core.model import ContrastiveModel, ModelOutput, contrastive_loss

if TYPE_CHECKING:
    from bayesncl.core.configs import CoreConfig as Config

__all__ = ["ContrastiveHead"]


class ContrastiveHead(nn.Module):
    """Projector → φ → [TopK] → [gating head, gate] → loss, on backbone features h.

    ``h_dim``: the width H of the backbone's features; ``config``: a :class:`bayesncl.config.Config`
    (``bayesncl.build_config([...])``; its ``method.*`` and ``model.proj_hidden`` / ``proj_dim``
    are read). Parameter names are the full model's (``projector.*``, ``gating_head.*``), so a
    head's state dict loads into a :class:`~bayesncl.core.model.ContrastiveModel` of the same config.
    """

    project = ContrastiveModel.project  # the same code the full model runs after its backbone
    _build_parts = ContrastiveModel._build_parts  # and the same parts
    _build_heads = ContrastiveModel._build_heads  # and the method's own heads (CE's classifier)

    def __init__(self, h_dim: int, config: Config, num_classes: int = 0) -> None:
        """``num_classes``: the classes of the labels, for a method with its own heads (``ce``'s
        classifier, a plugin's ``Head``); ConfigError (one line) if such a method gets none."""
        super().__init__()
        self.method = config.method
        self._build_parts(h_dim, config.model, config.method)
        own = methods.get(config.method.name).heads
        if own and num_classes < 1:
            raise ConfigError(
                f"method {config.method.name!r} has its own head(s) ({', '.join(own)}), built for the "
                "number of classes: ContrastiveHead(h_dim, config, num_classes=C)"
            )
        self._build_heads(config.model, config.method, num_classes)

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
        torch.distributed (default: whenever it runs with > 1 process;
        :func:`bayesncl.core.model.contrastive_loss`). ``index``: (n,) dataset indices, for loaders
        that can put one image twice in a (global) batch, e.g. a padding ``DistributedSampler``:
        every view of the same index is then a positive (the authors' rule); without it row i's
        positive is row i+n, the same when no index repeats. ``labels``: (n,) class labels, for a
        supervised method."""
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
        """Optimiser groups: the projector at ``lr`` and the gating head at ``method.gate_lr_ratio``
        × ``lr`` (paper Table 15); biases and norms without weight decay (``weight_decay`` for the
        rest). Each group has ``name``, ``params``, ``lr``, ``weight_decay`` and ``lr_scale`` (its
        lr / ``lr``, to reapply a schedule: ``g["lr"] = scheduled * g["lr_scale"]``)."""
        groups: dict[str, dict[str, Any]] = {}
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            part = "gating_head" if name.startswith("gating_head.") else "projector"
            kind = "plain" if p.ndim <= 1 or name.endswith(".bias") else "weight"
            scale = self.method.gate_lr_ratio if part == "gating_head" else 1.0
            g = groups.setdefault(f"{part}/{kind}", {
                "name": f"{part}/{kind}", "params": [], "lr": lr * scale, "lr_scale": scale,
                "weight_decay": weight_decay if kind == "weight" else 0.0,
            })
            g["params"].append(p)
        return list(groups.values())
