"""The command line's one error layer: every failure a user can meet is one line (docs/bad-inputs.md).

:func:`run_command` prints each expected failure as ``bayesncl: error: ...`` with exit status 2:
bad input (:func:`user_errors`), an allocation that failed (:func:`out_of_memory`) and
operating-system faults (:func:`os_fault`); anything else is a bug and raises. Ctrl-C (or SIGTERM)
is one line ``bayesncl: interrupted...`` and exit 128 + the signal. A reader that goes away
(``bayesncl metrics x.npz | head -1``) stops nothing (:func:`readers_may_go`). Warnings are one line
``bayesncl: warning: ...``; a value longer than :data:`MAX_VALUE` characters is shortened
(:func:`shorten`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from bayesncl.config import ConfigError

MAX_VALUE = 200  # characters: a longer path or value in a message keeps its head and tail

# What to do about each operating-system fault (errno -> advice after "<path>: <reason>").
_OS_ADVICE = {
    errno.ENAMETOOLONG: "choose a shorter path (most file systems take at most 255 bytes a name)",
    errno.EROFS: "choose a folder on a writable file system",
    errno.ENOSPC: "free some space, then run the command again",
    errno.EDQUOT: "free some space, then run the command again",
    errno.EACCES: "choose a folder you may write to, or change its permissions",
    errno.EPERM: "choose a folder you may write to, or change its permissions",
}


def shorten(message: str, limit: int = MAX_VALUE) -> str:
    """``message`` with each run of non-space characters longer than ``limit`` (a path, an
    override value) cut to its first and last ``limit // 2`` characters joined by ``…``."""
    half = limit // 2
    return re.sub(rf"\S{{{limit + 1},}}", lambda m: f"{m.group()[:half]}…{m.group()[-half:]}", message)


def out_of_memory(e: BaseException, command: str | None) -> str | None:
    """A one-line message for an allocation that failed (CUDA or CPU), or None for other errors.

    A batch, image size or model too large for the device is a setting, not a bug: the message
    names how much was asked for and the settings of ``command`` that decide it (``None``: pretrain's)."""
    import torch

    text = str(e)
    if not (
        isinstance(e, (MemoryError, torch.OutOfMemoryError))
        or (isinstance(e, RuntimeError) and "can't allocate memory" in text)
    ):
        return None
    asked = ""
    if (found := re.search(r"allocate (\d+) bytes", text)) is not None:
        asked = f" (tried to allocate {int(found.group(1)) / 2**30:,.1f} GiB)"
    elif (found := re.search(r"allocate ([\d.]+ ?[KMGTP]i?B)", text, re.IGNORECASE)) is not None:
        asked = f" (tried to allocate {found.group(1)})"  # CUDA's "Tried to", NumPy's "Unable to"
    where = "on the GPU" if isinstance(e, torch.OutOfMemoryError) else "in main memory"
    settings = {
        "benchmark": "--batch-size, --image-size or --backbone",
        "extract": "eval.batch_size (or data.image_size)", "evaluate": "eval.batch_size (or data.image_size)",
        "metrics": "the number of features (or --retrieval-dims)",
    }.get(
        command or "",
        "train.batch_size, data.image_size or the model's size (model.backbone, model.proj_dim, "
        "model.proj_hidden, method.gate_hidden)",
    )
    return f"out of memory {where}{asked}: lower {settings}"


