"""The run directory of a pretraining run: the checks before a run (:func:`prepare_run_dir`) and the
:class:`RunDir` that owns it while training (lock, claim, ``--overwrite``'s set-aside, archived
results, restore, Ctrl-C/SIGTERM, the saves at an epoch's end and mid-epoch)."""

from __future__ import annotations

import shutil
import signal
import warnings
from contextlib import suppress
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from bayesncl.config import Config, ConfigError, build_config, dump_yaml, load_run_yaml
from bayesncl.core import distributed, methods
from bayesncl.core.engine import STOP_SIGNALS, Cursor, EpochResult
from bayesncl.core.methods import CONTRASTIVE_STATS
from bayesncl.core.optim import Precision, precision_text, resolve_precision
from bayesncl.core.plugins import PLUGINS_FILE
from bayesncl.core.seeding import mix_seed
from bayesncl.runs import layout, lock, messages
from bayesncl.runs.fileio import atomic_path, remove_stale_temporaries
from bayesncl.runs.loggers import RunLoggers
from bayesncl.runs.logs import ADDED_COLUMNS, LogColumns, resumed_header, write_log
from bayesncl.runs.messages import RunDirError, TrainingInterrupted
from bayesncl.runs.safe_load import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    check_checkpoint_entries,
    is_bayesncl_checkpoint,
    load_checkpoint_file,
)
from bayesncl.runs.state import (
    TrainState,
    describe_kernels,
    kernel_record,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)


def _no_last_pt(run_dir: Path, has_run: bool) -> str:
    """The end of --resume's "no checkpoint" message: why there is no last.pt and what to do."""
    ckpt_path = run_dir / "last.pt"
    if has_run:  # a log or export, no last.pt: killed while writing it, or deleted (not unstarted)
        found = layout.run_markers(run_dir)[0]  # (no last.pt here)
        periodic = sorted(run_dir.glob("epoch-[0-9]*.pt"))
        how = (
            f"copy {periodic[-1]} to {ckpt_path} to resume from there, or pass --overwrite "
            "instead of --resume to start the run again"
            if periodic
            else "pass --overwrite instead of --resume to start the run again"
        )
        why = f"{run_dir} holds {found} but no last.pt, killed while saving it or deleted"
        return f" ({why}: {how})"  # (without --resume: "already holds a run; pass --resume")
    if (run_dir / "config.yaml").exists():
        return " (the run stopped before its first checkpoint: run the same command without --resume)"
    return ""


def read_resume_checkpoint(ckpt_path: Path) -> dict[str, Any]:
    """A run's ``last.pt`` as ``--resume`` reads it: CheckpointError (one line, what is wrong with the
    file) for one that is missing, no checkpoint, damaged, not a bayesncl checkpoint, or without an
    entry a resume needs. (``reproduce`` reads an unfinished run's so before any training.)"""
    ckpt = load_checkpoint_file(ckpt_path)
    if not is_bayesncl_checkpoint(ckpt):
        raise CheckpointError(f"{ckpt_path} is not a bayesncl checkpoint ({CHECKPOINT_FORMAT})")
    check_checkpoint_entries(ckpt, ckpt_path, resume=True)
    return ckpt


def epochs_begun(ckpt: dict[str, Any]) -> tuple[int, str]:
    """The epochs a resumable checkpoint has begun (a run continues from it with ``train.epochs`` at
    least that), and in words: ``"the run stopped inside epoch N"`` or ``"the run has done N epochs"``."""
    if ckpt.get("partial"):
        return ckpt["epoch"] + 1, f"the run stopped inside epoch {ckpt['epoch'] + 1}"
    return ckpt["epoch"], f"the run has done {ckpt['epoch']} epochs"


