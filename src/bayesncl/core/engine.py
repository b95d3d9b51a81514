"""TODO docstring."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from bayesncl.config import Config, MethodConfig
from bayesncl.core import distributed
from bayesncl.core.model import ContrastiveModel, ModelOutput, contrastive_loss

B = TypeVar("B")


class TrainingError(RuntimeError):
    """Training cannot continue (non-finite loss, ...); the message is one line."""


# ----------------------------------------------------------------------------- one step
class TrainForward(nn.Module):
    """What DDP and torch.compile wrap: the model plus the online probe on sg(h), so that every
    trained parameter is used inside one ``forward`` (where DDP expects it)."""

    def __init__(self, model: ContrastiveModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[ModelOutput, Tensor]:
        out = self.model(x)
        return out, self.model.classifier(out.h.detach())


def wrap_for_training(model: ContrastiveModel, cfg: Config, world: distributed.World) -> nn.Module:
    """:class:`TrainForward` around ``model``, inside DDP when there are several processes (DDP
    averages the gradients over ranks), compiled when ``train.compile``. ``model`` keeps owning
    the parameters: checkpoints and evaluation use it directly."""
    step_model: nn.Module = TrainForward(model)
    if world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        step_model = DistributedDataParallel(step_model, device_ids=ids)
    if cfg.train.compile:
        step_model = torch.compile(step_model)
    return step_model


def forward_loss(
    step_model: nn.Module,
    x1: Tensor,
    x2: Tensor,
    y: Tensor,
    method: MethodConfig,
    *,
    autocast: Any = None,
    channels_last: bool = False,
) -> tuple[Tensor, Tensor]:
    """This process's loss on one batch, and the batch's (6,) detached statistics (:func:`step_stats`).

    x1, x2: (n, C, S, S) the two views of n images; y: (n,) labels, used by the online probe only.
    The loss is InfoNCE + λ·KL over the 2n local rows (under DDP the negatives are gathered from
    every rank, see :func:`bayesncl.core.model.contrastive_loss`) plus the probe's cross-entropy on
    sg(h). Each term is a mean over local rows, so DDP's gradient average is the global mean.
    """
    x = torch.cat([x1, x2])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with autocast if autocast is not None else nullcontext():
        out, logits_cls = step_model(x)
    loss, parts = contrastive_loss(out, method)
    yy = torch.cat([y, y])
    probe_loss = nn.functional.cross_entropy(logits_cls.float(), yy)
    with torch.no_grad():
        stats = step_stats(loss, parts, out.mask, logits_cls, yy)
    return loss + probe_loss, stats


def train_step(
    step_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    x1: Tensor,
    x2: Tensor,
    y: Tensor,
    method: MethodConfig,
    *,
    autocast: Any = None,
    channels_last: bool = False,
) -> Tensor:
    """:func:`forward_loss`, backward, optimiser step. Returns the (6,) statistics, on the device:
    nothing here waits for the device (fp16's GradScaler does, once per step, to skip inf steps;
    bf16 and fp32 need no scaler)."""
    loss, stats = forward_loss(step_model, x1, x2, y, method, autocast=autocast, channels_last=channels_last)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return stats


def prefetch_to_device(batches: Iterable[B], device: torch.device) -> Iterator[B]:
    """Iterate ``batches``, producing each one on a side CUDA stream while the step before it runs.

    Why: the batched augmentation (kornia) draws its random parameters on the CPU and copies them
    to the GPU, and each such copy waits for the stream it runs on. On the main stream that wait
    would include the whole previous training step, so the GPU would idle while the CPU augments.
    On a side stream the waits cover the augmentation only: the GPU runs step t while the CPU
    prepares batch t+1. The main stream waits for the side stream before using a batch, and the
    batch's tensors are marked as used there (``record_stream``) for the caching allocator.
    On the CPU this is a plain pass-through.
    """
    if device.type != "cuda":
        yield from batches
        return
    side = torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)
    it = iter(batches)
    while True:
        with torch.cuda.stream(side):
            try:
                batch = next(it)
            except StopIteration:
                return
        main.wait_stream(side)
        for t in batch if isinstance(batch, (tuple, list)) else (batch,):
            if isinstance(t, Tensor) and t.is_cuda:
                t.record_stream(main)
        yield batch


def step_stats(
    loss: torch.Tensor,
    parts: dict[str, torch.Tensor],
    mask: torch.Tensor | None,
    class_logits: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """(6,) tensor: loss, InfoNCE, KL, gate-open rate, fraction of rows with every gate closed,
    online-probe accuracy. Stays on the device: no host sync inside the step."""
    one = torch.ones((), device=loss.device)
    open_rate = mask.float().mean() if mask is not None else one
    closed = (mask.sum(1) == 0).float().mean() if mask is not None else 0 * one
    correct = (class_logits.argmax(1) == y).float().mean()
    return torch.stack([loss.detach(), parts["info_nce"], parts["kl"], open_rate, closed, correct])
