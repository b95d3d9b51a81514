"""The pretraining loop: one function, readable top to bottom (DINO's style).

``pretrain(cfg, run_dir)`` validates everything first (config, data, batch size, run dir), then
creates the run dir, trains with LARS and a per-iteration warmup-cosine schedule, checkpoints
atomically every epoch, and finally evaluates the test split (see ``bayesncl.metrics``).
Under ``torchrun`` the same function runs in every process, with DDP (``bayesncl.core.distributed``,
docs/scaling.md); rank 0 alone writes the run dir and prints.

Run dir layout::

    config.yaml     the fully resolved config
    log.csv         one row per epoch (loss parts, gate health, online probe, lr, time), written
                    after the epoch's last.pt: no row without its checkpoint
    steps.csv       the same means every 25 steps (checkpoint.STEP_LOG_EVERY)
    last.pt         full state (model, optimiser, scaler, RNGs, epoch, step, log), atomic
    epoch-NNNN.pt   periodic copies (train.checkpoint_every)
    training_curves.png   log.csv drawn (bayesncl.app.report.curves), end of training
    encoder.safetensors, backbone_torchvision.pt   exported encoder (end of training)
    metrics.json, metrics.md   end-of-training evaluation on the test split
"""

from __future__ import annotations

import math
import shutil
import signal
import time
import warnings
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bayesncl.app.errors import out_of_memory
from bayesncl.app.heldout import build_heldout
from bayesncl.app.report.curves import write_training_curves
from bayesncl.config import Config, ConfigError, dump_yaml
from bayesncl.core import distributed
from bayesncl.core.engine import TrainingError, prefetch_to_device, train_step, wrap_for_training
from bayesncl.core.model import build_model
from bayesncl.core.optim import build_optimizer, param_groups, resolve_precision, set_lr, warmup_cosine
from bayesncl.data import DataError, build_train_loader, dataset_info, mix_seed
from bayesncl.runs.export import export_encoder
from bayesncl.runs.fileio import atomic_path
from bayesncl.runs.loggers import RunLoggers
from bayesncl.runs.loggers import require as require_loggers
from bayesncl.runs.rundir import (
    STEP_LOG_EVERY,
    RunDirError,
    TrainState,
    archive_results,
    discard_unstarted_run,
    finish_overwrite,
    holds_run,
    lock_run_dir,
    occupied_run_dir,
    prepare_run_dir,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_aside_run_artifacts,
    set_rng_state,
    write_log,
)


# ----------------------------------------------------------------------------- the loop
def pretrain(
    cfg: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    evaluate: bool = True,
) -> dict[str, Any]:
    """Pretrain the method ``cfg`` describes and (optionally) evaluate it on the test split.

    returns: the final metrics dict (also written to ``run_dir/metrics.json``).
    Raises ConfigError / DataError / RunDirError before writing anything when the input is bad;
    TrainingError if the loss becomes non-finite (the last good checkpoint is kept).

    Under ``torchrun`` every process calls this (docs/scaling.md): DDP over ``WORLD_SIZE``
    processes, ``train.batch_size`` per process, lr scaled by the global batch, each rank its own
    seed and data shard; only rank 0 writes the run dir, prints and evaluates (others return {}).
    """
    world = distributed.setup(cfg.train.device)
    run_dir = Path(run_dir)
    existed = run_dir.exists()
    # rank 0's claim on the run dir ("lock") and, with --overwrite, where the previous run waits
    # ("run"); see _pretrain
    claim: dict[str, Any] = {}
    try:
        return _pretrain(
            cfg, run_dir, world, resume=resume, overwrite=overwrite, evaluate=evaluate, claim=claim
        )
    except BaseException:  # an error, or a second Ctrl-C that stopped at once
        if "lock" in claim and not resume:  # a fresh run that failed before its first checkpoint: no trace
            discard_unstarted_run(run_dir, existed)
            if claim.get("run") is not None:  # the overwritten run comes back
                finish_overwrite(claim["run"], keep_new=False)
                print(f"put the previous run back in {run_dir} (the new one had no checkpoint)", flush=True)
        raise
    finally:
        if claim.get("loggers") is not None:
            claim["loggers"].close()
        if claim.get("lock") is not None:
            claim["lock"].release()
        _restore_stop_handlers()
        world.close()


