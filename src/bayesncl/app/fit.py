"""The training loop of ``pretrain`` and ``finetune``: :func:`fit`, one function in DINO's shape
(``main_dino.py``'s banner sections), read top to bottom.

A :class:`Job` holds what differs between the two (the model, the step's loss and statistics, the
parameter groups, the schedule, the loader's options, the held-out monitor); :func:`fit` sets up the
precision, data, model, optimiser and schedule, restores the run dir's checkpoint, then trains epoch by
epoch and after each one checks the weights, logs its row and saves it (``RunDir.save``: last.pt,
then log.csv and steps.csv). The step and the epoch are ``core.engine``'s (no disk, no screen there);
the run dir, checkpoints and logs ``runs``'. At the end, :func:`export_trained` draws the run's curves and
exports its encoder. docs/architecture.md, "The loop".
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bayesncl.app.heldout import HeldOut
from bayesncl.config import Config
from bayesncl.core import distributed
from bayesncl.core.engine import (
    EpochResult,
    Hooks,
    LossFn,
    TrainForward,
    Training,
    TrainingError,
    compiled_loss,
    first_non_finite,
    train_one_epoch,
    wrap_for_training,
)
from bayesncl.core.methods import LossTerm, Statistic
from bayesncl.core.model import ContrastiveModel
from bayesncl.core.optim import LrSchedule, Precision, StepSchedule, build_optimizer, precision_plan
from bayesncl.data import build_train_loader
from bayesncl.runs.logs import epoch_row, log_columns, step_row
from bayesncl.runs.rundir import RunDir
from bayesncl.runs.state import TrainState, seed_everything

OnSync = Callable[[int, dict[str, float]], None]
"""A host-sync hook: (optimiser steps done, the epoch's running means by name)."""


@dataclass(frozen=True)
class Job:
    """What a run of :func:`fit` trains and logs: where pretraining (``app.train``) and fine-tuning
    (``app.finetune``) differ. Each callable is called once, by :func:`fit`, in its section."""

    name: str  # in the progress bar and the epoch line: "ncl", "finetune ncl"
    stats: tuple[Statistic, ...]  # what loss_fn's statistics are, in order: log.csv's and steps.csv's columns
    build_model: Callable[[], ContrastiveModel]  # the model to train (on the CPU), after the seeds are set
    param_groups: Callable[[ContrastiveModel], list[dict[str, Any]]]  # the optimiser's (core.optim)
    schedule: Callable[[int], LrSchedule | StepSchedule]  # the lr schedule, from the steps per epoch
    make_loss_fn: Callable[[Any, bool], LossFn]  # (autocast or None, channels_last) -> the step's loss
    forward: type[nn.Module] = TrainForward  # what DDP wraps around the model (core.engine)
    terms: tuple[LossTerm, ...] = ()  # the loss terms a non-finite loss's message names
    loader_options: Mapping[str, Any] = field(default_factory=dict)  # build_train_loader's other keywords
    heldout: HeldOut | None = None  # rank 0: the batch scored at a monitored epoch's end (heldout_*)
    heldout_columns: tuple[str, ...] = ()  # its log.csv columns (runs.logs.heldout_fields)
    # rank 0, before the first step: (first step, total steps) -> an on_sync hook or None (pretraining:
    # the projected time, or the CPU time warning)
    on_start: Callable[[int, int], OnSync | None] | None = None


@dataclass(slots=True)
class Progress:
    """The progress bar of a run's epochs: on rank 0 with ``train.progress``, a tqdm bar over each
    epoch's batches (erased at its end) whose postfix is the running means of the statistics with a
    ``short`` name; elsewhere the batches as they are."""

    name: str  # "ncl epoch 2/3"'s "ncl"
    epochs: int  # train.epochs
    stats: tuple[Statistic, ...]
    enabled: bool
    bar: Any = None  # the current epoch's tqdm bar; None before the first epoch or when not enabled

    def epoch(self, loader: Any, epoch: int, initial: int = 0) -> Iterable[Any]:
        """The batches of ``epoch`` (0-based), ``initial`` of them already done (a resumed epoch)."""
        if not self.enabled:
            return loader
        from tqdm.auto import tqdm

        desc = f"{self.name} epoch {epoch + 1}/{self.epochs}"
        self.bar = tqdm(loader, desc=desc, initial=initial, total=len(loader), leave=False,
                        dynamic_ncols=True)  # fmt: skip
        return self.bar

    def show(self, means: dict[str, float]) -> None:
        """The running ``means`` (by statistic name) on the bar, drawn at its next refresh (tqdm's
        ``mininterval``) beside the batches done then: a redraw now would show tqdm's count of its
        last refresh (``0/12`` after several steps), and write the terminal at every CPU step."""
        if self.bar is not None:
            self.bar.set_postfix(shown(self.stats, means, digits=3), refresh=False)


def fit(cfg: Config, run: RunDir, job: Job) -> ContrastiveModel:
    """Train ``job`` as ``cfg`` says in ``run`` (a RunDir, entered), from its checkpoint if any, to
    ``train.epochs``; returns the trained model (on the run's device). Every process calls it (DDP).

    Raises TrainingError (one line, naming the checkpoint kept) on a non-finite loss or weights;
    TrainingInterrupted after Ctrl-C or SIGTERM (the state saved to last.pt, mid-epoch included)."""
    world = run.world
    device = world.device

    # ============ precision and seeds ... ============
    precision = run_precision(cfg, run)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick the fastest kernels
    seed_everything(distributed.rank_seed(cfg.seed, world.rank))

    # ============ preparing data ... ============
    # this rank's shard; the order and augmentation a function of (seed, epoch, rank, step)
    loader = build_train_loader(
        cfg.data, cfg.train.batch_size, seed=cfg.seed, device=device, rank=world.rank,
        world_size=world.world_size, **job.loader_options,
    )
    if world.is_main and loader.note:
        print(f"data: {loader.note}", flush=True)

    # ============ building the model ... ============
    model = distributed.convert_sync_bn(job.build_model().to(device), cfg.train.sync_bn, world)
    if precision.channels_last:
        model = model.to(memory_format=torch.channels_last)

    # ============ preparing the optimizer and the schedule ... ============
    optimizer = build_optimizer(job.param_groups(model), cfg)  # peak lrs scaled by the global batch
    scaler = torch.amp.GradScaler(device.type, enabled=precision.dtype == torch.float16)
    schedule = job.schedule(len(loader))  # every group's rate at every step

    # ============ resuming from a checkpoint, taking the run dir ... ============
    state = run.restore(model, optimizer, scaler, len(loader))
    run.claim(state, log_columns(job.stats, job.heldout_columns))

    # ============ preparing the step ... ============
    autocast = torch.autocast(device.type, dtype=precision.dtype) if precision.dtype is not None else None
    training = Training(
        wrap_for_training(model, cfg, world, job.forward), optimizer, scaler,
        compiled_loss(cfg, world, job.make_loss_fn(autocast, precision.channels_last)), schedule, device,
        world.distributed, job.terms,
    )
    progress = Progress(job.name, cfg.train.epochs, job.stats, cfg.train.progress and world.is_main)
    timing = job.on_start(state.step, schedule.total_steps) if job.on_start and world.is_main else None

    def on_sync(step: int, means: dict[str, float]) -> None:
        progress.show(means)
        if timing is not None:
            timing(step, means)

    def on_step_log(step: int, means: dict[str, float], lr: float) -> None:
        row = step_row(step, state.steps_per_epoch, job.stats, means, lr)
        state.step_log.append(row)

    hooks = Hooks(stop_requested=lambda: run.stop_signal, on_sync=on_sync, on_step_log=on_step_log)

    # ============ training ... ============
    first_epoch, started = state.epoch, time.time()
    for epoch in range(state.epoch, cfg.train.epochs):
        cursor, state.cursor = state.cursor, None  # a stopped epoch goes on from its cursor
        done_before = cursor.n_seen if cursor else 0
        loader.set_epoch(epoch, start_step=done_before)
        try:
            result = train_one_epoch(
                training, progress.epoch(loader, epoch, done_before), epoch=epoch, step=state.step,
                steps_per_epoch=state.steps_per_epoch, cursor=cursor, hooks=hooks,
            )
        except TrainingError as e:
            raise TrainingError(f"{e}; {run.kept()}") from None
        state.step = result.step
        if result.stop_signal is not None:  # Ctrl-C or SIGTERM inside the epoch
            run.save_mid_epoch(state, result)  # last.pt with the cursor, then TrainingInterrupted

        per_epoch = (time.time() - started) / (epoch + 1 - first_epoch)
        _end_epoch(cfg, run, job, model, state, result, epoch + 1, per_epoch)
    run.finish()
    return model


def _end_epoch(
    cfg: Config, run: RunDir, job: Job, model: ContrastiveModel, state: TrainState, result: EpochResult,
    done: int, per_epoch: float,
) -> None:
    """The end of epoch ``done`` (1-based; ``result``: its EpochResult): check the weights, log its row
    (with the held-out batch's measures at a monitored epoch), print its line on rank 0 (``per_epoch``:
    the mean time of this launch's epochs, for the ETA), then save (``RunDir.save``: last.pt, then
    log.csv and steps.csv, and epoch-NNNN.pt every ``train.checkpoint_every``)."""
    _check_weights(model, cfg, run, done, state.step)
    row = epoch_row(done, state.step, job.stats, result.stats, cfg.method, result.lr, result.seconds)
    monitored = done % cfg.train.monitor_every == 0 or done == cfg.train.epochs
    if job.heldout is not None and monitored:
        row.update(job.heldout.measure(model, run.world.device))
    state.log.append(row)
    if run.world.is_main:
        _alarms(job.stats, result.stats)
        line = epoch_line(job.name, cfg.train.epochs, done, job.stats, result.stats, result.seconds,
                          per_epoch)
        print(line, flush=True)
    state.epoch = done
    run.save(state)


def export_trained(model: ContrastiveModel, cfg: Config, run_dir: Path, label: str) -> None:
    """The end of a fit (rank 0; pretraining and fine-tuning): ``run_dir/training_curves.png`` of its
    log.csv, ``label`` in the legend, where the log has a row (one that cannot be drawn is a warning:
    a figure is not worth the export), then the encoder (``runs.export.export_encoder``)."""
    from bayesncl.app.report.curves import write_training_curves
    from bayesncl.runs.export import export_encoder
    from bayesncl.runs.messages import RunDirError

    if (run_dir / "log.csv").is_file():
        try:
            write_training_curves([run_dir], run_dir / "training_curves.png", labels=[label])
        except RunDirError as e:
            warnings.warn(f"no training curves: {e}", stacklevel=2)
    export_encoder(model, run_dir, cfg)


def run_precision(cfg: Config, run: RunDir) -> Precision:
    """The precision ``run`` (a RunDir, entered) trains in, said on rank 0 (``precision: ...``):
    ``train.precision`` and ``train.channels_last`` planned for the run's device
    (:func:`~bayesncl.core.optim.precision_plan`), or on ``--resume`` what the run trained in
    (:meth:`RunDir.precision`)."""
    precision = run.precision(precision_plan(cfg.train.precision, cfg.train.channels_last, run.world.device))
    if run.world.is_main:
        print(f"precision: {precision.why}", flush=True)
    return precision


def _check_weights(model: ContrastiveModel, cfg: Config, run: RunDir, epoch: int, step: int) -> None:
    """Raise TrainingError if weights or BatchNorm statistics diverged while the loss stayed finite
    (a collective under DDP; before the epoch's checkpoint)."""
    bad = first_non_finite(model, run.world.rank)
    if bad is not None:
        raise TrainingError(
            f"non-finite weights after epoch {epoch} (step {step}), although the loss stayed "
            f"finite: {bad} holds NaN or inf (the training diverged: lower train.base_lr="
            f"{cfg.train.base_lr:g}); " + run.kept("nothing was kept")
        )


# ----------------------------------------------------------------------------- what the user sees
def shown(stats: Sequence[Statistic], means: Mapping[str, float], digits: int = 2) -> dict[str, str]:
    """The statistics the progress bar and the epoch line show (``Statistic.short``), by short name,
    with ``digits`` decimals (a percent one: × 100, one decimal and ``%``)."""
    return {
        s.short: f"{100 * means[s.name]:.1f} %" if s.percent else f"{means[s.name]:.{digits}f}"
        for s in stats if s.short and s.name in means
    }


def _alarms(stats: Sequence[Statistic], means: Mapping[str, float]) -> None:
    """Print each statistic's alarm (``Statistic.alarm``) whose epoch mean is over its threshold."""
    for s in stats:
        if s.alarm is not None and means.get(s.name, 0.0) > s.alarm[0]:
            print("warning: " + s.alarm[1].format(pct=100 * means[s.name]))


def epoch_line(
    name: str, epochs: int, done: int, stats: Sequence[Statistic], means: Mapping[str, float], seconds: float,
    per_epoch: float,
) -> str:
    """``ncl epoch 2/3: loss 5.43 InfoNCE 5.42 KL 8.86 open 0.04 | 32.1 s, ETA 0:01:05`` (``done``: 2;
    ``seconds``: the epoch's training time; ``per_epoch``: the mean time of this launch's epochs)."""
    values = " ".join(f"{k} {v}" for k, v in shown(stats, means).items())
    eta = clock(per_epoch * (epochs - done))
    return f"{name} epoch {done}/{epochs}: {values} | {seconds:.1f} s, ETA {eta}"


def clock(seconds: float) -> str:
    """``h:mm:ss``."""
    m, s = divmod(round(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"
