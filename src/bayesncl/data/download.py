"""Finding a dataset's folder, and downloading it with torchvision when ``data.download=true``: a
failed download leaves the disk as it was and raises one line."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bayesncl.data.sources import CACHE_DIR, DataError, SplitKey


def expand(p: str | Path) -> Path:
    """``p`` with ``~`` expanded."""
    return Path(os.path.expanduser(str(p)))


def candidates(root: str | None, subfolders: Sequence[str], first: Sequence[Path] = ()) -> list[Path]:
    """Where a dataset is looked for: ``base/sub`` for each of ``subfolders`` (``""``: ``base`` itself),
    ``base`` being ``data.root``, or without it each of ``first``, then ``./data``, then the cache."""
    bases = [expand(root)] if root else [*first, Path.cwd() / "data", expand(CACHE_DIR)]
    return [b / sub for b in bases for sub in subfolders]


def download(what: str, target: Path, fetch: Callable[[str], Any]) -> None:
    """Run torchvision's download ``fetch(str(target))``. On failure (offline, disk full, ...) remove
    every file and folder it created, so a failed download leaves the disk as it was, and raise a
    one-line DataError."""
    before = set(target.rglob("*")) if target.is_dir() else None
    try:
        fetch(str(target))
    except Exception as e:  # noqa: BLE001 - any network/IO failure becomes one line
        if before is None:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for new in sorted(set(target.rglob("*")) - before, reverse=True):  # children first
                with contextlib.suppress(OSError):
                    if new.is_dir() and not new.is_symlink():
                        new.rmdir()
                    else:
                        new.unlink()
        raise DataError(
            f"downloading {what} into {target} failed ({download_failure(e)}): copy the files there by "
            "hand, or set data.root"
        ) from None


def download_failure(e: BaseException) -> str:
    """Why a download failed, in one line. torchvision's MNIST-style error says it on later lines
    (``Error downloading X:`` / ``Tried MIRROR, got:`` / ``<urlopen error ...>``): the first line is
    completed with the distinct reasons; with none there, with the exception's cause, else with the
    usual one (no network, or the server refused)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    head = lines[0] if lines else ""
    if head and not head.endswith(":"):
        return head
    reasons = list(dict.fromkeys(line for line in lines[1:] if not line.endswith(":")))  # not "Tried X, got:"
    cause, seen = e.__cause__ or e.__context__, {id(e)}
    while not reasons and cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = str(cause).strip()
        if text:
            reasons = [text.splitlines()[0].strip()]
        cause = cause.__cause__ or cause.__context__
    if not head:
        return f"{type(e).__name__}: {reasons[0]}" if reasons else type(e).__name__
    return f"{head} {'; '.join(reasons) or 'no network connection, or the server refused it'}"


def find_or_fetch(
    what: str, k: SplitKey, subfolders: Sequence[str], has: Callable[[Path], bool],
    fetch: Callable[[str], None], first: Sequence[Path] = (),
) -> Path | None:
    """The first of the :func:`candidates` folders that ``has`` the dataset; with ``data.download``
    and none found, download into ``data.root`` (or the cache dir) first."""

    def find(root: str | None) -> Path | None:
        return next((d for d in candidates(root, subfolders, first) if d.is_dir() and has(d)), None)

    d = find(k.root)
    if d is None and k.download:
        target = expand(k.root or CACHE_DIR)
        download(what, target, fetch)
        d = find(str(target))
    return d
