"""The authors' linear-probe protocols (PAPER-NOTES §2; PKU-ML/non_neg scripts/linear/{cifar,imagenet-100}/
simclr.yaml run by solo/methods/linear.py; :mod:`bayesncl.metrics.protocols`, chosen by
``eval.probe_protocol``): CIFAR's LARS with warmup-cosine or ImageNet-100's SGD with step decay, on
the frozen backbone features h, 50 epochs of augmented crops, Acc@1/Acc@5 on the test split
(settings and history: docs/metrics.md, "Fast linear probe", the paragraph "This is not the paper's probe").

It runs the backbone on every augmented batch, so it is meant for GPUs; ``fast`` mode
(``bayesncl.metrics.probe.linear_probe``) is the CPU alternative. The backbone stays in eval
mode and is checked to be unchanged afterwards, BatchNorm statistics included (MoCo v3's sanity
check).
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from bayesncl.config import Config
from bayesncl.core.model import ContrastiveModel
from bayesncl.metrics.protocols import Protocol, linear_protocol


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def probe_param_groups(clf: nn.Linear, weight_decay: float) -> list[dict[str, Any]]:
    """The classifier's LARS groups as the authors' LARS treats them (exclude_bias_n_norm,
    solo/utils/lars.py): the weight adapted and decayed by ``weight_decay``, the bias neither."""
    return [
        {"params": [clf.weight], "weight_decay": weight_decay, "always_adapt": True},
        {"params": [clf.bias], "weight_decay": 0.0, "always_adapt": False},
    ]


@torch.no_grad()
def accuracy(backbone: nn.Module, clf: nn.Linear, loader: Any, num_classes: int) -> tuple[float, float]:
    """Acc@1, Acc@5 (percent; @k = @min(k, classes)) of ``clf(backbone(x))`` over ``loader``'s
    ``(x, y, idx)`` batches; the caller sets the modules' modes."""
    top1 = top5 = n = 0
    k = min(5, num_classes)
    for x, y, _ in loader:
        logits = clf(backbone(x).float())
        pred = logits.topk(k, dim=1).indices
        y = y.to(pred.device)
        top1 += int((pred[:, 0] == y).sum())
        top5 += int((pred == y[:, None]).any(1).sum())
        n += len(y)
    return 100.0 * top1 / max(n, 1), 100.0 * top5 / max(n, 1)


