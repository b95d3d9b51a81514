"""The training loop without a disk or a screen: one step (:func:`train_step`), one epoch
(:func:`train_one_epoch`, which returns named statistics), and what wraps the model for DDP.

What leaves the loop goes through callbacks (the step log, a progress display) and through
:class:`EpochResult`; ``app.train`` runs the epochs and ``runs.rundir`` saves them.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor, nn

from bayesncl.core import distributed
from bayesncl.core.model import ContrastiveModel, ModelOutput, contrastive_loss
from bayesncl.core.optim import LrSchedule

if TYPE_CHECKING:  # config imports core's registries; core reads a checked config
    from bayesncl.config import Config, MethodConfig

B = TypeVar("B")

# The step statistics, in the order of :func:`step_stats`' tensor; online_acc is a fraction.
STATS = ("loss", "info_nce", "kl", "gate_open", "rows_all_closed", "online_acc")
STEP_LOG_EVERY = 25  # the CUDA loop's host-sync period, and steps.csv's: rows cost no extra sync
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; a cluster scheduler's preemption notice


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
        out = self.model(x, views=2)  # x: [view1; view2]
        return out, self.model.classifier(out.h.detach())


def wrap_for_training(
    model: ContrastiveModel, cfg: Config, world: distributed.World, forward: type[nn.Module] = TrainForward
) -> nn.Module:
    """``forward`` (:class:`TrainForward`; fine-tuning passes its own) around ``model``, inside DDP
    when there are several processes (DDP averages the gradients over ranks), compiled when
    ``train.compile``. ``model`` keeps owning the parameters: checkpoints and evaluation use it directly."""
    step_model: nn.Module = forward(model)
    if world.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ids = [world.device.index] if world.device.type == "cuda" else None
        step_model = DistributedDataParallel(step_model, device_ids=ids)
    if cfg.train.compile:
        step_model = torch.compile(step_model)
    return step_model


def forward_loss(
    step_model: nn.Module, x1: Tensor, x2: Tensor, y: Tensor, method: MethodConfig, *, autocast: Any = None,
    channels_last: bool = False, index: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """This process's loss on one batch, and the batch's (6,) detached statistics (:data:`STATS`).

    x1, x2: (n, C, S, S) the two views of n images; y: (n,) labels, used by the online probe only.
    The loss is InfoNCE + λ·KL over the 2n local rows (under DDP the negatives are gathered from
    every rank, see :func:`bayesncl.core.model.contrastive_loss`) plus the probe's cross-entropy on
    sg(h). Each term is a mean over local rows, so DDP's gradient average is the global mean.
    index: (n,) dataset indices: the views of one image are all positives (a repeated image).
    """
    x = torch.cat([x1, x2])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with autocast if autocast is not None else nullcontext():
        out, logits_cls = step_model(x)
    loss, parts = contrastive_loss(out, method, index=index)
    yy = torch.cat([y, y])
    probe_loss = nn.functional.cross_entropy(logits_cls.float(), yy)
    with torch.no_grad():
        stats = step_stats(loss, parts, out.mask, logits_cls, yy)
    return loss + probe_loss, stats


def train_step(
    step_model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, *args: Any,
    **kwargs: Any,
) -> Tensor:
    """:func:`forward_loss` (``args``, ``kwargs``: its ``x1, x2, y, method`` and keywords; or
    ``loss_fn=`` with the same signature), backward, optimiser step. Returns the (6,) statistics, on
    the device: nothing here waits for the device (fp16's GradScaler does, once per step, to skip inf
    steps; bf16 and fp32 need no scaler)."""
    loss_fn = kwargs.pop("loss_fn", None) or forward_loss
    loss, stats = loss_fn(step_model, *args, **kwargs)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return stats


def prefetch_to_device(batches: Iterable[B], device: torch.device) -> Iterator[B]:
    """Iterate ``batches``, producing each one on a side CUDA stream while the step before it runs
    (a plain pass-through on the CPU).

    kornia draws its random parameters on the CPU and copies them to the GPU, each copy waiting for
    its stream: on the main stream that wait would include the whole previous step. On a side stream
    the GPU runs step t while the CPU prepares batch t+1; the main stream waits for the side stream
    before using a batch, whose tensors are marked used there (``record_stream``).
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
    loss: Tensor, parts: dict[str, Tensor], mask: Tensor | None, class_logits: Tensor, y: Tensor
) -> Tensor:
    """(6,) tensor in :data:`STATS` order: loss, InfoNCE, KL, gate-open rate, fraction of rows with
    every gate closed, online-probe accuracy. Stays on the device: no host sync inside the step."""
    one = torch.ones((), device=loss.device)
    open_rate = mask.float().mean() if mask is not None else one
    closed = (mask.sum(1) == 0).float().mean() if mask is not None else 0 * one
    correct = (class_logits.argmax(1) == y).float().mean()
    return torch.stack([loss.detach(), parts["info_nce"], parts["kl"], open_rate, closed, correct])


