"""What a run dir holds (its layout: :data:`RUN_ARTIFACTS`, :data:`RESULT_ARTIFACTS`, the markers
of a run), whether one can be written, and moving results aside (a longer ``--resume``).

Layout: ``config.yaml`` (the resolved config), ``log.csv`` and ``steps.csv`` (``runs.logs``, written
after their checkpoint), ``last.pt`` (``runs.state``, atomic), ``epoch-NNNN.pt`` every
``train.checkpoint_every`` epochs, then the results (:data:`RESULT_ARTIFACTS`: the export, metrics,
figures); ``.bayesncl.lock`` (:data:`LOCK_NAME`) while a process owns it.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from bayesncl.core.plugins import PLUGINS_FILE
from bayesncl.runs.fileio import remove_stale_temporaries
from bayesncl.runs.messages import RunDirError

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
    "sparsity.png",
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


LOCK_NAME = ".bayesncl.lock"


# The files that mark a folder as holding a run: a checkpoint, a log or an export.
RUN_MARKERS = ("last.pt", "log.csv", "encoder.safetensors")


def artifact_files(run_dir: Path, patterns: tuple[str, ...]) -> list[Path]:
    return [p for pattern in patterns for p in sorted(Path(run_dir).glob(pattern)) if p.is_file()]


def move_into(paths: list[Path], dest: Path) -> Path:
    dest.mkdir(exist_ok=True)
    for p in paths:
        os.replace(p, dest / p.name)
    return dest


def run_markers(run_dir: Path) -> list[str]:
    """The :data:`RUN_MARKERS` that ``run_dir`` holds, in that order: none where it holds no run (with
    only ``config.yaml``, a run killed before its first checkpoint: nothing to keep)."""
    return [name for name in RUN_MARKERS if (Path(run_dir) / name).exists()]


def refuse_a_run_in(run_dir: Path, command: str) -> None:
    """``demo``/``reproduce`` train in ``run_dir``'s folders: raise RunDirError if ``run_dir`` itself
    holds a (pretrain) run, which they would be mixed in with (the mirror of prepare_run_dir's check
    for runs in a pretrain run dir's folders)."""
    if found := run_markers(run_dir):
        raise RunDirError(
            f"run dir {run_dir} holds a pretrain run ({', '.join(found)}): {command}'s runs in its folders "
            "would be mixed in with it; choose another --run-dir"
        )


def check_writable(run_dir: Path) -> None:
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


def archive_results(run_dir: Path, epoch: int) -> Path | None:
    """Move the results of the ``epoch``-epoch run (``RESULT_ARTIFACTS``) into
    ``run_dir/results-epoch-NNNN/`` before a --resume trains further (results of two lengths never
    mix). Returns the folder, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    found = artifact_files(run_dir, RESULT_ARTIFACTS)
    if not found:
        return None
    dest = run_dir / f"results-epoch-{epoch:04d}"
    n = 2
    while dest.exists():
        dest, n = run_dir / f"results-epoch-{epoch:04d}-{n}", n + 1
    return move_into(found, dest)


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
