"""The run directory of a pretraining run: what it holds, the checks before a run, and the
:class:`RunDir` that owns it while training (lock, claim, ``--overwrite``'s set-aside, archived
results, restore, Ctrl-C/SIGTERM, the saves at an epoch's end and mid-epoch).

Layout: ``config.yaml`` (the resolved config), ``log.csv`` and ``steps.csv`` (``runs.logs``, written
after their checkpoint), ``last.pt`` (``runs.state``, atomic), ``epoch-NNNN.pt`` every
``train.checkpoint_every`` epochs, then the results (:data:`RESULT_ARTIFACTS`: the export, metrics,
figures).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import warnings
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from bayesncl.config import Config, build_config, diff_configs, dump_yaml, flatten
from bayesncl.core import distributed, methods
from bayesncl.core.engine import STOP_SIGNALS, Cursor, EpochResult
from bayesncl.core.methods import CONTRASTIVE_STATS
from bayesncl.core.methods.plugins import PLUGINS_FILE
from bayesncl.data import mix_seed
from bayesncl.runs.fileio import atomic_path, default_file_mode, remove_stale_temporaries
from bayesncl.runs.loggers import RunLoggers
from bayesncl.runs.logs import write_log
from bayesncl.runs.safe_load import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    check_checkpoint_entries,
    is_bayesncl_checkpoint,
    load_checkpoint_file,
)
from bayesncl.runs.state import TrainState, rng_state, save_checkpoint, seed_everything, set_rng_state


class RunDirError(ValueError):
    """The run directory cannot be used as asked (exists, unwritable, config differs)."""


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def describe_config_diff(old: Config, new: Config) -> str:
    """``"key: old -> new; ..."`` for every key whose value differs (but the resume-free keys)."""
    fo, fn = flatten(old.to_dict()), flatten(new.to_dict())
    return "; ".join(f"{k}: {_show(fo.get(k))} -> {_show(fn.get(k))}" for k in diff_configs(old, new))


def _check_writable(run_dir: Path) -> None:
    """Raise RunDirError unless ``run_dir`` exists as a writable directory or can be created. Writes
    nothing that stays: a temporary file in the nearest existing folder, removed at once
    (``os.access`` alone says yes to root even on a read-only mount)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run dir {run_dir} is a file, not a directory; choose another --run-dir")
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise RunDirError(f"run dir {run_dir} cannot be created: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunDirError(f"run dir {run_dir} is not writable (no write permission on {probe})")
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=probe, prefix=".bayesncl-write-test"):
            pass
    except OSError as e:
        virtual = _virtual_file_system(probe) if e.errno == errno.ENOENT else None
        if virtual is not None:  # "no such file" for a new entry in a folder that exists: /proc
            if probe == run_dir:
                raise RunDirError(
                    f"run dir {run_dir} is not writable: it does not accept new files ({virtual})"
                ) from None
            raise RunDirError(
                f"run dir {run_dir} cannot be created: {probe} does not accept new folders ({virtual})"
            ) from None
        reason = e.strerror or str(e)
        raise RunDirError(f"run dir {run_dir} is not writable ({reason}: {probe})") from None


def _virtual_file_system(folder: Path) -> str | None:
    """``"a virtual file system: proc"`` when ``folder`` is on a file system with no storage behind
    it (its type from /proc/self/mounts where there is one), else None."""
    try:
        if os.statvfs(folder).f_blocks != 0:
            return None
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return None
    fs_type = None
    try:
        resolved = str(folder.resolve())
        best = ""
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) < 3:
                continue
            mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040: space
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best):
                best, fs_type = mount, fields[2]
    except OSError:
        pass
    return f"a virtual file system: {fs_type}" if fs_type else "a virtual file system"


# What is computed from the final weights (export, evaluation, figures, dynamics): stale once a
# --resume trains further, so archive_results moves it aside first.
RESULT_ARTIFACTS = (
    "encoder.safetensors",
    "backbone_torchvision.pt",
    "metrics.json",
    "metrics.md",
    "evaluation.json",
    "evaluation.md",
    "features_test.npz",
    "features_train.npz",
    # the figures by name: a user's own *.png in the folder is not the run's (--overwrite deleted it)
    "training_curves.png",
    "top_activations.png",
    "suppressed_features.png",
    "dynamics.png",
    "dynamics.json",
    "dynamics.md",
    "finetune.json",  # a finetune run dir's results (app.finetune)
    "finetune.md",
)
# What a run writes into its run dir; --overwrite sets these, and nothing else, aside first.
RUN_ARTIFACTS = (
    "config.yaml", PLUGINS_FILE, "log.csv", "steps.csv", "last.pt", "epoch-*.pt", *RESULT_ARTIFACTS,
)
# Folders of results a run dir holds: archived by a longer --resume, and those of `evaluate`/`extract`
# on an earlier checkpoint (RUN/epoch-NNNN.pt -> RUN/eval-epoch-NNNN/); --overwrite sets them aside too.
RESULT_FOLDERS = ("results-epoch-*", "eval-epoch-*")