def _pretrain(
    cfg: Config, run_dir: Path, world: distributed.World, *, resume: bool, overwrite: bool, evaluate: bool,
    claim: dict[str, Any],
) -> dict[str, Any]:
    device = world.device
    amp_dtype = resolve_precision(cfg.train.precision, device)
    distributed.check_sync_bn(cfg.train.sync_bn, world)
    global_batch = cfg.train.batch_size * world.world_size
    peak = distributed.scaled_lr(cfg.train.base_lr, global_batch)
    if cfg.train.min_lr > peak:  # the cosine "decay" would raise the rate to min_lr
        why = (
            f"train.min_lr={cfg.train.min_lr:g}: expected <= the peak learning rate {peak:g} (train.base_lr="
            f"{cfg.train.base_lr:g} x global batch {global_batch} / 256), or the schedule would rise to it"
        )
        if not resume:
            raise ConfigError(why)
        # a run begun before this check: --resume cannot change train.min_lr, so it continues as it began
        if world.is_main:
            warnings.warn(f"{why}; the run continues with the schedule it began with", stacklevel=2)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick the fastest kernels
    info = distributed.local_main_first(world, lambda: dataset_info(cfg.data))  # one download per node
    if evaluate and cfg.eval.probe == "fast" and info.num_classes < 2:
        raise DataError(
            f"{cfg.data.name} has {info.num_classes} class: the end-of-training linear probe needs >= 2; "
            "pass --no-eval or eval.probe=none"
        )
    if evaluate and cfg.eval.probe == "fast" and max(info.train_class_counts, default=2) < 2:
        # the probe holds out one image of a class to choose its L2 strength: refused before training
        k = cfg.data.train_subset
        subset = f"data.train_subset={k} leaves" if k else "there are"
        raise DataError(
            f"{subset} {info.num_train} training images of {cfg.data.name}, at most one per class: the "
            "end-of-training linear probe needs a class with >= 2 (it holds some out to choose its L2 "
            f"strength); {'raise data.train_subset' if k else 'add images'}, or pass --no-eval or "
            "eval.probe=none"
        )
    if world.is_main:
        require_loggers(cfg.train.loggers)  # a missing package: one line, before the run dir is touched
    ckpt = distributed.run_on_main(lambda: prepare_run_dir(run_dir, cfg, resume=resume, overwrite=overwrite))
    if world.is_main:
        print(f"run dir: {run_dir}", flush=True)

    seed_everything(distributed.rank_seed(cfg.seed, world.rank))
    loader = build_train_loader(  # this rank's shard; augmentation seeded by (seed, epoch, rank, step)
        cfg.data, cfg.train.batch_size, seed=cfg.seed, device=device,
        rank=world.rank, world_size=world.world_size,
    )
    model = build_model(cfg, info.channels, info.image_size, info.num_classes).to(device)
    model = distributed.convert_sync_bn(model, cfg.train.sync_bn, world)
    if cfg.train.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer(param_groups(model, cfg), cfg)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)

    steps_per_epoch = len(loader)
    total_steps = cfg.train.epochs * steps_per_epoch
    lr_base = distributed.scaled_lr(cfg.train.base_lr, cfg.train.batch_size * world.world_size)
    schedule = warmup_cosine(
        lr_base,
        total_steps,
        round(cfg.train.warmup_epochs * steps_per_epoch),
        start=cfg.train.warmup_start_lr,
        final=cfg.train.min_lr,
    )

    state = TrainState(steps_per_epoch=steps_per_epoch)
    if ckpt is not None:
        partial = ckpt.get("partial")
        in_epoch = ckpt["step"] - ckpt["epoch"] * steps_per_epoch
        if ckpt.get("steps_per_epoch", steps_per_epoch) != steps_per_epoch or in_epoch != (
            partial["n_seen"] if partial else 0
        ):
            done = ckpt.get("steps_per_epoch") or ckpt["step"] // max(ckpt["epoch"], 1)
            raise RunDirError(
                f"--resume: the run took {done} steps per epoch, this launch takes {steps_per_epoch} "
                f"({world.world_size} process(es) x batch {cfg.train.batch_size}); relaunch with as "
                "many processes as the run had"
            )
        planned = ckpt["config"]["train"]["epochs"]
        if world.is_main and ckpt["epoch"] < planned != cfg.train.epochs:
            warnings.warn(
                f"--resume with train.epochs={cfg.train.epochs} changes a {planned}-epoch run that stopped "
                f"after epoch {ckpt['epoch']}{' (inside the next)' if ckpt.get('partial') else ''}: the "
                f"learning-rate schedule is recomputed for {cfg.train.epochs} epochs from here, so the "
                f"result matches neither an uninterrupted {planned}- nor {cfg.train.epochs}-epoch run",
                stacklevel=2,
            )
        model.load_state_dict(ckpt["state_dict"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        state = TrainState(
            epoch=ckpt["epoch"], step=ckpt["step"], log=list(ckpt["log"]), partial=partial,
            steps_per_epoch=steps_per_epoch, step_log=list(ckpt.get("step_log", [])),
        )
        ranks = ckpt.get("rng_ranks")
        if ranks and len(ranks) == world.world_size:  # each rank continues its own RNG stream
            set_rng_state(ranks[world.rank])
        elif world.is_main:
            set_rng_state(ckpt["rng"])
        else:  # a checkpoint without the other ranks' RNG states: they restart their own stream
            seed_everything(mix_seed(distributed.rank_seed(cfg.seed, world.rank), state.step))

    def claim_run_dir() -> None:
        """Rank 0 takes the run dir (lock, re-check, set-aside, config.yaml); run through
        :func:`distributed.run_on_main`, so that an error here (e.g. the re-check below) stops
        every rank with the same message, not rank 0 alone with the others left in a collective."""
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_run_dir(run_dir)  # the first write; None where there are no file locks
        if ckpt is None and not overwrite and holds_run(run_dir):
            # another command wrote a run here after prepare_run_dir's check (while this one loaded
            # its data and built its model) and ended: refuse as that check would have, touching nothing
            if lock is not None:
                lock.release()
            raise occupied_run_dir(run_dir)
        claim["lock"] = lock
        if ckpt is None and overwrite:  # the previous run waits aside until this one has a checkpoint
            claim["run"] = set_aside_run_artifacts(run_dir)
        if ckpt is None:  # a run killed before its first checkpoint may have left its step log
            (run_dir / "steps.csv").unlink(missing_ok=True)
        if ckpt is not None and ckpt["epoch"] < cfg.train.epochs:
            moved = archive_results(run_dir, ckpt["epoch"])
            if moved is not None:
                print(f"moved the results of the {ckpt['epoch']}-epoch run to {moved}/ (they would be stale)")
        every, done = cfg.train.checkpoint_every, ckpt["epoch"] if ckpt is not None else 0
        periodic = run_dir / f"epoch-{done:04d}.pt"
        at_boundary = ckpt is not None and not ckpt.get("partial") and done > 0
        if at_boundary and every and done % every == 0 and not periodic.exists():
            # killed between last.pt and the periodic copy of the same epoch: write the copy now
            with atomic_path(periodic) as tmp:
                shutil.copyfile(run_dir / "last.pt", tmp)
        with atomic_path(run_dir / "config.yaml") as tmp:  # a kill mid-write must not leave it empty
            tmp.write_text(dump_yaml(cfg))
        if ckpt is not None:  # the logs as last.pt holds them: a save cut short after it left them short
            if state.log:
                write_log(run_dir, state.log)
            if state.step_log:
                write_log(run_dir, state.step_log, "steps.csv")

    distributed.run_on_main(claim_run_dir)  # fresh run, or a resume that may have extended train.epochs
    # rank 0: the held-out batch scored at each epoch's end (log.csv's heldout_*), the loggers
    heldout = build_heldout(cfg) if world.is_main else None
    if world.is_main:
        claim["loggers"] = RunLoggers(cfg.train.loggers, run_dir, cfg.to_dict(), state.epoch)

    step_model = wrap_for_training(model, cfg, world)
    autocast = torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else None
    interrupted = _install_stop_handlers()
    stop, stop_signal = False, None
    lr = float(schedule[max(state.step - 1, 0)]) if total_steps else 0.0  # a stop after an epoch's last step
    for epoch in range(state.epoch, cfg.train.epochs):
        partial, state.partial = state.partial, None  # a run stopped inside this epoch goes on from there
        n_seen = partial["n_seen"] if partial else 0
        loader.set_epoch(epoch, start_step=n_seen)
        model.train()
        t0 = time.time() - (partial["elapsed"] if partial else 0.0)
        # running sums of loss, nce, kl, gate_open, all_closed, probe_correct
        sums = partial["sums"].to(device) if partial else torch.zeros(6, device=device)
        window = partial.get("window", ([0.0] * 6, 0)) if partial else ([0.0] * 6, 0)  # last steps.csv row
        bar = _progress(loader, epoch, cfg, world, initial=n_seen)
        for x1, x2, y in prefetch_to_device(bar, device):
            lr = float(schedule[state.step])
            set_lr(optimizer, lr, lr / lr_base if lr_base > 0 else 1.0)
            stats = train_step(
                step_model, optimizer, scaler, x1, x2, y, cfg.method,
                autocast=autocast, channels_last=cfg.train.channels_last,
            )
            sums += stats
            n_seen += 1
            state.step += 1
            if device.type == "cpu" or state.step % STEP_LOG_EVERY == 0 or n_seen == steps_per_epoch:
                # the only host sync: means over every process, and whether any was interrupted
                means, stop_signal = _global_means(sums / n_seen, interrupted["signal"])
                stop = stop_signal is not None
                if not math.isfinite(means[0]):
                    raise TrainingError(
                        # CPU checks every step; CUDA every STEP_LOG_EVERY steps (no per-step host sync)
                        f"non-finite loss {'at' if device.type == 'cpu' else 'detected by'} step "
                        f"{state.step} (epoch {epoch + 1}): "
                        f"InfoNCE={float(stats[1]):.4g}, KL={float(stats[2]):.4g}; " + _what_was_kept(run_dir)
                    )
                if hasattr(bar, "set_postfix"):
                    post = {"loss": f"{means[0]:.3f}", "kl": f"{means[2]:.2f}"}
                    if model.gate is not None:
                        post["open"] = f"{means[3]:.2f}"
                    bar.set_postfix(post)
                if state.step % STEP_LOG_EVERY == 0:
                    state.step_log.append(_step_row(state, means, n_seen, window, lr))
                    window = (means, n_seen)
            # several processes stop together, at a sync point; one process at once
            stop = stop or (interrupted["signal"] is not None and not world.distributed)
            if stop:
                break
        if stop:  # every process stops after the same step (decided at a sync point)
            state.partial = {
                "n_seen": n_seen,
                "sums": distributed.all_reduce_mean(sums.clone()).cpu(),  # every rank's share
                "elapsed": time.time() - t0,
                "window": window,
            }
            state.rng_ranks = _rng_of_every_rank(world)

            def save_mid_epoch() -> None:
                save_checkpoint(run_dir / "last.pt", model, optimizer, scaler, state, cfg)
                finish_overwrite(claim.pop("run", None), keep_new=True)
                if state.step_log:  # after its checkpoint, as at an epoch's end
                    write_log(run_dir, state.step_log, "steps.csv")

            # rank 0 saves while the others wait: torchrun ends the whole group once one process exits
            distributed.run_on_main(save_mid_epoch)
            raise TrainingInterrupted(
                f"stopped in epoch {epoch + 1} after {n_seen} of its {steps_per_epoch} steps; state saved "
                f"to {run_dir / 'last.pt'}; --resume continues from that step",
                signum=stop_signal or interrupted["signal"] or signal.SIGINT,
            )
        means, _ = _global_means(sums / max(n_seen, 1), None)
        bad = _first_non_finite(model, world)
        if bad is not None:  # weights or BatchNorm statistics diverged while the loss stayed finite
            raise TrainingError(
                f"non-finite weights after epoch {epoch + 1} (step {state.step}), although the loss stayed "
                f"finite: {bad} holds NaN or inf (the training diverged: lower train.base_lr="
                f"{cfg.train.base_lr:g}); "
                + _what_was_kept(run_dir, "nothing was kept: fix the cause and rerun")
            )
        row = {
            "epoch": epoch + 1,
            "step": state.step,
            "loss": round(means[0], 6),
            "info_nce": round(means[1], 6),
            "kl": round(means[2], 6),
            "gate_open": round(means[3], 6),
            "rho": cfg.method.rho if model.gate is not None else "",
            "rows_all_closed": round(means[4], 6),
            "online_acc": round(100 * means[5], 3),
            "lr": lr,
            "epoch_time_s": round(time.time() - t0, 2),
        }
        if heldout is not None:
            row.update(heldout.measure(model, device))
        state.log.append(row)
        state.epoch = epoch + 1
        state.rng_ranks = _rng_of_every_rank(world)  # collective: before rank 0 alone saves
        if world.is_main and model.gate is not None and means[4] > 0.5:
            print(f"warning: gate collapse: {100 * means[4]:.0f}% of rows have every gate closed")

        def save_epoch() -> None:
            save_checkpoint(run_dir / "last.pt", model, optimizer, scaler, state, cfg)
            finish_overwrite(claim.pop("run", None), keep_new=True)
            # the logs after their checkpoint: a save that fails (a full disk) leaves no row without one
            write_log(run_dir, state.log)
            if state.step_log:  # with the epoch rows, not rewritten every 25 steps
                write_log(run_dir, state.step_log, "steps.csv")
            every = cfg.train.checkpoint_every
            if every and state.epoch % every == 0:
                save_checkpoint(run_dir / f"epoch-{state.epoch:04d}.pt", model, optimizer, scaler, state, cfg)

        # rank 0 saves while the others wait, so that its error (a full disk) stops every rank alike
        distributed.run_on_main(save_epoch)
        if world.is_main:
            claim["loggers"].log_epoch(row)

    _restore_stop_handlers()
    if interrupted["signal"] is not None and world.is_main:  # it came during the last epoch's saves
        raise TrainingInterrupted(
            f"stopped after the last epoch ({state.epoch}), before the export and evaluation; "
            f"{run_dir / 'last.pt'} holds the trained model: --resume exports and evaluates it",
            signum=interrupted["signal"],
        )
    if not world.is_main:
        return {}
    if state.log:
        try:
            write_training_curves([run_dir], run_dir / "training_curves.png", labels=[cfg.method.name])
        except RunDirError as e:  # a figure is not worth the export and the evaluation
            warnings.warn(f"no training curves: {e}", stacklevel=2)
    export_encoder(model, run_dir, cfg)
    if not evaluate:
        claim["loggers"].finish(state.epoch)
        return {}
    from bayesncl.app.evaluate import evaluate_model

    try:
        metrics = evaluate_model(model, cfg, run_dir, device=device)
        claim["loggers"].finish(state.epoch, metrics)
        return metrics
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


def _what_was_kept(
    run_dir: Path, nothing: str = "no epoch had finished, so nothing was kept: fix the cause and rerun"
) -> str:
    """The end of a non-finite-loss or non-finite-weights message: what the run dir still holds."""
    if (run_dir / "last.pt").exists():
        return f"the last good checkpoint {run_dir / 'last.pt'} is kept"
    return nothing


def _first_non_finite(model: nn.Module, world: distributed.World) -> str | None:
    """The name of a floating-point parameter or buffer of ``model`` holding NaN or inf (on any
    rank: a collective under DDP), or None. Checked at each epoch end, before the checkpoint: a
    diverged BatchNorm running variance leaves the training loss finite (training mode uses the
    batch's statistics) but makes every evaluation feature constant. One host sync per epoch."""
    tensors = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    if not tensors:
        return None
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()]).all()
    bad_here = (~finite).float().reshape(1)
    if float(distributed.all_reduce_mean(bad_here)[0]) == 0:
        return None
    names = [k for k, v in tensors.items() if not bool(torch.isfinite(v).all())]
    return names[0] if names else f"a tensor of another process than rank {world.rank}"


