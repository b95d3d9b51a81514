"""Atomic file writes: every file bayesncl writes appears whole or not at all.

One rule for checkpoints, logs, features, tables and figures: write to a hidden temporary file in
the destination's folder, then ``os.replace`` it over the destination (atomic on POSIX and
Windows). A crash or Ctrl-C mid-write leaves the old file (or none) and no temporary file; a
killed process (SIGKILL) can leave a temporary, which :func:`remove_stale_temporaries` clears.

The final file gets the mode an ordinary ``open(path, "w")`` would give (``0o666`` minus the
umask): ``tempfile``, safetensors and others create private ``0o600`` files, which would surprise a
user sharing a run directory.

A full file system is one line naming the file (:class:`DiskFullError`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

_TMP_MARK = ".tmp"


def temporary_name(path: Path) -> Path:
    """The temporary file :func:`atomic_path` writes before ``path``: ``.{name}.tmp{pid}`` beside it."""
    return path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}")


def default_file_mode() -> int:
    """``0o666`` minus the process umask (what ``open(path, "w")`` creates)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it replaces ``path``, on an error it is removed.

    ``path``'s folder must exist. The writer may create the temporary file any way it likes (its
    name keeps ``path``'s suffix out, so pass an explicit format where a library guesses from it).
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    except Exception as e:
        if _file_system_full(e, path.parent):  # before the partial temporary goes and frees its space
            raise DiskFullError(
                f"{path} cannot be written: no space left on the file system of {path.parent}; free some "
                "space, then run the command again (pretrain: --resume continues from last.pt, if the run "
                "has one)"
            ) from None
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class DiskFullError(OSError):
    """A file could not be written because its file system is full (one line, naming the file).

    torch.save reports a full disk as ``RuntimeError: ... unexpected pos N vs M`` (its zip writer
    sees a short write), so :func:`atomic_path` also looks at the free space when a write fails."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[type[DiskFullError], tuple[str]]:
        # pickled as its message: under torchrun rank 0 hands its errors to the other ranks
        # (distributed.run_on_main); OSError's own pickling passes (errno, message), which __init__ refuses
        return type(self), (str(self.strerror),)


_FULL_BELOW = 1 << 20  # bytes free: a write that failed with less than this left failed for want of space


def _file_system_full(e: BaseException, folder: Path) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):  # AttributeError: no statvfs (Windows)
        return False
    return st.f_blocks > 0 and st.f_bavail * st.f_frsize < _FULL_BELOW  # f_blocks 0: /proc and the like


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporaries a killed bayesncl process left in ``folder``; returns what it removed."""
    removed = []
    for stale in Path(folder).glob(f".*{_TMP_MARK}[0-9]*"):
        if stale.is_file():
            stale.unlink(missing_ok=True)
            removed.append(stale)
    return removed


def write_failure_reason(path: Path, exc: OSError) -> str:
    """Why ``path`` could not be written (``exc`` from the attempt), in words that name ``path``'s
    folders, not the temporary file: e.g. ``"<dir> is a file, not a directory"`` or
    ``"permission denied (in <dir>)"``."""
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is a file, not a directory"
            break
    reason = exc.strerror or type(exc).__name__
    return f"{reason[:1].lower()}{reason[1:]} (in {path.parent})"