def _files(run_dir: Path, patterns: tuple[str, ...]) -> list[Path]:
    return [p for pattern in patterns for p in sorted(Path(run_dir).glob(pattern)) if p.is_file()]


def _move_into(paths: list[Path], dest: Path) -> Path:
    dest.mkdir(exist_ok=True)
    for p in paths:
        os.replace(p, dest / p.name)
    return dest


def set_aside_run_artifacts(run_dir: Path) -> Path | None:
    """--overwrite, first half: move a previous run's files (``RUN_ARTIFACTS`` and archived results),
    and nothing else, into a hidden ``run_dir/.replaced-PID/`` until :func:`finish_overwrite` deletes
    them or puts them back. Returns the folder, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    found = _files(run_dir, RUN_ARTIFACTS)
    found += [
        d
        for pattern in RESULT_FOLDERS
        for d in sorted(run_dir.glob(pattern))
        if d.is_dir() and all(p.is_file() for p in d.iterdir())
    ]
    if not found:
        return None
    aside = _move_into(found, run_dir / f".replaced-{os.getpid()}")
    (aside / _ASIDE_COMPLETE).touch()  # a folder without it was interrupted while filling
    return aside


_ASIDE_COMPLETE = ".complete"


def finish_overwrite(aside: Path | None, *, keep_new: bool) -> None:
    """--overwrite, second half: ``keep_new=True`` deletes the previous run set aside by
    :func:`set_aside_run_artifacts`; ``False`` removes what the new run wrote (its ``RUN_ARTIFACTS``)
    and moves the previous run back."""
    if aside is None or not aside.is_dir():
        return
    if keep_new:
        shutil.rmtree(aside)
        return
    complete = (aside / _ASIDE_COMPLETE).exists()
    (aside / _ASIDE_COMPLETE).unlink(missing_ok=True)
    if complete:  # the new run's files give way (cut short, the set-aside left the rest of the old run)
        for p in _files(aside.parent, RUN_ARTIFACTS):
            p.unlink()
    for p in aside.iterdir():  # an archive folder of the same name gives way
        if (aside.parent / p.name).is_dir():
            shutil.rmtree(aside.parent / p.name)
    _move_into(list(aside.iterdir()), aside.parent)
    aside.rmdir()


def settle_run_dir(run_dir: Path) -> None:
    """Before a command reads or checks ``run_dir``: raise RunDirError if another process is using it
    (:func:`lock_run_dir`), and finish (printing it) an ``--overwrite`` a killed process left half done."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    probe = lock_run_dir(run_dir)
    try:
        for message in recover_interrupted_overwrite(run_dir, owner_gone=probe is not None):
            print(message, flush=True)
    finally:
        if probe is not None:
            probe.release()


def recover_interrupted_overwrite(run_dir: Path, *, owner_gone: bool = False) -> list[str]:
    """Finish an ``--overwrite`` whose process died (SIGKILL, power loss) as it would have: its
    ``run_dir/.replaced-PID/`` is deleted if the new run has a ``last.pt``, else (or if the set-aside
    was cut short) put back. ``owner_gone``: this process holds the run dir's lock; without it,
    folders of a process alive on this machine are left alone. Returns one message per folder."""
    done = []
    for aside, pid in _asides(run_dir):
        if not owner_gone and _process_alive(pid):
            continue
        complete = (aside / _ASIDE_COMPLETE).exists()
        keep_new = complete and (aside.parent / "last.pt").exists()
        finish_overwrite(aside, keep_new=keep_new)
        done.append(
            f"an interrupted --overwrite (process {pid}) had set the previous run aside: "
            + ("its new run has a checkpoint, so the previous one was deleted" if keep_new
               else f"put the previous run back in {aside.parent}")
        )
    return done