def os_fault(e: BaseException) -> str | None:
    """``"<path>: <reason>; <advice>"`` for an OSError the system raised (it carries an errno), or
    None. The path is the destination of a rename and the file a temporary stood for
    (``.last.pt.tmp123`` → ``last.pt``), as the user knows them."""
    if not isinstance(e, OSError) or e.errno is None or not e.strerror:
        return None
    name = e.filename2 if e.filename2 is not None else e.filename
    reason = f"{e.strerror[:1].lower()}{e.strerror[1:]}"
    if name is None:
        text = reason
    else:
        path = Path(os.fsdecode(name))
        real = re.fullmatch(r"\.(.+)\.tmp\d+", path.name)
        text = f"{path.with_name(real.group(1)) if real else path}: {reason}"
    advice = _OS_ADVICE.get(e.errno)
    return f"{text}; {advice}" if advice else text


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input, printed as their one-line message."""
    from bayesncl.core.distributed import DistributedError
    from bayesncl.core.engine import TrainingError
    from bayesncl.core.model import BackboneError
    from bayesncl.data import DataError
    from bayesncl.metrics.inputs import EvalError
    from bayesncl.runs.fileio import DiskFullError
    from bayesncl.runs.messages import RunDirError
    from bayesncl.runs.safe_load import CheckpointError

    return (
        DiskFullError, ConfigError, DistributedError, BackboneError, DataError, EvalError, RunDirError,
        CheckpointError, TrainingError,
    )


def error_message(e: BaseException, command: str | None) -> str | None:
    """The one line (without ``bayesncl: error:``) for ``e`` met by ``command``, or None for a bug."""
    oom = out_of_memory(e, command)
    if oom is not None:
        return oom
    if isinstance(e, user_errors()):
        return str(e)
    fault = os_fault(e)
    if fault is None and isinstance(e, (FileNotFoundError, PermissionError)):
        return str(e)  # raised without an errno: its own words
    return fault


def met_by_every_rank(e: BaseException) -> bool:
    """Whether every torchrun process of a node meets the user error ``e`` alike (same arguments, same
    files, or decided by rank 0 for all: run-dir checks, a non-finite loss, a full disk, as rank 0 alone
    writes the run dir): printed once per node, by its local rank 0. Other errors (an out-of-memory on
    one GPU, an image that cannot be decoded in one rank's shard) are printed by the rank meeting them,
    prefixed with "(rank N)". Alike: every :func:`user_errors` type but EvalError."""
    from bayesncl.data.sources import ShardDataError
    from bayesncl.metrics.inputs import EvalError

    return isinstance(e, user_errors()) and not isinstance(e, (EvalError, ShardDataError))


class _ReaderSafe:
    """A text stream whose reader may go away: on BrokenPipeError its file descriptor is pointed at
    ``os.devnull`` once and writing carries on (what is written after is lost, nothing stops)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _reader_gone(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._reader_gone()
            self.stream.flush()  # what was buffered, into devnull

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def readers_may_go() -> Iterator[None]:
    """sys.stdout and sys.stderr as :class:`_ReaderSafe` streams while a command runs (then flushed)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ReaderSafe(sys.stdout), _ReaderSafe(sys.stderr)  # type: ignore[assignment]
    try:
        yield
    finally:
        for safe in (sys.stdout, sys.stderr):
            safe.flush()  # a pipe's reader gone: its buffer goes to devnull now, not at exit
        sys.stdout, sys.stderr = saved


def _one_line_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> str:
    return f"bayesncl: warning: {shorten(str(message))}\n"


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    show, filters = warnings.formatwarning, list(warnings.filters)
    warnings.formatwarning = _one_line_warning
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 alone warns (as it alone prints)
        warnings.simplefilter("ignore")
    try:
        yield
    finally:
        warnings.formatwarning = show
        warnings.filters[:] = filters


# how a command continues an interrupted run, where it is not --resume
RESUME_VIA = {"reproduce": "the same command"}  # its store continues every unfinished run


def run_command(func: Callable[[], int], command: str | None) -> int:
    """``func()``'s exit status, or 2 after one line ``bayesncl: error: ...`` for an expected
    failure (see the module docstring); a bug raises. Under torchrun a failure every process meets
    alike is printed once per node, others with ``(rank N)``. Run it inside :func:`readers_may_go`."""
    with _one_line_warnings():
        try:
            return int(func() or 0)
        except KeyboardInterrupt as e:
            template = getattr(e, "template", None)  # a TrainingInterrupted: say how this command continues
            text = e.with_resume(template, RESUME_VIA.get(command or "", "--resume")) if template else str(e)
            if os.environ.get("RANK", "0") == "0":  # under torchrun, one line from rank 0 only
                print(f"bayesncl: interrupted{': ' + shorten(text) if text else ''}", file=sys.stderr)
            return int(getattr(e, "exit_code", 130))
        except Exception as e:
            message = error_message(e, command)
            if message is None:
                raise
            rank, local_rank = os.environ.get("RANK", "0"), os.environ.get("LOCAL_RANK", "0")
            if local_rank != "0" and out_of_memory(e, command) is None and met_by_every_rank(e):
                # under torchrun: the node's first process prints this very line; give it time to,
                # before torchrun ends the group on this exit
                time.sleep(2)
                return 2
            where = f"(rank {rank}) " if rank != "0" else ""
            sys.stderr.write(f"bayesncl: error: {where}{shorten(message)}\n")  # one write: ranks never mix
            return 2