def prepare_run_dir(run_dir: Path, cfg: Config, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check the run dir *before* anything is written. Returns the checkpoint to resume from or None.

    Raises RunDirError if another process is using it, if it already holds a run (without
    --resume/--overwrite), if --resume finds no checkpoint, an unreadable one or a config that
    differs (naming each key, old and new value), or if it cannot be written. On resume, a killed
    run's temporary files are removed.
    """
    run_dir = Path(run_dir)
    layout.check_writable(run_dir)
    lock.settle_run_dir(run_dir)
    has_run = bool(layout.run_markers(run_dir))
    if resume:
        ckpt_path = run_dir / "last.pt"
        if not ckpt_path.exists():
            why = _no_last_pt(run_dir, has_run)
            raise RunDirError(f"--resume: no checkpoint {ckpt_path} to resume from{why}")
        try:
            ckpt = read_resume_checkpoint(ckpt_path)
        except CheckpointError as e:
            raise RunDirError(f"--resume: {e}") from None
        started, done = epochs_begun(ckpt)
        if cfg.train.epochs < started:
            raise RunDirError(
                f"--resume: train.epochs={cfg.train.epochs} is fewer than {started}: {done}; give "
                f"train.epochs >= {started} to continue it"
            )
        old = build_config(ckpt["config"], source=ckpt_path)
        diff = messages.describe_config_diff(old, cfg)
        if diff:
            raise RunDirError(
                f"--resume: the config differs from the run's in: {diff} (run's -> now); resume with "
                "the run's config (only train.epochs, train.progress, train.checkpoint_every, "
                "train.loggers, train.monitor_samples, data.num_workers, data.root and eval.* may change) "
                "or start a new --run-dir"
            )
        remove_stale_temporaries(run_dir)
        return ckpt
    if has_run and not overwrite:
        raise messages.occupied_run_dir(run_dir)
    if not has_run and (subruns := _runs_below(run_dir)):
        names = messages.some_names([f"{p.name}/" for p in subruns])
        raise RunDirError(
            f"run dir {run_dir} holds runs in its folders ({names}; a demo or reproduce table?): a run "
            "here would be mixed in with them; choose another --run-dir"
        )
    if not overwrite and (foreign := _files_a_run_would_replace(run_dir)):
        names = messages.some_names([p.name for p in foreign])
        raise RunDirError(
            f"run dir {run_dir} holds files that are not a bayesncl run's but that a run writes ({names}): "
            "training would replace them; choose another --run-dir, or pass --overwrite to replace them"
        )
    return None


def _files_a_run_would_replace(run_dir: Path) -> list[Path]:
    """Files in a run dir without a run (no checkpoint, log or export) that a run would write over,
    leaving out what a run killed before its first checkpoint leaves (its config.yaml, steps.csv),
    which a rerun may replace. A config.yaml that is not a bayesncl run config is a user's file."""
    found = []
    for p in layout.artifact_files(run_dir, layout.RUN_ARTIFACTS):
        if p.name == "steps.csv" or (p.name == "config.yaml" and _is_run_config(p)):
            continue
        found.append(p)
    return found


def _runs_below(run_dir: Path) -> list[Path]:
    """The folders directly in ``run_dir`` that hold a run (a checkpoint or a log), as the runs of
    ``demo`` and ``reproduce`` do; a run's own results-epoch-*/eval-epoch-* folders hold neither, and
    hidden ones (``.replaced-PID/``: a previous run set aside by ``--overwrite``) are the run's own."""
    if not run_dir.is_dir():
        return []

    def holds(p: Path) -> bool:
        try:
            return p.is_dir() and not p.is_symlink() and any((p / n).exists() for n in ("last.pt", "log.csv"))
        except OSError:  # a folder this user may not look into (another's, lost+found): not their run
            return False

    return sorted(p for p in run_dir.iterdir() if not p.name.startswith(".") and holds(p))


def _is_run_config(path: Path) -> bool:
    try:
        build_config(load_run_yaml(path))
    except (ConfigError, OSError):
        return False
    return True


class RunDir:
    """The run dir of one pretraining run, from its checks to the end of training; every process
    makes one (under ``torchrun`` rank 0 alone writes, the others wait: ``distributed.run_on_main``)::

        with RunDir(path, cfg, world, resume=..., overwrite=...) as run:  # checks, reads last.pt
            precision = run.precision(plan)  # plan: core.optim.precision_plan; on --resume the run's
            state = run.restore(model, optimizer, scaler, steps_per_epoch)
            run.claim(state, columns)  # lock, --overwrite's set-aside, config.yaml, Ctrl-C/SIGTERM handlers
            ... run.save(state) / run.save_mid_epoch(state, stopped)
            run.finish()
        run.log_results(metrics)  # (rank 0) the train.loggers get the final metrics and figures

    Entering raises RunDirError before anything is written (:func:`prepare_run_dir`). A fresh run
    that fails before its first checkpoint leaves no trace (an ``--overwrite``'s previous run comes
    back). The lock and the ``train.loggers`` (rank 0, opened by the claim) last until the ``with`` ends.
    """

    def __init__(
        self, path: str | Path, cfg: Config, world: distributed.World, *, resume: bool, overwrite: bool
    ) -> None:
        self.path, self.cfg, self.world = Path(path), cfg, world
        self.resume, self.overwrite = resume, overwrite
        self.checkpoint: dict[str, Any] | None = None  # the one to resume from
        self.stop_signal: int | None = None  # the first Ctrl-C/SIGTERM since claim()
        self._existed = self.path.exists()
        self._claimed = False
        self._lock: lock.RunDirLock | None = None
        self._aside: Path | None = None  # --overwrite: where the previous run waits
        self._handlers: list[tuple[int, Any]] = []
        self.loggers: RunLoggers | None = None  # rank 0, from claim() to the end of the ``with``
        self._trained: tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]  # by restore()
        self._precision: Precision | None = None  # by precision(): recorded in the checkpoints
        self.columns: LogColumns | None = None  # the logs' headers, by claim()

    def __enter__(self) -> RunDir:
        self.checkpoint = distributed.run_on_main(
            lambda: prepare_run_dir(self.path, self.cfg, resume=self.resume, overwrite=self.overwrite)
        )
        if self.world.is_main:
            print(f"run dir: {self.path}", flush=True)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:  # an error, or a second Ctrl-C that stopped at once
            if exc_type is not None and self._claimed and not self.resume:
                layout.discard_unstarted_run(self.path, self._existed)  # a run without a checkpoint: no trace
                if self._aside is not None:
                    lock.finish_overwrite(self._aside, keep_new=False)
                    print(f"put the previous run back in {self.path} (the new one had no checkpoint)",
                          flush=True)
        finally:
            if self.loggers is not None:
                self.loggers.close()
            if self._lock is not None:
                self._lock.release()
            self._restore_handlers()

    def precision(self, plan: Precision) -> Precision:
        """What to train in: ``plan`` (``core.optim.precision_plan`` on this machine), or on --resume
        what the run trained in (its checkpoint's ``precision``) where ``train.precision=auto`` or
        ``fast`` resolves differently here (a bf16 run resumed on a CPU without native bf16): bf16
        autocast runs on any CPU, only slower. Where this device cannot run it (fp16 on a CPU, bf16
        on a GPU without it), ``plan``, with a warning. Call it before :meth:`restore`."""
        recorded = (self.checkpoint or {}).get("precision")
        self._precision = plan
        if not recorded or recorded["dtype"] == plan.name:
            return plan
        device, name, dtype = self.world.device, self.cfg.train.precision, recorded["dtype"]
        cuda = device.type == "cuda"
        if dtype == "bf16" and cuda and not torch.cuda.is_bf16_supported() or dtype == "fp16" and not cuda:
            if self.world.is_main:
                warnings.warn(
                    f"--resume: the run trained in {dtype} (train.precision={name} where it started), which "
                    f"this {device.type} cannot compute in: it continues in {plan.name}",
                    stacklevel=2,
                )
            return plan
        cl = bool(recorded["channels_last"])
        self._precision = Precision(
            resolve_precision(dtype, device), cl,
            f"{precision_text(dtype, cl)} (the run's, from its checkpoint: train.precision={name} chose it "
            f"where the run started; here it would choose {plan.name})",
        )
        return self._precision

    def restore(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
        steps_per_epoch: int,
    ) -> TrainState:
        """The training state to start from: a fresh one, or :attr:`checkpoint` loaded into
        ``model``, ``optimizer``, ``scaler`` and the RNGs; the ``save_*`` methods save these three.
        Raises RunDirError if this launch takes another number of steps per epoch (another number of
        processes); warns when ``train.epochs`` changes a run that had not finished."""
        ckpt, cfg, world = self.checkpoint, self.cfg, self.world
        self._trained = (model, optimizer, scaler)
        here = kernel_record(world.device)
        if ckpt is None:
            return TrainState(
                steps_per_epoch=steps_per_epoch, precision=self._precision, kernels=[{**here, "from_step": 0}]
            )
        partial = ckpt.get("partial")  # (from before named statistics: the sums in their old order)
        old_order = tuple(s.name for s in CONTRASTIVE_STATS if s.name not in ADDED_COLUMNS)
        cursor = Cursor.from_dict(partial, old_order) if partial else None
        done = ckpt["steps_per_epoch"]
        in_epoch = ckpt["step"] - ckpt["epoch"] * done
        if done != steps_per_epoch or in_epoch != (cursor.n_seen if cursor else 0):
            raise RunDirError(
                f"--resume: the run took {done} steps per epoch, this launch takes {steps_per_epoch} "
                f"({world.world_size} process(es) x batch {cfg.train.batch_size}); relaunch with as "
                "many processes as the run had"
            )
        planned = ckpt["config"]["train"]["epochs"]
        if world.is_main and ckpt["epoch"] < planned != cfg.train.epochs:
            warnings.warn(
                f"--resume with train.epochs={cfg.train.epochs} changes a {planned}-epoch run that stopped "
                f"after epoch {ckpt['epoch']}{' (inside the next)' if partial else ''}: the "
                f"learning-rate schedule is recomputed for {cfg.train.epochs} epochs from here, so the "
                f"result matches neither an uninterrupted {planned}- nor {cfg.train.epochs}-epoch run",
                stacklevel=3,
            )
        model.load_state_dict(ckpt["state_dict"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        state = TrainState(
            epoch=ckpt["epoch"], step=ckpt["step"], log=list(ckpt["log"]), cursor=cursor,
            steps_per_epoch=steps_per_epoch, step_log=list(ckpt["step_log"]), precision=self._precision,
            kernels=self._kernels(ckpt, here),
        )
        if world.is_main:
            print(messages.resuming(self.path, state), flush=True)
        ranks = ckpt.get("rng_ranks")
        if ranks and len(ranks) == world.world_size:  # each rank continues its own RNG stream
            set_rng_state(ranks[world.rank])
        elif world.is_main:
            set_rng_state(ckpt["rng"])
        else:  # the run had another number of processes: the other ranks restart their own stream
            seed_everything(mix_seed(distributed.rank_seed(cfg.seed, world.rank), state.step))
        return state

    def _kernels(self, ckpt: dict[str, Any], here: dict[str, Any]) -> list[dict[str, Any]]:
        """The checkpoint's record of where the run computed (``TrainState.kernels``), with this
        machine's from the checkpoint's step where it differs, said in a warning (rank 0): the steps
        left compute other floats, so the run repeats a straight run on neither machine bit for bit."""
        recorded = list(ckpt.get("kernels") or [])  # absent: a checkpoint from before the record
        last = {k: v for k, v in recorded[-1].items() if k != "from_step"} if recorded else None
        if last == here:
            return recorded
        if last is not None and self.world.is_main:
            warnings.warn(
                f"--resume: the run computed steps {recorded[-1]['from_step'] + 1}-{ckpt['step']} with "
                f"{describe_kernels(last)}; here: {describe_kernels(here)}. The steps left compute other "
                "floats (the same distribution, other digits), so the result repeats a straight run on "
                "neither machine bit for bit (CONFIG.md, \"Not bitwise reproducible\")",
                stacklevel=4,
            )
        return [*recorded, {**here, "from_step": ckpt["step"]}]

    def claim(self, state: TrainState, columns: LogColumns) -> None:
        """Take the run dir (rank 0; every rank gets its error): lock it, re-check it under the lock,
        set a previous run aside (``--overwrite``), archive the results of a shorter run a
        ``--resume`` extends, write ``config.yaml`` and the logs as ``state`` holds them. The logs'
        headers are ``columns`` (``runs.logs.log_columns`` of the run's statistics), or on
        ``--resume`` those of the files the run wrote where they hold these (an older log keeps its
        columns; ``runs.logs.resumed_header``). Then catch the first Ctrl-C or SIGTERM
        (:attr:`stop_signal`) until :meth:`finish`."""
        distributed.run_on_main(lambda: self._claim(state, columns))
        self._install_handlers()

    def _claim(self, state: TrainState, columns: LogColumns) -> None:
        run_dir, ckpt, cfg = self.path, self.checkpoint, self.cfg
        run_dir.mkdir(parents=True, exist_ok=True)
        claim = lock.lock_run_dir(run_dir)  # the first write; None where there are no file locks
        if ckpt is None and not self.overwrite and layout.run_markers(run_dir):
            # another command wrote a run here after prepare_run_dir: refuse, as it did, touching nothing
            if claim is not None:
                claim.release()
            raise messages.occupied_run_dir(run_dir)
        self._lock, self._claimed = claim, True
        if ckpt is None and self.overwrite:  # the previous run waits aside until this one has a checkpoint
            self._aside = lock.set_aside_run_artifacts(run_dir)
        if ckpt is None:  # a run killed before its first checkpoint may have left its step log
            (run_dir / "steps.csv").unlink(missing_ok=True)
        else:  # a resume: the logs keep the headers the run's files have (an older run: every column)
            columns = LogColumns(
                resumed_header(run_dir / "log.csv", columns.epoch),
                resumed_header(run_dir / "steps.csv", columns.step),
            )
        self.columns = columns
        if ckpt is not None and ckpt["epoch"] < cfg.train.epochs:
            moved = layout.archive_results(run_dir, ckpt["epoch"])
            if moved is not None:
                print(f"moved the results of the {ckpt['epoch']}-epoch run to {moved}/ (they would be stale)")
        every, done = cfg.train.checkpoint_every, state.epoch
        periodic = run_dir / f"epoch-{done:04d}.pt"
        at_boundary = ckpt is not None and not state.cursor and done > 0
        if at_boundary and every and done % every == 0 and not periodic.exists():
            # killed between last.pt and the periodic copy of the same epoch: write the copy now
            with atomic_path(periodic) as tmp:
                shutil.copyfile(run_dir / "last.pt", tmp)
        with atomic_path(run_dir / "config.yaml") as tmp:  # a kill mid-write must not leave it empty
            tmp.write_text(dump_yaml(cfg))
        source = methods.get(cfg.method.name).source  # a method from a user's file: which one
        if source is not None and Path(source).is_file():
            (run_dir / PLUGINS_FILE).write_text(source + "\n")
        else:
            (run_dir / PLUGINS_FILE).unlink(missing_ok=True)
        if ckpt is not None:  # the logs as last.pt holds them: a save cut short after it left them short
            self._write_logs(state)
        # a resume continues the TensorBoard run from the checkpoint's epoch, and the W&B run id
        self.loggers = RunLoggers(cfg.train.loggers, run_dir, cfg.to_dict(), state.epoch)

    def kept(self, nothing: str = "no epoch had finished, so nothing was kept") -> str:
        """The end of an error message that stops training: what the run dir still holds."""
        if (self.path / "last.pt").exists():
            return f"the last good checkpoint {self.path / 'last.pt'} is kept"
        return f"{nothing}: fix the cause and rerun"

    def save(self, state: TrainState) -> None:
        """``last.pt``, then the logs (no row without its checkpoint); at an epoch's end (no
        ``state.cursor``) also ``epoch-NNNN.pt`` every ``train.checkpoint_every`` epochs. Every rank
        calls it; rank 0 saves while the others wait, so that its error (a full disk) stops them all."""
        state.rng_ranks = distributed.all_gather_objects(rng_state())  # None for one process
        distributed.run_on_main(lambda: self._save(state))

    def save_mid_epoch(self, state: TrainState, stopped: EpochResult) -> NoReturn:
        """A stop inside an epoch (``stopped``, from ``core.engine.train_one_epoch``): save the
        resumable state to ``last.pt`` and raise TrainingInterrupted (every rank calls it)."""
        state.cursor = stopped.cursor
        self.save(state)
        n_seen = stopped.cursor.n_seen if stopped.cursor else 0
        raise TrainingInterrupted(
            f"stopped in epoch {state.epoch + 1} after {n_seen} of its {state.steps_per_epoch} steps; state "
            f"saved to {self.path / 'last.pt'}; {{resume}} continues from that step",
            signum=stopped.stop_signal or signal.SIGINT,
        )

    def log_results(self, metrics: dict[str, Any]) -> None:
        """After training (and the evaluation, if any: ``metrics``, else {}): the ``train.loggers``
        get the metrics and the run dir's figures at x = ``train.epochs``, then close (rank 0)."""
        if self.loggers is not None:
            self.loggers.finish(self.cfg.train.epochs, metrics)

    def finish(self) -> None:
        """After the last epoch: Ctrl-C acts at once again; raises TrainingInterrupted (rank 0) if a
        stop came during the last epoch's saves, before the export."""
        self._restore_handlers()
        if self.stop_signal is not None and self.world.is_main:
            raise TrainingInterrupted(
                f"stopped after the last epoch ({self.cfg.train.epochs}), before the export and evaluation; "
                f"{self.path / 'last.pt'} holds the trained model: {{resume}} exports and evaluates it",
                signum=self.stop_signal,
            )

    def _save(self, state: TrainState) -> None:
        save_checkpoint(self.path / "last.pt", *self._trained, state, self.cfg)
        lock.finish_overwrite(self._aside, keep_new=True)  # the new run has its checkpoint
        self._aside = None
        self._write_logs(state)
        if state.cursor is None and state.log and self.loggers is not None:
            self.loggers.log_epoch(state.log[-1])  # the epoch's row, once it is on disk
        every = self.cfg.train.checkpoint_every
        if state.cursor is None and every and state.epoch % every == 0:
            save_checkpoint(self.path / f"epoch-{state.epoch:04d}.pt", *self._trained, state, self.cfg)

    def _write_logs(self, state: TrainState) -> None:
        assert self.columns is not None  # set by claim(), before any save
        if state.log:
            write_log(self.path, state.log, fields=self.columns.epoch)
        if state.step_log:  # with the epoch rows, not rewritten every STEP_LOG_EVERY steps
            write_log(self.path, state.step_log, "steps.csv", self.columns.step)

    def _install_handlers(self) -> None:
        """The first Ctrl-C or SIGTERM sets :attr:`stop_signal` (the loop finishes its step, saves
        and stops); a second one acts at once (the previous handler is back)."""
        for signum in STOP_SIGNALS:
            try:
                previous = signal.getsignal(signum)

                def handler(sig: int, frame: Any, previous: Any = previous) -> None:
                    self.stop_signal = self.stop_signal or sig
                    signal.signal(sig, previous)

                signal.signal(signum, handler)
                self._handlers.append((signum, previous))
            except ValueError:  # not the main thread
                pass

    def _restore_handlers(self) -> None:
        while self._handlers:
            signum, previous = self._handlers.pop()
            with suppress(ValueError):
                signal.signal(signum, previous)