def probe_optimizer(
    clf: nn.Linear, protocol: Protocol, lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """The classifier's optimiser under ``protocol``: LARS (:func:`probe_param_groups`, trust
    coefficient ``lars_eta``, clipped) or SGD over both tensors (weight decay on both, as
    ``solo/methods/linear.py`` without ``exclude_bias_n_norm_wd``), momentum ``protocol.momentum``;
    ``lr`` is the scaled peak rate."""
    if protocol.optimizer == "lars":
        from timm.optim import Lars

        return Lars(probe_param_groups(clf, weight_decay), lr=lr, momentum=protocol.momentum,
                    trust_coeff=protocol.lars_eta, trust_clip=protocol.clip_lr)  # fmt: skip
    return torch.optim.SGD(clf.parameters(), lr=lr, momentum=protocol.momentum, weight_decay=weight_decay)


def probe_schedule(protocol: Protocol, lr: float, epochs: int, steps_per_epoch: int) -> np.ndarray:
    """The rate at each of the ``epochs · steps_per_epoch`` steps, (total,) float64: warmup-cosine
    per iteration, or the step decay (× gamma at each milestone epoch)."""
    from bayesncl.core.optim import StepSchedule, warmup_cosine

    total = epochs * steps_per_epoch
    if protocol.schedule == "step":
        sched = StepSchedule(total, steps_per_epoch, protocol.milestones, protocol.gamma)
        return np.array([sched.at(t, lr) for t in range(total)], dtype=np.float64)
    warmup = round(min(protocol.warmup_epochs, epochs) * steps_per_epoch)
    return warmup_cosine(lr, total, warmup, start=protocol.warmup_start_lr)


def paper_linear_probe(
    model: ContrastiveModel, cfg: Config, *, epochs: int | None = None, seeds: list[int] | None = None,
    batch_size: int | None = None, base_lr: float | None = None, weight_decay: float | None = None,
    warmup_epochs: float | None = None, protocol: Protocol | None = None, progress: bool = True,
) -> dict[str, Any]:
    """Train and test a linear probe on frozen h with the authors' protocol.

    protocol: a :class:`bayesncl.metrics.protocols.Protocol`; None: ``eval.probe_protocol`` of
    ``cfg`` (``auto``: by ``data.name``). ``epochs``, ``batch_size``, ``base_lr`` (per 256 images),
    ``weight_decay`` and ``warmup_epochs`` override the protocol's where given.
    returns: ``{"acc1", "acc5", "acc1_std", "acc5_std", "per_seed", "protocol"}`` (percent).
    Raises EvalError if the train split holds fewer than ``batch_size`` images, RuntimeError if the
    backbone changed during probing (it must not).
    """
    from bayesncl.data import build_eval_loader, build_train_loader, dataset_info
    from bayesncl.metrics.inputs import EvalError

    protocol = protocol or linear_protocol(cfg.eval.probe_protocol, cfg.data.name)
    changes: dict[str, Any] = {"epochs": epochs, "batch_size": batch_size, "lr": base_lr,
                               "weight_decay": weight_decay, "warmup_epochs": warmup_epochs}  # fmt: skip
    protocol = replace(protocol, **{k: v for k, v in changes.items() if v is not None})
    epochs, batch_size = protocol.epochs, protocol.batch_size
    seeds = seeds or [cfg.seed]
    device = next(model.parameters()).device
    info = dataset_info(cfg.data)
    if info.num_train < batch_size:  # the loader's own error advised train.batch_size, which is not used
        raise EvalError(
            f"the paper probe trains with batch {batch_size} (the paper's), more than the {info.num_train} "
            f"training images of {info.name}: use more (data.train_subset), or --probe fast"
        )
    backbone = model.backbone.eval()
    before = _snapshot(backbone)
    test_loader = build_eval_loader(cfg.data, "test", cfg.eval.batch_size, device=device)
    per_seed = []
    for seed in seeds:
        torch.manual_seed(seed)
        clf = nn.Linear(model.h_dim, info.num_classes).to(device)
        lr = protocol.lr * batch_size / 256
        opt = probe_optimizer(clf, protocol, lr, protocol.weight_decay)
        loader = build_train_loader(cfg.data, batch_size, seed=seed, device=device, crop_flip_only=True)
        schedule = probe_schedule(protocol, lr, epochs, len(loader))
        step = 0
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            it = loader
            if progress:
                from tqdm.auto import tqdm

                it = tqdm(loader, desc=f"paper probe seed {seed} epoch {epoch + 1}/{epochs}", leave=False)
            for x1, _, y in it:
                for g in opt.param_groups:
                    g["lr"] = float(schedule[step])
                with torch.no_grad():
                    h = backbone(x1).float()
                loss = nn.functional.cross_entropy(clf(h), y.to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
        acc1, acc5 = accuracy(backbone, clf, test_loader, info.num_classes)
        per_seed.append({"seed": seed, "acc1": acc1, "acc5": acc5})
    after = _snapshot(backbone)
    if any(not torch.equal(before[k], after[k]) for k in before):
        raise RuntimeError("the frozen backbone changed during linear probing (it must not)")
    a1 = [r["acc1"] for r in per_seed]
    a5 = [r["acc5"] for r in per_seed]
    return {
        "acc1": statistics.fmean(a1),
        "acc5": statistics.fmean(a5),
        "acc1_std": statistics.pstdev(a1),
        "acc5_std": statistics.pstdev(a5),
        "per_seed": per_seed,
        "protocol": f"paper {protocol.describe()}, crops+flips, frozen h",
    }