# ----------------------------------------------------------------------------- one epoch
@dataclass
class Training:
    """What every step of a run uses, built once by ``app.train``."""

    step_model: nn.Module  # :func:`wrap_for_training`'s
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    method: MethodConfig
    schedule: LrSchedule  # every group's rate at each step, from its peak_lr (core.optim.param_groups)
    device: torch.device
    distributed: bool  # several processes: a stop is decided at a host sync, by all together
    autocast: Any = None
    channels_last: bool = False
    # the step's loss and (6,) statistics in STATS order: None is forward_loss (pretraining);
    # app.finetune passes its cross-entropy
    loss_fn: Callable[..., tuple[Tensor, Tensor]] | None = None


@dataclass
class EpochResult:
    """One epoch of :func:`train_one_epoch`."""

    stats: dict[str, float]  # :data:`STATS` means over the epoch's steps and processes ({} if stopped)
    step: int  # optimiser steps of the run done after it
    lr: float  # its last step's learning rate
    seconds: float  # its training time (a resumed epoch: with the time before its stop)
    stop_signal: int | None = None  # a stop was asked for: the epoch ended early, see ``partial``
    # then, what a mid-epoch checkpoint keeps to resume it: {"n_seen": steps done, "sums": (6,) sums
    # of the step statistics (means over processes, CPU), "elapsed": seconds, "window": (running
    # means, n_seen) at the epoch's last step-log row}
    partial: dict[str, Any] | None = None