def _rng_of_every_rank(world: distributed.World) -> list[dict[str, Any]] | None:
    """Every rank's RNG state for the checkpoint (a collective under DDP); None for one process."""
    return distributed.all_gather_objects(rng_state()) if world.distributed else None


def _step_row(
    state: TrainState, means: list[float], n: int, window: tuple[list[float], int], lr: float
) -> dict[str, float]:
    """A steps.csv row: the means over this epoch's steps since the previous row, from the running
    means over the epoch's ``n`` steps (``means``) and those at the previous row (``window``)."""
    base, n0 = window
    m = [(a * n - b * n0) / (n - n0) for a, b in zip(means, base, strict=True)]
    return {
        "step": state.step,
        "epoch": round(state.step / state.steps_per_epoch, 4),
        **{k: round(v, 6) for k, v in zip(("loss", "info_nce", "kl", "gate_open"), m, strict=False)},
        "online_acc": round(100 * m[5], 3),
        "lr": lr,
    }


def _global_means(local_means: Tensor, signum: int | None) -> tuple[list[float], int | None]:
    """The loop's host sync point: the running means averaged over processes (every rank gets the
    same numbers, so a non-finite loss stops every rank) and the stop signal any process received
    (``signum``: this one's, or None): SIGTERM if any got one (a preemption), else SIGINT, else None."""
    flags = torch.tensor([float(signum == s) for s in STOP_SIGNALS], device=local_means.device)
    values = distributed.all_reduce_mean(torch.cat([local_means, flags])).tolist()
    received = [s for s, v in zip(STOP_SIGNALS, values[-len(flags):], strict=True) if v > 0]
    return values[: -len(flags)], max(received, default=None)










