"""Claiming a run dir: the lock (one process at a time), and ``--overwrite``'s set-aside of the
previous run, finished or undone (also after a killed process)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bayesncl.runs.fileio import default_file_mode
from bayesncl.runs.layout import LOCK_NAME, RESULT_FOLDERS, RUN_ARTIFACTS, artifact_files, move_into
from bayesncl.runs.messages import RunDirBusy, RunDirError


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
    are unavailable (Windows, some network file systems). Raises RunDirBusy (a RunDirError: one line,
    naming the holder's pid) if another process holds it."""
    return lock_file(Path(run_dir) / LOCK_NAME, f"run dir {run_dir} is in use by another bayesncl process "
                     "(pid {pid}); wait for it to end, or choose another --run-dir")  # fmt: skip


def lock_file(path: Path, busy: str) -> RunDirLock | None:
    """:func:`lock_run_dir` on the lock file ``path`` (its folder must exist), created if missing and
    deleted by ``release()``; ``busy``: the RunDirBusy message, ``{pid}`` standing for the holder's."""
    try:
        import fcntl
    except ImportError:
        return None
    tries = 3  # a holder of a moment (lock_holder's shared probe) is waited for, briefly
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
            tries -= 1
            if tries:
                time.sleep(0.05)
                continue
            raise RunDirBusy(busy.replace("{pid}", holder), holder) from None
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


def lock_holder(path: Path) -> str | None:
    """The pid (as its lock file names it, else ``"unknown"``) of the process that holds the lock file
    ``path`` (:func:`lock_file`), or None where none does (no file, a holder gone, no file locks here).
    Reads only: nothing is created or changed."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 32).decode(errors="replace").strip() or "unknown"
    except OSError:
        return None
    finally:
        os.close(fd)  # (drops the shared lock taken where none held it)
    return None


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


def set_aside_run_artifacts(run_dir: Path) -> Path | None:
    """--overwrite, first half: move a previous run's files (``RUN_ARTIFACTS`` and archived results),
    and nothing else, into a hidden ``run_dir/.replaced-PID/`` until :func:`finish_overwrite` deletes
    them or puts them back. Returns the folder, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    found = artifact_files(run_dir, RUN_ARTIFACTS)
    found += [
        d
        for pattern in RESULT_FOLDERS
        for d in sorted(run_dir.glob(pattern))
        if d.is_dir() and all(p.is_file() for p in d.iterdir())
    ]
    if not found:
        return None
    aside = move_into(found, run_dir / f".replaced-{os.getpid()}")
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
        for p in artifact_files(aside.parent, RUN_ARTIFACTS):
            p.unlink()
    for p in aside.iterdir():  # an archive folder of the same name gives way
        if (aside.parent / p.name).is_dir():
            shutil.rmtree(aside.parent / p.name)
    move_into(list(aside.iterdir()), aside.parent)
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
