"""``bayesncl pretrain``: train (:func:`train`: the method's :class:`~bayesncl.app.fit.Job` run by
:func:`bayesncl.app.fit.fit`, the loop in DINO's shape), then evaluate.

:func:`pretrain` checks the config and the data, takes the run dir (``runs.rundir.RunDir``), trains
with LARS and a per-iteration warmup-cosine schedule, checkpointing atomically every epoch, exports
the encoder, and finally evaluates the test split (``app.evaluate``). Under ``torchrun`` the same
function runs in every process, with DDP (``bayesncl.core.distributed``, docs/scaling.md); rank 0
alone writes the run dir (its layout: README, ``runs.rundir``) and prints.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bayesncl.app.errors import out_of_memory
from bayesncl.app.fit import Job, OnSync, clock, export_trained, fit
from bayesncl.app.heldout import build_heldout
from bayesncl.config import Config, ConfigError, eval_data
from bayesncl.core import distributed, methods
from bayesncl.core.engine import LossFn, TrainingError, contrastive_loss_fn
from bayesncl.core.methods import Method
from bayesncl.core.model import ContrastiveModel, build_model
from bayesncl.core.optim import LrSchedule, param_groups, peak_lrs
from bayesncl.data import DataError, DatasetInfo, dataset_info
from bayesncl.data.loaders import check_batch_size
from bayesncl.runs.loggers import require as require_loggers
from bayesncl.runs.logs import heldout_fields
from bayesncl.runs.messages import TrainingInterrupted
from bayesncl.runs.rundir import RunDir

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
    method: Method  # the method cfg.method.name names (core.methods.get), resolved once per run


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
    method = methods.get(cfg.method.name)
    if method.needs_labels and not info.labeled:
        raise DataError(f"method.name={cfg.method.name} learns from labels: {cfg.data.name} has none here")
    steps = info.num_train // world.world_size // cfg.train.batch_size
    if not evaluate:
        return RunFacts(info, None, peaks, steps, method), None
    # the labelled data the end-of-training evaluation reads (eval.data.*, issue 17)
    e = eval_data(cfg)
    test_info = info if e == cfg.data else distributed.local_main_first(world, lambda: dataset_info(e))
    skipped = no_labels_note(cfg, run_dir, test_info)
    if skipped is not None:
        return RunFacts(info, None, peaks, steps, method), skipped
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
    return RunFacts(info, test_info, peaks, steps, method), None


def train(cfg: Config, run: RunDir, facts: RunFacts) -> ContrastiveModel:
    """Train ``cfg`` in ``run`` (entered) from its checkpoint, if any, to ``train.epochs``
    (:func:`bayesncl.app.fit.fit` of :func:`pretraining_job`); rank 0 then draws the curves and
    exports the encoder. Returns the trained model."""
    model = fit(cfg, run, pretraining_job(cfg, run.world, facts))
    if run.world.is_main:
        export_trained(model, cfg, run.path, cfg.method.name)
    return model


def pretraining_job(cfg: Config, world: distributed.World, facts: RunFacts) -> Job:
    """What pretraining trains (:class:`~bayesncl.app.fit.Job`): ``facts.method``'s model of ``cfg``
    on the training data, its loss (:func:`~bayesncl.core.engine.contrastive_loss_fn`) and the
    statistics a run of it logs (``Method.logged``), LARS's parameter groups at ``facts.peak_lrs``,
    warmup then cosine per step, and on rank 0 the held-out batch (``train.monitor_samples``)."""
    info, method = facts.data, facts.method
    gated = cfg.method.gate != "none"

    def loss_fn(autocast: Any, channels_last: bool) -> LossFn:
        return contrastive_loss_fn(method, cfg.method, autocast=autocast, channels_last=channels_last,
                                   labeled=info.labeled)  # fmt: skip

    def schedule(steps: int) -> LrSchedule:  # lr scaled by the global batch, warmup then cosine per step
        return LrSchedule(cfg.train.epochs * steps, round(cfg.train.warmup_epochs * steps),
                          start=cfg.train.warmup_start_lr, final=cfg.train.min_lr)  # fmt: skip

    return Job(
        name=cfg.method.name, stats=method.logged(cfg.method, info.labeled),
        build_model=lambda: build_model(cfg, info.channels, info.image_size, info.num_classes),
        param_groups=lambda model: param_groups(model, cfg, facts.peak_lrs), schedule=schedule,
        make_loss_fn=loss_fn, terms=methods.terms(cfg.method, method), loader_options={"info": info},
        heldout=build_heldout(cfg, info) if world.is_main else None,
        heldout_columns=tuple(heldout_fields(gated)), on_start=partial(_time_notes, cfg, world),
    )  # fmt: skip


def _time_notes(cfg: Config, world: distributed.World, first_step: int, total_steps: int) -> OnSync | None:
    """Before the first step (rank 0): the projected time (:func:`_project_time`; one process only:
    its timing steps would gather negatives from processes that are not timing) or else the CPU
    time warning's on_sync hook (:func:`_cpu_time_warning`)."""
    if not world.distributed and _project_time(cfg, world.device, first_step, total_steps):
        return None
    return _cpu_time_warning(cfg, world.device, first_step, total_steps)


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
    print(f"projected training time: {clock(seconds)} (h:mm:ss) for {left:,} steps of {cfg.train.epochs} "
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
                f"training on the CPU: the {total_steps - step} steps left take about {clock(left)} "
                f"(h:mm:ss) at this rate ({cfg.train.epochs} epochs of {cfg.data.name}); for a run "
                "sized for a CPU use --config fashion-mnist-demo, or train on a GPU (train.device=cuda)",
                stacklevel=2,
            )

    return check


def _report_written(run_dir: Path, seconds: float) -> None:
    """What a finished pretrain's run dir holds (a folder with a ``/``: tensorboard/, wandb/,
    results-epoch-N/ ...) and how long it took (rank 0)."""
    names = sorted(p.name + "/" * p.is_dir() for p in run_dir.iterdir() if not p.name.startswith("."))
    periodic = [n for n in names if n.startswith("epoch-") and n.endswith(".pt")]
    shown = [n for n in names if n not in periodic]
    if periodic:
        shown.append(f"{len(periodic)} x epoch-NNNN.pt" if len(periodic) > 1 else periodic[0])
    print(f"pretrain finished in {clock(seconds)}: {run_dir} holds {', '.join(shown)}", flush=True)