def _progress(loader: Any, epoch: int, cfg: Config, world: distributed.World, initial: int = 0) -> Any:
    if not cfg.train.progress or not world.is_main:
        return loader
    from tqdm.auto import tqdm

    return tqdm(
        loader,
        desc=f"{cfg.method.name} epoch {epoch + 1}/{cfg.train.epochs}",
        initial=initial,
        total=len(loader),
        leave=False,
        dynamic_ncols=True,
    )


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C or SIGTERM after saving a resumable ``last.pt`` (one-line message);
    ``exit_code`` is 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; a cluster scheduler's preemption notice
_PREVIOUS_HANDLERS: list[tuple[int, Any]] = []


def _install_stop_handlers() -> dict[str, int | None]:
    """First Ctrl-C or SIGTERM during the epochs: finish the current step, save ``last.pt`` (mid-epoch,
    resumable) and stop cleanly; a second one acts at once (the previous handler is back).
    :func:`_restore_stop_handlers` restores the handlers after the epochs (evaluation is interruptible)."""
    received: dict[str, int | None] = {"signal": None}
    for signum in STOP_SIGNALS:
        try:
            previous = signal.getsignal(signum)

            def handler(sig: int, frame: Any, previous: Any = previous) -> None:
                received["signal"] = received["signal"] or sig
                signal.signal(sig, previous)

            signal.signal(signum, handler)
            _PREVIOUS_HANDLERS.append((signum, previous))
        except ValueError:  # not the main thread
            pass
    return received


def _restore_stop_handlers() -> None:
    while _PREVIOUS_HANDLERS:
        signum, previous = _PREVIOUS_HANDLERS.pop()
        with suppress(ValueError):
            signal.signal(signum, previous)