def set_aside_hint(run_dir: Path) -> str:
    """For commands that only read a run dir (evaluate, extract, curves, dynamics) and find it empty:
    ``"; ..."`` naming the previous run an interrupted ``--overwrite`` left set aside in it (the files
    they look for are there), else ``""``."""
    asides = [p for p, pid in _asides(run_dir) if not _process_alive(pid)]  # not an --overwrite under way
    if not asides:
        return ""
    return (
        f" (an --overwrite that was killed left the previous run in {asides[-1]}/: `bayesncl pretrain "
        f"--run-dir {run_dir} --resume` puts it back)"
    )


def _asides(run_dir: Path) -> list[tuple[Path, int]]:
    """The ``.replaced-PID/`` folders of ``run_dir`` (an ``--overwrite``'s set-aside), with their PID."""
    found = sorted(Path(run_dir).glob(".replaced-*"))
    return [(p, int(p.name[10:])) for p in found if p.is_dir() and p.name[10:].isdigit()]


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


LOCK_NAME = ".bayesncl.lock"


@dataclass
class RunDirLock:
    """An exclusive claim on a run dir by this process (see :func:`lock_run_dir`)."""

    path: Path
    fd: int

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        os.close(self.fd)


def lock_run_dir(run_dir: Path) -> RunDirLock | None:
    """Claim ``run_dir`` (which must exist) until ``release()``: an OS file lock (``fcntl.flock``) on
    ``run_dir/.bayesncl.lock``, dropped by the OS if the process dies. Returns None where file locks
    are unavailable (Windows, some network file systems). Raises RunDirError (one line, naming the
    holder's pid) if another process holds it."""
    try:
        import fcntl
    except ImportError:
        return None
    path = Path(run_dir) / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, default_file_mode())
        except IsADirectoryError:
            raise RunDirError(f"{path} is a directory, not bayesncl's lock file: remove it") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(
                f"run dir {run_dir} is in use by another bayesncl process (pid {holder}); wait for it to "
                "end, or choose another --run-dir"
            ) from None
        except OSError:  # no lock support on this file system
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:  # not a file its holder unlinked meanwhile
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return RunDirLock(path, fd)


def discard_unstarted_run(run_dir: Path, existed: bool) -> None:
    """After a fresh run failed before its first checkpoint: remove what it wrote (``config.yaml``,
    ``steps.csv``, ``log.csv``, temporaries) and the run dir if this run created it and it is now
    empty, so the command can be rerun. A run dir holding a ``last.pt`` is left alone."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or (run_dir / "last.pt").exists():
        return
    for name in ("config.yaml", "steps.csv", "log.csv"):  # (the logs follow their checkpoint: none, here)
        (run_dir / name).unlink(missing_ok=True)
    remove_stale_temporaries(run_dir)
    if not existed and all(p.name == LOCK_NAME for p in run_dir.iterdir()):
        (run_dir / LOCK_NAME).unlink(missing_ok=True)  # (its holder, this process, is ending)
        run_dir.rmdir()


def archive_results(run_dir: Path, epoch: int) -> Path | None:
    """Move the results of the ``epoch``-epoch run (``RESULT_ARTIFACTS``) into
    ``run_dir/results-epoch-NNNN/`` before a --resume trains further (results of two lengths never
    mix). Returns the folder, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    found = _files(run_dir, RESULT_ARTIFACTS)
    if not found:
        return None
    dest = run_dir / f"results-epoch-{epoch:04d}"
    n = 2
    while dest.exists():
        dest, n = run_dir / f"results-epoch-{epoch:04d}-{n}", n + 1
    return _move_into(found, dest)


def _no_last_pt(run_dir: Path, has_run: bool) -> str:
    """The end of --resume's "no checkpoint" message: why there is no last.pt and what to do."""
    ckpt_path = run_dir / "last.pt"
    if has_run:  # a log or export, no last.pt: killed while writing it, or deleted (not unstarted)
        found = run_markers(run_dir)[0]  # (no last.pt here)
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


