"""``bayesncl pretrain``: train (:func:`train`, readable top to bottom, DINO's style), then evaluate.

:func:`pretrain` checks the config and the data, takes the run dir (``runs.rundir.RunDir``), trains
with LARS and a per-iteration warmup-cosine schedule, checkpointing atomically every epoch, exports
the encoder, and finally evaluates the test split (``app.evaluate``). Under ``torchrun`` the same
function runs in every process, with DDP (``bayesncl.core.distributed``, docs/scaling.md); rank 0
alone writes the run dir (its layout: README, ``runs.rundir``) and prints.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bayesncl.app.errors import out_of_memory
from bayesncl.app.heldout import build_heldout
from bayesncl.app.report.curves import write_training_curves
from bayesncl.config import Config, ConfigError, eval_data
from bayesncl.core import distributed, methods
from bayesncl.core.engine import (
    EpochResult,
    Hooks,
    Training,
    TrainingError,
    compiled_loss,
    first_non_finite,
    train_one_epoch,
    wrap_for_training,
)
from bayesncl.core.model import ContrastiveModel, build_model
from bayesncl.core.optim import (
    LrSchedule,
    Precision,
    build_optimizer,
    param_groups,
    peak_lrs,
    precision_plan,
)
from bayesncl.data import DataError, DatasetInfo, build_train_loader, dataset_info
from bayesncl.data.loaders import check_batch_size
from bayesncl.runs.export import export_encoder
from bayesncl.runs.loggers import require as require_loggers
from bayesncl.runs.logs import epoch_row, step_row
from bayesncl.runs.messages import RunDirError, TrainingInterrupted
from bayesncl.runs.rundir import RunDir
from bayesncl.runs.state import TrainState, seed_everything

CPU_WARN_AFTER_S = 3600  # a CPU run estimated to take longer is told about the CPU recipe


def pretrain(
    cfg: Config, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, evaluate: bool = True,
) -> dict[str, Any]:
    """Pretrain the method ``cfg`` describes into ``run_dir`` and (``evaluate``) evaluate it on the
    test split; returns the final metrics (also in ``run_dir/metrics.json``), {} without evaluation.
    Data without labels and no ``eval.data.*``: it trains, then prints how to evaluate instead.

    Raises ConfigError / DataError / RunDirError before writing anything when the input is bad;
    TrainingError if the loss becomes non-finite (the last good checkpoint is kept);
    TrainingInterrupted after Ctrl-C or SIGTERM (a resumable last.pt is saved). Under ``torchrun``
    every process calls it (docs/scaling.md); only rank 0 writes, prints and evaluates (others: {}).
    """
    started = time.time()
    world = distributed.setup(cfg.train.device)
    try:
        facts, skipped = run_facts(cfg, world, run_dir, evaluate=evaluate)
        check_batch_size(cfg.train.batch_size, facts.data.num_train, facts.data.name, world.world_size)
        with RunDir(run_dir, cfg, world, resume=resume, overwrite=overwrite) as run:
            model = train(cfg, run, facts)
            evaluated = facts.eval_data is not None and world.is_main
            metrics = _evaluate(model, cfg, run.path, world.device, facts.eval_data) if evaluated else {}
            run.log_results(metrics)
        if world.is_main:
            _report_written(run.path, time.time() - started)
            if skipped is not None:
                print(skipped, flush=True)
        return metrics
    finally:
        world.close()


@dataclass(frozen=True)
class RunFacts:
    """What a run derives from its config and its data, computed once (:func:`run_facts`) and
    passed to whoever needs it."""

    data: DatasetInfo  # the training data's
    eval_data: DatasetInfo | None  # the data the end-of-training evaluation reads; None: no evaluation
    peak_lrs: dict[str, float]  # each part's peak learning rate (core.optim.peak_lrs)
    steps_per_epoch: int  # this process's batches per epoch (the train loader's len)


def run_facts(
    cfg: Config, world: distributed.World, run_dir: str | Path, *, evaluate: bool
) -> tuple[RunFacts, str | None]:
    """The run's :class:`RunFacts`, refusing before the run dir is looked at what cannot train or be
    evaluated; and, for data without labels and no ``eval.data.*``, the line printed instead of the
    evaluation (then ``eval_data`` is None)."""
    from bayesncl.app.evaldata import check_eval_data, no_labels_note

    distributed.check_sync_bn(cfg.train.sync_bn, world)
    if world.is_main:
        require_loggers(cfg.train.loggers)  # a missing package: one line, before the run dir is touched
    global_batch = cfg.train.batch_size * world.world_size
    peaks = peak_lrs(cfg, global_batch)
    if cfg.train.min_lr > peaks["encoder"]:  # the cosine "decay" would raise the rate to min_lr
        raise ConfigError(
            f"train.min_lr={cfg.train.min_lr:g}: expected <= the peak learning rate {peaks['encoder']:g} "
            f"(train.base_lr={cfg.train.base_lr:g} x global batch {global_batch} / 256), or the schedule "
            "would rise to it"
        )
    info = distributed.local_main_first(world, lambda: dataset_info(cfg.data))  # one download per node
    if methods.get(cfg.method.name).needs_labels and not info.labeled:
        raise DataError(f"method.name={cfg.method.name} learns from labels: {cfg.data.name} has none here")
    steps = info.num_train // world.world_size // cfg.train.batch_size
    if not evaluate:
        return RunFacts(info, None, peaks, steps), None
    # the labelled data the end-of-training evaluation reads (eval.data.*, issue 17)
    e = eval_data(cfg)
    test_info = info if e == cfg.data else distributed.local_main_first(world, lambda: dataset_info(e))
    skipped = no_labels_note(cfg, run_dir, test_info)
    if skipped is not None:
        return RunFacts(info, None, peaks, steps), skipped
    check_eval_data(cfg, info, test_info)
    if cfg.eval.probe == "fast" and test_info.num_classes < 2:
        raise DataError(
            f"{cfg.data.name} has {info.num_classes} class: the end-of-training linear probe needs >= 2; "
            "pass --no-eval (evaluate=False in Python) or eval.probe=none"
        )
    if cfg.eval.probe == "fast" and max(test_info.train_class_counts, default=2) < 2:
        # the probe holds out one image of a class to choose its L2 strength: refused before training
        k = cfg.data.train_subset
        subset = f"data.train_subset={k} leaves" if k else "there are"
        raise DataError(
            f"{subset} {info.num_train} training images of {cfg.data.name}, at most one per class: the "
            "end-of-training linear probe needs a class with >= 2 (it holds some out to choose its L2 "
            f"strength); {'raise data.train_subset' if k else 'add images'}, or pass --no-eval "
            "(evaluate=False in Python) or eval.probe=none"
        )
    return RunFacts(info, test_info, peaks, steps), None


def _no_probe(row: dict[str, Any], info: DatasetInfo, cfg: Config) -> dict[str, Any]:
    """``row`` with the statistics that need labels (the online probe's) empty where the data has none."""
    if info.labeled:
        return row
    blank = [s.name for s in methods.get(cfg.method.name).stats if s.needs_labels and s.name in row]
    return {**row, **dict.fromkeys(blank, "")}


class _TrainHooks(Hooks):
    """The loop's hooks in a run: the run dir's stop signal, the step log, the progress bar's means
    and (rank 0, CPU) the time warning."""

    def __init__(self, cfg: Config, run: RunDir, state: TrainState, info: DatasetInfo, warn: Any) -> None:
        self.cfg, self.run, self.state, self.info, self.warn, self.bar = cfg, run, state, info, warn, None

    def stop_requested(self) -> int | None:
        return self.run.stop_signal

    def on_sync(self, step: int, means: dict[str, float]) -> None:
        if hasattr(self.bar, "set_postfix"):
            self.bar.set_postfix({k: f"{v:.3f}" for k, v in _shown(self.cfg, means).items()})
        if self.warn is not None:
            self.warn(step, means)

    def on_step_log(self, step: int, means: dict[str, float], lr: float) -> None:
        row = step_row(step, self.state.steps_per_epoch, methods.get(self.cfg.method.name).stats, means, lr)
        self.state.step_log.append(_no_probe(row, self.info, self.cfg))


def run_precision(cfg: Config, run: RunDir) -> Precision:
    """The precision ``run`` (a RunDir, entered) trains in, said on rank 0 (``precision: ...``):
    ``train.precision`` and ``train.channels_last`` planned for the run's device
    (:func:`~bayesncl.core.optim.precision_plan`), or on ``--resume`` what the run trained in
    (:meth:`RunDir.precision`). Pretraining's and fine-tuning's."""
    precision = run.precision(precision_plan(cfg.train.precision, cfg.train.channels_last, run.world.device))
    if run.world.is_main:
        print(f"precision: {precision.why}", flush=True)
    return precision


def train(cfg: Config, run: RunDir, facts: RunFacts) -> ContrastiveModel:
    """Train ``cfg`` in ``run`` (entered) from its checkpoint, if any, to ``train.epochs``; rank 0
    then draws the curves and exports the encoder. Returns the trained model."""
    world = run.world
    device = world.device
    precision = run_precision(cfg, run)
    amp_dtype = precision.dtype
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick the fastest kernels

    # data: this rank's shard; augmentation seeded by (seed, epoch, rank, step)
    seed_everything(distributed.rank_seed(cfg.seed, world.rank))
    info, steps_per_epoch = facts.data, facts.steps_per_epoch
    loader = build_train_loader(
        cfg.data, cfg.train.batch_size, seed=cfg.seed, device=device,
        rank=world.rank, world_size=world.world_size, info=info,
    )
    if world.is_main and loader.note:
        print(f"data: {loader.note}", flush=True)
    # rank 0: the held-out batch scored at each epoch's end (log.csv's heldout_*; no RNG draw)
    heldout = build_heldout(cfg, info) if world.is_main else None
    # model, optimiser (LARS) and schedule: lr scaled by the global batch, warmup then cosine per step
    model, optimizer, scaler = _model_and_optimizer(cfg, world, facts, amp_dtype, precision.channels_last)
    schedule = LrSchedule(
        cfg.train.epochs * steps_per_epoch, round(cfg.train.warmup_epochs * steps_per_epoch),
        start=cfg.train.warmup_start_lr, final=cfg.train.min_lr,
    )
    # restore, then take the run dir (fresh run, or a resume that may have extended train.epochs)
    state = run.restore(model, optimizer, scaler, steps_per_epoch)
    run.claim(state)

    training = Training(
        wrap_for_training(model, cfg, world), optimizer, scaler, cfg.method, schedule, device,
        world.distributed, torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else None,
        precision.channels_last, info.labeled, compiled_loss(cfg, world),
    )
    # one process only: the timing's own steps gather negatives from every process when there are several
    projected = world.is_main and not world.distributed and _project_time(
        cfg, device, state.step, schedule.total_steps
    )
    warn = None if projected or not world.is_main else _cpu_time_warning(
        cfg, device, state.step, schedule.total_steps
    )
    hooks = _TrainHooks(cfg, run, state, info, warn)
    stats = methods.get(cfg.method.name).stats

    launch_epochs, launch_start = state.epoch, time.time()
    for epoch, result in epochs(training, loader, cfg, run, state, hooks):
        _check_weights(model, cfg, run, epoch + 1, state.step)
        row = epoch_row(epoch + 1, state.step, stats, result.stats, cfg.method, result.lr, result.seconds)
        monitored = (epoch + 1) % cfg.train.monitor_every == 0 or epoch + 1 == cfg.train.epochs
        if heldout is not None and monitored:
            row.update(heldout.measure(model, device))
        state.log.append(_no_probe(row, info, cfg))
        if world.is_main:
            _alarms(cfg, result.stats)
            per_epoch = (time.time() - launch_start) / (epoch + 1 - launch_epochs)
            print(_epoch_line(cfg, epoch + 1, result, per_epoch), flush=True)
    if world.is_main:
        _export(model, cfg, run.path, drawn=bool(state.log))
    return model


def epochs(
    training: Training, loader: Any, cfg: Config, run: RunDir, state: TrainState, hooks: Any
) -> Iterator[tuple[int, EpochResult]]:
    """The loop of ``pretrain`` and ``finetune``: each epoch left of ``train.epochs`` in ``run``
    (entered) trained by :func:`train_one_epoch` from ``state`` (a stopped epoch goes on from its
    cursor, a stop signal saves it mid-epoch), yielded as ``(epoch, result)`` for the caller to log
    into ``state.log``, then checkpointed; ``run.finish()`` after the last. ``hooks.bar`` is set to
    each epoch's progress bar."""
    for epoch in range(state.epoch, cfg.train.epochs):
        cursor, state.cursor = state.cursor, None
        first = cursor.n_seen if cursor else 0
        loader.set_epoch(epoch, start_step=first)
        hooks.bar = bar = _progress(loader, epoch, cfg, run.world, initial=first)
        try:
            result = train_one_epoch(
                training, bar, epoch=epoch, step=state.step, steps_per_epoch=state.steps_per_epoch,
                cursor=cursor, hooks=hooks,
            )
        except TrainingError as e:
            raise TrainingError(f"{e}; {run.kept()}") from None
        state.step = result.step
        if result.stop_signal is not None:
            run.save_mid_epoch(state, result)
        yield epoch, result
        state.epoch = epoch + 1
        run.save(state)
    run.finish()


def _export(model: ContrastiveModel, cfg: Config, run_dir: Path, *, drawn: bool) -> None:
    """The end of training: ``training_curves.png`` (``drawn``: log.csv has a row), the encoder."""
    if drawn:
        try:
            write_training_curves([run_dir], run_dir / "training_curves.png", labels=[cfg.method.name])
        except RunDirError as e:  # a figure is not worth the export and the evaluation
            warnings.warn(f"no training curves: {e}", stacklevel=2)
    export_encoder(model, run_dir, cfg)


def _model_and_optimizer(
    cfg: Config, world: distributed.World, facts: RunFacts, amp_dtype: torch.dtype | None,
    channels_last: bool,
) -> tuple[ContrastiveModel, torch.optim.Optimizer, torch.amp.GradScaler]:
    info = facts.data
    model = build_model(cfg, info.channels, info.image_size, info.num_classes).to(world.device)
    model = distributed.convert_sync_bn(model, cfg.train.sync_bn, world)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(param_groups(model, cfg, facts.peak_lrs), cfg)
    scaler = torch.amp.GradScaler(world.device.type, enabled=amp_dtype == torch.float16)
    return model, optimizer, scaler


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


def _evaluate(
    model: ContrastiveModel, cfg: Config, run_dir: Path, device: torch.device, info: DatasetInfo
) -> dict[str, Any]:
    """The end-of-training evaluation (``app.evaluate``); a Ctrl-C or an out-of-memory here says
    that training is complete and how to evaluate it again."""
    from bayesncl.app.evaluate import evaluate_model

    try:
        return evaluate_model(model, cfg, run_dir, device=device, info=info)
    except KeyboardInterrupt:
        raise TrainingInterrupted(
            f"stopped during the end-of-training evaluation; training is complete ({run_dir / 'last.pt'}): "
            f"`bayesncl evaluate {run_dir}` evaluates it"
        ) from None
    except Exception as e:
        oom = out_of_memory(e, "evaluate")  # eval.batch_size, not the training settings, decides it
        if oom is None:
            raise
        raise TrainingError(
            f"{oom}, in the end-of-training evaluation; training is complete ({run_dir / 'last.pt'}): "
            f"`bayesncl evaluate {run_dir} eval.batch_size=N` evaluates it"
        ) from None


# ----------------------------------------------------------------------------- what the user sees
def _progress(loader: Any, epoch: int, cfg: Config, world: distributed.World, initial: int = 0) -> Any:
    """The epoch's batches, under a tqdm bar on rank 0 when ``train.progress`` (erased at its end)."""
    if not cfg.train.progress or not world.is_main:
        return loader
    from tqdm.auto import tqdm

    desc = f"{cfg.method.name} epoch {epoch + 1}/{cfg.train.epochs}"
    return tqdm(loader, desc=desc, initial=initial, total=len(loader), leave=False, dynamic_ncols=True)


def _shown(cfg: Config, means: dict[str, float]) -> dict[str, float]:
    """The logged statistics the progress bar and the epoch line show (``Statistic.short``), by short
    name (a gate's only with one: a run without a gate does not log them); a ``percent`` one × 100, as
    log.csv has it."""
    return {s.short: 100 * means[s.name] if s.percent else means[s.name]
            for s in methods.get(cfg.method.name).stats if s.short and s.name in means}


def _alarms(cfg: Config, means: dict[str, float]) -> None:
    """Print each statistic's alarm (``Statistic.alarm``) whose epoch mean is over its threshold."""
    for s in methods.get(cfg.method.name).stats:
        if s.alarm is not None and means.get(s.name, 0.0) > s.alarm[0]:
            print("warning: " + s.alarm[1].format(pct=100 * means[s.name]))


def _project_time(cfg: Config, device: torch.device, first_step: int, total_steps: int) -> bool:
    """On the CPU with ``train.progress``, before the first step: time 2 training steps of ``cfg``
    (after a warm-up step, :func:`bayesncl.app.timing.images_per_second`, the estimator of
    ``reproduce``'s plan, on a model and loader of its own, every RNG state put back) and print the
    projected time of the steps left; where that exceeds :data:`CPU_WARN_AFTER_S`, a second line
    names the CPU recipes. Returns whether it printed (False elsewhere, under ``train.compile``, or with
    nothing left to train; these keep :func:`_cpu_time_warning`'s check after its 3rd step)."""
    left = total_steps - first_step
    from bayesncl.core.engine import compile_plan

    if device.type != "cpu" or not cfg.train.progress or compile_plan(cfg.train.compile, device) or left <= 0:
        return False
    from bayesncl.app.timing import images_per_second
    from bayesncl.runs.state import rng_state, set_rng_state

    saved = rng_state()
    try:
        per_step = cfg.train.batch_size / images_per_second(cfg, steps=2)
    finally:
        set_rng_state(saved)
    seconds = per_step * left
    print(f"projected training time: {_clock(seconds)} (h:mm:ss) for {left:,} steps of {cfg.train.epochs} "
          f"epochs at {per_step:.2f} s a step (timed here on 2 steps; the end-of-training evaluation "
          "comes after it)", flush=True)
    if seconds > CPU_WARN_AFTER_S:
        print("hint: this recipe is sized for a GPU (train.device=cuda); on a CPU use --config "
              "fashion-mnist-demo (minutes) or --config fashion-mnist-long (the long CPU recipe)", flush=True)
    return True


def _cpu_time_warning(
    cfg: Config, device: torch.device, first_step: int, total_steps: int
) -> Callable[[int, dict[str, float]], None] | None:
    """On the CPU, an ``on_sync`` that times the first 3 steps and warns once if the steps left
    would take over :data:`CPU_WARN_AFTER_S` at that rate (the 200-epoch CIFAR recipe: days)."""
    if device.type != "cpu":
        return None
    start, checked = time.time(), False

    def check(step: int, means: dict[str, float]) -> None:
        nonlocal checked
        if checked or step - first_step < 3:
            return
        checked = True
        left = (time.time() - start) / (step - first_step) * (total_steps - step)
        if left > CPU_WARN_AFTER_S:
            warnings.warn(
                f"training on the CPU: the {total_steps - step} steps left take about {_clock(left)} "
                f"(h:mm:ss) at this rate ({cfg.train.epochs} epochs of {cfg.data.name}); for a run "
                "sized for a CPU use --config fashion-mnist-demo, or train on a GPU (train.device=cuda)",
                stacklevel=2,
            )

    return check


def _epoch_line(cfg: Config, done: int, result: EpochResult, per_epoch: float) -> str:
    """``ncl epoch 2/3: loss 5.43 InfoNCE 5.42 KL 8.86 open 0.04 | 32.1 s, ETA 0:01:05`` (``done``: 2)."""
    shown = " ".join(f"{k} {v:.2f}" for k, v in _shown(cfg, result.stats).items())
    eta = _clock(per_epoch * (cfg.train.epochs - done))
    where = f"{cfg.method.name} epoch {done}/{cfg.train.epochs}"
    return f"{where}: {shown} | {result.seconds:.1f} s, ETA {eta}"


def _report_written(run_dir: Path, seconds: float) -> None:
    """What a finished pretrain's run dir holds (a folder with a ``/``: tensorboard/, wandb/,
    results-epoch-N/ ...) and how long it took (rank 0)."""
    names = sorted(p.name + "/" * p.is_dir() for p in run_dir.iterdir() if not p.name.startswith("."))
    periodic = [n for n in names if n.startswith("epoch-") and n.endswith(".pt")]
    shown = [n for n in names if n not in periodic]
    if periodic:
        shown.append(f"{len(periodic)} x epoch-NNNN.pt" if len(periodic) > 1 else periodic[0])
    print(f"pretrain finished in {_clock(seconds)}: {run_dir} holds {', '.join(shown)}", flush=True)


def _clock(seconds: float) -> str:
    """``h:mm:ss``."""
    m, s = divmod(round(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"