def train_one_epoch(
    t: Training, batches: Iterable[tuple[Tensor, Tensor, Tensor]], *, epoch: int, step: int,
    steps_per_epoch: int, partial: dict[str, Any] | None = None,
    stop_requested: Callable[[], int | None] = lambda: None,
    on_sync: Callable[[int, dict[str, float]], None] | None = None,
    on_step_log: Callable[[int, dict[str, float], float], None] | None = None, kept: str = "",
) -> EpochResult:
    """Train over ``batches`` (this process's (x1, x2, y) of epoch ``epoch``, 0-based), from the
    run's optimiser step ``step``, or from inside the epoch where ``partial`` (an earlier
    :attr:`EpochResult.partial`) stopped.

    The one host sync (every step on the CPU, every :data:`STEP_LOG_EVERY` steps and at the epoch's
    end on CUDA) averages the running means over processes, with the stop signal any process got
    (``stop_requested()``: this one's, or None); it calls ``on_sync(step, running means)`` and, every
    STEP_LOG_EVERY steps, ``on_step_log(step, means since the previous row, lr)``. A stop ends the
    epoch after the current step (several processes: after the same one, at a sync).
    Raises TrainingError on a non-finite loss (its message ends with ``kept``).
    """
    n_seen = partial["n_seen"] if partial else 0
    start = time.time() - (partial["elapsed"] if partial else 0.0)
    sums = partial["sums"].to(t.device) if partial else torch.zeros(len(STATS), device=t.device)
    window = partial["window"] if partial else ([0.0] * len(STATS), 0)  # at the last steps.csv row
    peak = t.optimizer.param_groups[0]["peak_lr"]  # the encoder's, the rate logged
    lr = t.schedule.at(max(step - 1, 0), peak) if t.schedule.total_steps else 0.0  # a stop after an epoch
    stop_signal = None
    t.step_model.train()
    for x1, x2, y in prefetch_to_device(batches, t.device):
        lr = t.schedule.apply(t.optimizer, step)
        stats = train_step(
            t.step_model, t.optimizer, t.scaler, x1, x2, y, t.method,
            autocast=t.autocast, channels_last=t.channels_last, loss_fn=t.loss_fn,
        )
        sums += stats
        n_seen += 1
        step += 1
        if t.device.type == "cpu" or step % STEP_LOG_EVERY == 0 or n_seen == steps_per_epoch:
            means, stop_signal = _global_means(sums / n_seen, stop_requested())
            if not math.isfinite(means[0]):
                raise TrainingError(
                    # CPU checks every step; CUDA every STEP_LOG_EVERY steps (no per-step host sync)
                    f"non-finite loss {'at' if t.device.type == 'cpu' else 'detected by'} step {step} "
                    f"(epoch {epoch + 1}): InfoNCE={float(stats[1]):.4g}, KL={float(stats[2]):.4g}; {kept}"
                )
            if on_sync is not None:
                on_sync(step, dict(zip(STATS, means, strict=True)))
            if step % STEP_LOG_EVERY == 0:
                base, n0 = window
                since = [(a * n_seen - b * n0) / (n_seen - n0) for a, b in zip(means, base, strict=True)]
                if on_step_log is not None:
                    on_step_log(step, dict(zip(STATS, since, strict=True)), lr)
                window = (means, n_seen)
        if stop_signal is not None or (stop_requested() is not None and not t.distributed):
            stop_signal = stop_signal or stop_requested() or signal.SIGINT
            sums = distributed.all_reduce_mean(sums.clone()).cpu()  # every rank's share
            partial = {"n_seen": n_seen, "sums": sums, "elapsed": time.time() - start, "window": window}
            return EpochResult({}, step, lr, time.time() - start, stop_signal, partial)
    means, _ = _global_means(sums / max(n_seen, 1), None)
    return EpochResult(dict(zip(STATS, means, strict=True)), step, lr, time.time() - start)


def _global_means(local_means: Tensor, signum: int | None) -> tuple[list[float], int | None]:
    """The loop's host sync point: the running means averaged over processes (every rank gets the
    same numbers, so a non-finite loss stops every rank) and the stop signal any process received
    (``signum``: this one's, or None): SIGTERM if any got one (a preemption), else SIGINT, else None."""
    flags = torch.tensor([float(signum == s) for s in STOP_SIGNALS], device=local_means.device)
    values = distributed.all_reduce_mean(torch.cat([local_means, flags])).tolist()
    received = [s for s, v in zip(STOP_SIGNALS, values[-len(flags):], strict=True) if v > 0]
    return values[: -len(flags)], max(received, default=None)


def first_non_finite(model: nn.Module, rank: int = 0) -> str | None:
    """The name of a floating-point parameter or buffer of ``model`` holding NaN or inf on any
    process (a collective under DDP), or None. Checked at each epoch's end, before the checkpoint:
    a diverged BatchNorm running variance leaves the training loss finite (training mode uses the
    batch's statistics) but makes every evaluation feature constant. One host sync."""
    tensors = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    if not tensors:
        return None
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()]).all()
    bad_here = (~finite).float().reshape(1)
    if float(distributed.all_reduce_mean(bad_here)[0]) == 0:
        return None
    names = [k for k, v in tensors.items() if not bool(torch.isfinite(v).all())]
    return names[0] if names else f"a tensor of another process than rank {rank}"