def prepare_run_dir(run_dir: Path, cfg: Config, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check the run dir *before* anything is written. Returns the checkpoint to resume from or None.

    Raises RunDirError if another process is using it, if it already holds a run (without
    --resume/--overwrite), if --resume finds no checkpoint, an unreadable one or a config that
    differs (naming each key, old and new value), or if it cannot be written. On resume, a killed
    run's temporary files are removed.
    """
    run_dir = Path(run_dir)
    _check_writable(run_dir)
    settle_run_dir(run_dir)
    # A run dir with only config.yaml holds a run killed before its first checkpoint: nothing to keep.
    has_run = holds_run(run_dir)
    if resume:
        ckpt_path = run_dir / "last.pt"
        if not ckpt_path.exists():
            why = _no_last_pt(run_dir, has_run)
            raise RunDirError(f"--resume: no checkpoint {ckpt_path} to resume from{why}")
        try:
            ckpt = load_checkpoint_file(ckpt_path)
            if not is_bayesncl_checkpoint(ckpt):
                raise RunDirError(f"--resume: {ckpt_path} is not a bayesncl checkpoint ({CHECKPOINT_FORMAT})")
            check_checkpoint_entries(ckpt, ckpt_path, resume=True)
        except CheckpointError as e:
            raise RunDirError(f"--resume: {e}") from None
        started = ckpt["epoch"] + (1 if ckpt.get("partial") else 0)  # epochs begun
        if cfg.train.epochs < started:
            done = (
                f"the run stopped inside epoch {started}" if ckpt.get("partial")
                else f"the run has done {started} epochs"
            )
            raise RunDirError(
                f"--resume: train.epochs={cfg.train.epochs} is fewer than {started}: {done}; give "
                f"train.epochs >= {started} to continue it"
            )
        old = build_config(ckpt["config"], source=ckpt_path)
        diff = describe_config_diff(old, cfg)
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
        raise occupied_run_dir(run_dir)
    if not has_run and (subruns := _runs_below(run_dir)):
        names = _some_names([f"{p.name}/" for p in subruns])
        raise RunDirError(
            f"run dir {run_dir} holds runs in its folders ({names}; a demo or reproduce table?): a run "
            "here would be mixed in with them; choose another --run-dir"
        )
    if not overwrite and (foreign := _files_a_run_would_replace(run_dir)):
        names = _some_names([p.name for p in foreign])
        raise RunDirError(
            f"run dir {run_dir} holds files that are not a bayesncl run's but that a run writes ({names}): "
            "training would replace them; choose another --run-dir, or pass --overwrite to replace them"
        )
    return None


def _some_names(names: list[str], shown: int = 4) -> str:
    """``"a, b, c, d and 3 more"``: the first ``shown`` names of a list for a one-line message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _files_a_run_would_replace(run_dir: Path) -> list[Path]:
    """Files in a run dir without a run (no checkpoint, log or export) that a run would write over,
    leaving out what a run killed before its first checkpoint leaves (its config.yaml, steps.csv),
    which a rerun may replace. A config.yaml that is not a bayesncl run config is a user's file."""
    found = []
    for p in _files(run_dir, RUN_ARTIFACTS):
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
    from bayesncl.config import ConfigError, load_run_yaml

    try:
        build_config(load_run_yaml(path))
    except (ConfigError, OSError):
        return False
    return True


# The files that mark a folder as holding a run: a checkpoint, a log or an export.
RUN_MARKERS = ("last.pt", "log.csv", "encoder.safetensors")


def run_markers(run_dir: Path) -> list[str]:
    """The :data:`RUN_MARKERS` that ``run_dir`` holds, in that order."""
    return [name for name in RUN_MARKERS if (Path(run_dir) / name).exists()]


def holds_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run (a checkpoint, a log or an export); a run dir with only
    ``config.yaml`` holds a run killed before its first checkpoint: nothing to keep."""
    return bool(run_markers(run_dir))


def refuse_a_run_in(run_dir: Path, command: str) -> None:
    """``demo``/``reproduce`` train in ``run_dir``'s folders: raise RunDirError if ``run_dir`` itself
    holds a (pretrain) run, which they would be mixed in with (the mirror of prepare_run_dir's check
    for runs in a pretrain run dir's folders)."""
    if found := run_markers(run_dir):
        raise RunDirError(
            f"run dir {run_dir} holds a pretrain run ({', '.join(found)}): {command}'s runs in its folders "
            "would be mixed in with it; choose another --run-dir"
        )


def occupied_run_dir(run_dir: Path) -> RunDirError:
    return RunDirError(
        f"run dir {run_dir} already holds a run; pass --resume to continue it, "
        "--overwrite to replace it, or choose another --run-dir"
    )


# ----------------------------------------------------------------------------- a run's run dir
class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C or SIGTERM after saving a resumable ``last.pt`` (one-line message);
    ``exit_code`` is 128 + the signal number (130 for Ctrl-C, 143 for SIGTERM). ``template``: the
    message with ``{resume}`` where it says how to continue; ``str()`` reads ``--resume`` there, the
    app's error layer what the command takes (:data:`bayesncl.app.errors.RESUME_VIA`)."""

    def __init__(self, template: str, signum: int = signal.SIGINT) -> None:
        super().__init__(self.with_resume(template, "--resume"))
        self.template = template
        self.exit_code = 128 + int(signum)

    @staticmethod
    def with_resume(template: str, how: str) -> str:
        return template.replace("{resume}", how)  # not str.format: a path may hold braces


class RunDir:
    """The run dir of one pretraining run, from its checks to the end of training; every process
    makes one (under ``torchrun`` rank 0 alone writes, the others wait: ``distributed.run_on_main``)::

        with RunDir(path, cfg, world, resume=..., overwrite=...) as run:  # checks, reads last.pt
            state = run.restore(model, optimizer, scaler, steps_per_epoch)
            run.claim(state)  # lock, --overwrite's set-aside, config.yaml, Ctrl-C/SIGTERM handlers
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
        self._lock: RunDirLock | None = None
        self._aside: Path | None = None  # --overwrite: where the previous run waits
        self._handlers: list[tuple[int, Any]] = []
        self.loggers: RunLoggers | None = None  # rank 0, from claim() to the end of the ``with``
        self._trained: tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]  # by restore()

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
                discard_unstarted_run(self.path, self._existed)  # a run without a checkpoint: no trace
                if self._aside is not None:
                    finish_overwrite(self._aside, keep_new=False)
                    print(f"put the previous run back in {self.path} (the new one had no checkpoint)",
                          flush=True)
        finally:
            if self.loggers is not None:
                self.loggers.close()
            if self._lock is not None:
                self._lock.release()
            self._restore_handlers()

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
        if ckpt is None:
            return TrainState(steps_per_epoch=steps_per_epoch)
        partial = ckpt.get("partial")  # (from before named statistics: the sums in their old order)
        cursor = Cursor.from_dict(partial, tuple(s.name for s in CONTRASTIVE_STATS)) if partial else None
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
            steps_per_epoch=steps_per_epoch, step_log=list(ckpt["step_log"]),
        )
        ranks = ckpt.get("rng_ranks")
        if ranks and len(ranks) == world.world_size:  # each rank continues its own RNG stream
            set_rng_state(ranks[world.rank])
        elif world.is_main:
            set_rng_state(ckpt["rng"])
        else:  # the run had another number of processes: the other ranks restart their own stream
            seed_everything(mix_seed(distributed.rank_seed(cfg.seed, world.rank), state.step))
        return state

    def claim(self, state: TrainState) -> None:
        """Take the run dir (rank 0; every rank gets its error): lock it, re-check it under the lock,
        set a previous run aside (``--overwrite``), archive the results of a shorter run a
        ``--resume`` extends, write ``config.yaml`` and the logs as ``state`` holds them. Then catch
        the first Ctrl-C or SIGTERM (:attr:`stop_signal`) until :meth:`finish`."""
        distributed.run_on_main(lambda: self._claim(state))
        self._install_handlers()

    def _claim(self, state: TrainState) -> None:
        run_dir, ckpt, cfg = self.path, self.checkpoint, self.cfg
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = lock_run_dir(run_dir)  # the first write; None where there are no file locks
        if ckpt is None and not self.overwrite and holds_run(run_dir):
            # another command wrote a run here after prepare_run_dir: refuse, as it did, touching nothing
            if lock is not None:
                lock.release()
            raise occupied_run_dir(run_dir)
        self._lock, self._claimed = lock, True
        if ckpt is None and self.overwrite:  # the previous run waits aside until this one has a checkpoint
            self._aside = set_aside_run_artifacts(run_dir)
        if ckpt is None:  # a run killed before its first checkpoint may have left its step log
            (run_dir / "steps.csv").unlink(missing_ok=True)
        if ckpt is not None and ckpt["epoch"] < cfg.train.epochs:
            moved = archive_results(run_dir, ckpt["epoch"])
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
        finish_overwrite(self._aside, keep_new=True)  # the new run has its checkpoint
        self._aside = None
        self._write_logs(state)
        if state.cursor is None and state.log and self.loggers is not None:
            self.loggers.log_epoch(state.log[-1])  # the epoch's row, once it is on disk
        every = self.cfg.train.checkpoint_every
        if state.cursor is None and every and state.epoch % every == 0:
            save_checkpoint(self.path / f"epoch-{state.epoch:04d}.pt", *self._trained, state, self.cfg)

    def _write_logs(self, state: TrainState) -> None:
        if state.log:
            write_log(self.path, state.log)
        if state.step_log:  # with the epoch rows, not rewritten every STEP_LOG_EVERY steps
            write_log(self.path, state.step_log, "steps.csv")

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

