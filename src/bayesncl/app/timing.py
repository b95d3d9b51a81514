"""Timing a training step of a config on this machine, with the model, optimiser, precision and
loader ``pretrain`` builds: ``pretrain``'s projected time (:mod:`bayesncl.app.train`, before the first
step on a CPU), ``reproduce``'s plan and ``bayesncl benchmark`` (:mod:`bayesncl.paper.benchmark`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from bayesncl.config import Config

if TYPE_CHECKING:  # torch and the training code load only when something is timed
    import torch

__all__ = ["Batch", "endless", "images_per_second", "sync", "trainer"]


def endless(loader: Any) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The batches of ``loader``, epoch after epoch, for ever (``set_epoch`` before each)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


Batch = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]


def trainer(
    cfg: Config, device: torch.device
) -> tuple[Callable[[Batch | None], None], Iterator[Batch], torch.nn.Module]:
    """``(step, batches, model)``: one training step of ``model`` (the one ``cfg`` describes), on
    the next of ``batches`` (or on the batch given), with the model, optimiser, precision and loader
    pretrain builds (:mod:`bayesncl.core.engine`, :mod:`bayesncl.core.optim`) at the peak learning rate."""
    import torch

    from bayesncl.core import methods
    from bayesncl.core.distributed import World
    from bayesncl.core.engine import (
        compiled_loss,
        contrastive_loss_fn,
        prefetch_to_device,
        train_step,
        wrap_for_training,
    )
    from bayesncl.core.model import build_model
    from bayesncl.core.optim import build_optimizer, param_groups, peak_lrs, precision_plan
    from bayesncl.data import build_train_loader, dataset_info

    info = dataset_info(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg, info.channels, info.image_size, info.num_classes).to(device)
    plan = precision_plan(cfg.train.precision, cfg.train.channels_last, device)
    if plan.channels_last:
        model = model.to(memory_format=torch.channels_last)
    groups = param_groups(model, cfg, peak_lrs(cfg, cfg.train.batch_size))
    optimizer = build_optimizer(groups, cfg)  # at the peak lrs
    amp = plan.dtype
    autocast = torch.autocast(device.type, dtype=amp) if amp is not None else None
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    step_model = wrap_for_training(model, cfg, World(device=device))
    method = methods.get(cfg.method.name)
    loss = contrastive_loss_fn(method, cfg.method, autocast=autocast, channels_last=plan.channels_last)
    loss_fn = compiled_loss(cfg, World(device=device), loss)
    loader = build_train_loader(cfg.data, cfg.train.batch_size, seed=0, device=device)
    batches = prefetch_to_device(endless(loader), device)  # as in pretrain
    model.train()

    def step(batch: Batch | None = None) -> None:
        train_step(step_model, optimizer, scaler, batch if batch is not None else next(batches), loss_fn)

    return step, batches, model


def images_per_second(cfg: Config, steps: int = 3) -> float:
    """Pretraining throughput of ``cfg`` on this machine (``train.device``), in images per second
    (one image = its two views, forward and backward): the mean over ``steps`` training steps
    after one warm-up step, with the model, optimiser and loader pretrain builds. Used by
    ``reproduce`` to estimate a plan's time when no run of the kind has been timed yet. The step is
    eager whatever ``train.compile`` says (compiling would take longer than the estimate itself)."""
    from dataclasses import replace

    from bayesncl.core.distributed import resolve_device

    device = resolve_device(cfg.train.device)
    step, *_ = trainer(replace(cfg, train=replace(cfg.train, compile="false")), device)
    step(None)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step(None)
    sync(device)
    return steps * cfg.train.batch_size / max(time.perf_counter() - t0, 1e-9)


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
