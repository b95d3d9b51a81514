"""Run directory and checkpoint state: atomic saves, RNG capture, safe loading, resume checks.

Everything a bit-identical resume needs lives in one checkpoint dict (format
:data:`CHECKPOINT_FORMAT`): model, optimiser, grad scaler, every RNG, epoch, step and the per-epoch
log. What is *not* stored, and why it need not be:

- the learning-rate schedule: a precomputed per-step array, a pure function of the config and
  ``step`` (``train.warmup_cosine``);
- the data order and augmentation: a function of ``(seed, epoch, rank)`` only
  (``TwoViewLoader.set_epoch``), also inside DataLoader workers, so worker RNGs need no state.

RNG states are stored as tensors and plain Python values so checkpoints load with
``torch.load(weights_only=True)``.

Reading files a user passes (:func:`load_checkpoint_file`) never runs code: ``.safetensors`` files
are read with safetensors, everything else with ``torch.load(weights_only=True)``; a pickle that
would import anything beyond tensors and plain values is refused with a one-line
:class:`CheckpointError`.

The files written at the end of training load elsewhere without bayesncl:

- ``encoder.safetensors``: ``safetensors.torch.load_file(path)`` → the model's full state dict;
  its metadata holds the resolved config as JSON (``safe_open(path, "pt").metadata()["config"]``).
- ``backbone_torchvision.pt`` (ResNet backbones): torchvision names without ``fc``. Load it with
  ``net = torchvision.models.resnet18(); net.fc = torch.nn.Identity();
  net.load_state_dict(torch.load(path, weights_only=True))`` (strict), or keep the fc and pass
  ``strict=False`` (the only missing keys are then ``fc.weight`` and ``fc.bias``). A CIFAR-stem or
  1-channel backbone first needs the same ``conv1`` (and, CIFAR stem, ``maxpool = Identity()``)
  as :func:`bayesncl.core.model.build_backbone` uses, else conv1's shape does not match.
"""

from __future__ import annotations

import csv
import errno
import os
import pickle
import random
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bayesncl.config import Config, config_from_dict, diff_configs
from bayesncl.runs.fileio import atomic_path, default_file_mode, remove_stale_temporaries

LOG_FIELDS = [
    "epoch",
    "step",
    "loss",
    "info_nce",
    "kl",
    "gate_open",
    "rho",
    "rows_all_closed",
    "online_acc",
    "lr",
    "epoch_time_s",
    # the held-out batch scored at the epoch's end (train.monitor_samples; empty when 0):
    # bayesncl.app.heldout.HELDOUT_FIELDS
    "heldout_sc",
    "heldout_h_sum",
    "heldout_active_dims",
    "heldout_effective_rank",
    "heldout_gate_open",
]
# steps.csv: one row every STEP_LOG_EVERY optimiser steps, the means over the steps since the
# previous row of the same epoch (epoch = step / steps per epoch, fractional)
STEP_LOG_FIELDS = ["step", "epoch", "loss", "info_nce", "kl", "gate_open", "online_acc", "lr"]
STEP_LOG_EVERY = 25  # also the CUDA loop's host-sync period: rows cost no extra synchronisation


CHECKPOINT_FORMAT = "bayesncl-checkpoint-v1"


class RunDirError(ValueError):
    """The run directory cannot be used as asked (exists, unwritable, config differs)."""


class CheckpointError(ValueError):
    """A file cannot be read as a checkpoint (missing, not a checkpoint, unsafe); one line."""


def rng_state() -> dict[str, Any]:
    # Only tensors and plain Python values, so checkpoints load with torch.load(weights_only=True).
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file in the same dir, then rename: never a half-written file."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed
    log: list[dict[str, Any]] = field(default_factory=list)
    step_log: list[dict[str, Any]] = field(default_factory=list)  # the rows of steps.csv
    # A run stopped inside an epoch (Ctrl-C, SIGTERM): {"n_seen": steps done in epoch+1, "sums": (6,)
    # running sums of the step statistics (means over processes), "elapsed": seconds, "window":
    # [means, n] at the last steps.csv row of the epoch}; else None.
    partial: dict[str, Any] | None = None
    steps_per_epoch: int = 0
    # Under DDP: every rank's RNG state (rank order), gathered at the save; rank 0's is also "rng".
    rng_ranks: list[dict[str, Any]] | None = None


def save_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: TrainState,
    cfg: Config,
) -> None:
    """Everything needed for a bit-identical resume, in one file (written atomically)."""
    atomic_save(
        {
            "format": CHECKPOINT_FORMAT,
            "config": cfg.to_dict(),
            "state_dict": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": state.epoch,
            "step": state.step,
            "log": state.log,
            "step_log": state.step_log,
            "partial": state.partial,
            "steps_per_epoch": state.steps_per_epoch,
            "rng_ranks": state.rng_ranks,
            "rng": rng_state(),
        },
        path,
    )


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0].strip() if text else type(e).__name__


def _refusal(path: Path, e: BaseException) -> CheckpointError:
    """Turn torch's multi-paragraph weights_only error into one line saying what was refused."""
    text = str(e)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        what = f"it would import and call {found.group(1)}, which can run code"
    elif (op := re.search(r"Unsupported operand (\d+)", text)) is not None:
        what = f"it holds pickle opcode {op.group(1)}, which plain tensor checkpoints do not use"
    else:
        what = _first_line(e).replace("WeightsUnpickler error: ", "")
    return CheckpointError(
        f"{path} was refused by the safe loader (torch.load weights_only=True): {what}; nothing in it "
        f"was run. Only tensors and plain values are accepted"
    )


def load_checkpoint_file(path: str | Path) -> Any:
    """Read a file a user passed, without ever running code from it.

    ``.safetensors`` → ``{name: tensor}`` (safetensors); anything else → the object stored by
    ``torch.save`` read with ``torch.load(weights_only=True, map_location="cpu")``.
    Raises CheckpointError (one line) if the file is missing, empty, not a checkpoint, truncated,
    damaged (a ``torch.save`` zip archive whose CRC-32 checksums do not match: a bad copy or disk
    error, which ``torch.load`` alone would read as wrong weights), or a pickle that would import
    anything beyond tensors and plain values.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory, not a checkpoint file")
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {_first_line(e)}") from None
    if not head:
        raise CheckpointError(f"{path} is empty, not a checkpoint")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
            raise CheckpointError(f"{path} is not a readable safetensors file ({_first_line(e)})") from None
    is_zip, is_pickle = head.startswith(b"PK\x03\x04"), head[:1] == b"\x80"
    if not (is_zip or is_pickle):
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle "
            f"(it starts with {head!r})"
        )
    if is_zip and _is_npz(path):
        raise CheckpointError(
            f"{path} is a NumPy .npz (a features file?), not a checkpoint: use `bayesncl metrics {path}`"
        )
    if is_zip and (bad := _damaged_member(path)) is not None:
        raise CheckpointError(
            f"{path} is damaged: the checksum of its record {bad} does not match (a partial copy or a "
            "disk error); use another copy, or an earlier checkpoint of the run (epoch-NNNN.pt)"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the error below says it all
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise _refusal(path, e) from None
        except Exception as e:  # noqa: BLE001 - truncated zips, bad records, ... all mean "unreadable"
            raise CheckpointError(
                f"{path} is not a readable PyTorch checkpoint (truncated or damaged? {_first_line(e)})"
            ) from None


def _damaged_member(path: Path) -> str | None:
    """The first record of a zip archive whose CRC-32 does not match its data (zipfile.testzip), or
    None. An archive zipfile cannot open is left to torch.load, which names what is wrong."""
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, UnicodeDecodeError):
        return None


def _is_npz(path: Path) -> bool:
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, UnicodeDecodeError):
        return False  # a damaged archive: torch.load names what is wrong
    return bool(names) and all(n.endswith(".npy") for n in names)


def is_bayesncl_checkpoint(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT


# What a bayesncl checkpoint holds: for its model (extract, evaluate), and also to resume from it.
_MODEL_ENTRIES: dict[str, type | tuple[type, ...]] = {"config": dict, "state_dict": dict}
_RESUME_ENTRIES: dict[str, type | tuple[type, ...]] = {
    "optimizer": dict, "scaler": dict, "epoch": int, "step": int, "log": list, "rng": dict,
}


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def check_checkpoint_entries(obj: dict[str, Any], path: Path, *, resume: bool = False) -> None:
    """Raise CheckpointError (one line) unless the bayesncl checkpoint ``obj`` read from ``path`` has
    the entries its model (and, ``resume``, a resume) needs, of the right kinds. A file with the
    format marker but a missing or edited entry used to end in a KeyError or TypeError traceback."""
    entries = {**_MODEL_ENTRIES, **(_RESUME_ENTRIES if resume else {})}
    for key, kind in entries.items():
        if key not in obj:
            raise CheckpointError(
                f"{path} is a {CHECKPOINT_FORMAT} checkpoint without its '{key}' entry (damaged or edited): "
                "use another copy, or an earlier checkpoint of the run (epoch-NNNN.pt)"
            )
        if not isinstance(obj[key], kind) or (kind is int and isinstance(obj[key], bool)):
            expected = "a mapping" if kind is dict else f"a {kind.__name__}"  # type: ignore[union-attr]
            raise CheckpointError(
                f"{path}: its '{key}' entry is {_a(type(obj[key]).__name__)}, expected {expected} "
                "(damaged or edited): use another copy, or an earlier checkpoint of the run (epoch-NNNN.pt)"
            )
    odd = [k for k, v in obj["state_dict"].items() if not isinstance(v, torch.Tensor)]
    if odd:
        raise CheckpointError(
            f"{path}: its 'state_dict' entry {odd[0]!r} is {_a(type(obj['state_dict'][odd[0]]).__name__)}, "
            "expected a tensor (damaged or edited): use another copy, or an earlier checkpoint of the run "
            "(epoch-NNNN.pt)"
        )


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _show(v: Any) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def describe_config_diff(old: Config, new: Config) -> str:
    """``"key: old -> new; ..."`` for every key whose value differs (but the resume-free keys)."""
    fo, fn = _flat(old.to_dict()), _flat(new.to_dict())
    return "; ".join(f"{k}: {_show(fo.get(k))} -> {_show(fn.get(k))}" for k in diff_configs(old, new))


def _check_writable(run_dir: Path) -> None:
    """Raise RunDirError unless ``run_dir`` exists as a writable directory or can be created.

    Writes nothing that stays: the test is a temporary file, created and removed at once, in the
    nearest existing folder (``os.access`` alone says yes to root even on a read-only mount)."""
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
        reason = e.strerror or _first_line(e)
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
)
# What a run writes into its run dir (interrupted.pt: older versions); --overwrite sets these, and
# nothing else, aside first.
RUN_ARTIFACTS = (
    "config.yaml", "log.csv", "steps.csv", "last.pt", "interrupted.pt", "epoch-*.pt", *RESULT_ARTIFACTS
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
    """--overwrite, first half: move a previous run's files (``RUN_ARTIFACTS`` and archived results)
    into a hidden ``run_dir/.replaced-PID/``, so the new run is not mixed with them but they are not
    lost yet. :func:`finish_overwrite` deletes them once the new run has its first checkpoint, or puts
    them back if it fails before. Nothing else in the folder is touched. Returns the folder, or None
    when there was nothing to move."""
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
    (:func:`lock_run_dir`), and finish an ``--overwrite`` a killed process left half done
    (:func:`recover_interrupted_overwrite`, which prints what it did). A killed holder's lock file goes."""
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
    """Finish an ``--overwrite`` whose process died without finishing it (SIGKILL, power loss), as
    it would have finished: its ``run_dir/.replaced-PID/`` goes back in place if the new run never
    wrote a checkpoint (``last.pt``) or the set-aside itself was cut short, and is deleted if the
    new run has a checkpoint. ``owner_gone``: this process holds the run dir's lock, so no other
    process is overwriting it; without it (no file locks here) folders whose process id is alive on
    this machine are left alone. Returns one message per folder handled."""
    done = []
    for aside in sorted(Path(run_dir).glob(".replaced-*")):
        pid = aside.name.removeprefix(".replaced-")
        if not (aside.is_dir() and pid.isdigit()) or (not owner_gone and _process_alive(int(pid))):
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
    run_dir = Path(run_dir)
    asides = [
        p for p in sorted(run_dir.glob(".replaced-*")) if p.is_dir()
        and p.name.removeprefix(".replaced-").isdigit()
        and not _process_alive(int(p.name.removeprefix(".replaced-")))  # not an --overwrite under way
    ] if run_dir.is_dir() else []
    if not asides:
        return ""
    return (
        f" (an --overwrite that was killed left the previous run in {asides[-1]}/: `bayesncl pretrain "
        f"--run-dir {run_dir} --resume` puts it back)"
    )


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
    """Claim ``run_dir`` (which must exist) for this process until ``release()``: an OS file lock
    (``fcntl.flock``) on ``run_dir/.bayesncl.lock``, which the OS drops if the process dies, so a
    SIGKILL leaves no stale claim. Returns None where file locks are unavailable (Windows, some
    network file systems): then nothing is checked.

    Raises RunDirError (one line, naming the holder's pid) if another process holds it: two
    commands writing one run dir would mix their files."""
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
    """After a fresh run failed before writing its first checkpoint (bad data found mid-epoch, a
    non-finite loss in epoch 1, a full disk, ...): remove what it wrote (``config.yaml``, ``steps.csv``,
    ``log.csv``, temporaries), and the run dir itself if this run created it and it is now empty, so the same
    command can simply be rerun.
    A run dir that holds a ``last.pt`` is left alone."""
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
    """Move the results of the ``epoch``-epoch run (``RESULT_ARTIFACTS``: exported encoder, metrics,
    evaluation, features, figures, dynamics) into ``run_dir/results-epoch-NNNN/`` before a --resume
    trains further, so the run dir never mixes results of two lengths and nothing is lost.

    Returns the folder, or None when there was nothing to move (e.g. the run had been interrupted).
    """
    run_dir = Path(run_dir)
    found = _files(run_dir, RESULT_ARTIFACTS)
    if not found:
        return None
    dest = run_dir / f"results-epoch-{epoch:04d}"
    n = 2
    while dest.exists():
        dest, n = run_dir / f"results-epoch-{epoch:04d}-{n}", n + 1
    return _move_into(found, dest)


def prepare_run_dir(run_dir: Path, cfg: Config, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check the run dir *before* anything is written. Returns the checkpoint to resume from or None.

    Raises RunDirError if another process is using it, if it already holds a run (without
    --resume/--overwrite), if --resume finds
    no checkpoint, an unreadable one or a config that differs (naming each key with its old and new
    value), or if the run dir cannot be written. On resume, temporary files left by a killed run
    are removed.
    """
    run_dir = Path(run_dir)
    _check_writable(run_dir)
    settle_run_dir(run_dir)
    # A run dir with only config.yaml holds a run killed before its first checkpoint: nothing to keep.
    has_run = holds_run(run_dir)
    if resume:
        ckpt_path = run_dir / "last.pt"
        if not ckpt_path.exists():
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
                unstarted = f" ({why}: {how})"  # (without --resume: "already holds a run; pass --resume")
            elif (run_dir / "config.yaml").exists():
                unstarted = (
                    " (the run stopped before its first checkpoint: run the same command without --resume)"
                )
            else:
                unstarted = ""
            raise RunDirError(f"--resume: no checkpoint {ckpt_path} to resume from{unstarted}")
        try:
            ckpt = load_checkpoint_file(ckpt_path)
        except CheckpointError as e:
            raise RunDirError(f"--resume: {e}") from None
        if not is_bayesncl_checkpoint(ckpt):
            raise RunDirError(f"--resume: {ckpt_path} is not a bayesncl checkpoint ({CHECKPOINT_FORMAT})")
        try:
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
        old = config_from_dict(ckpt["config"], ckpt_path)
        diff = describe_config_diff(old, cfg)
        if diff:
            raise RunDirError(
                f"--resume: the config differs from the run's in: {diff} (run's -> now); resume with "
                "the run's config (only train.epochs, train.progress, train.checkpoint_every, "
                "data.num_workers, data.root and eval.* may change) or start a new --run-dir"
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
        config_from_dict(load_run_yaml(path))
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


def write_log(run_dir: Path, rows: list[dict[str, Any]], name: str = "log.csv") -> None:
    """Write ``run_dir/log.csv`` (one row per epoch, ``LOG_FIELDS``) or, with ``name="steps.csv"``,
    the per-step log (``STEP_LOG_FIELDS``), atomically, with ``\\n`` line ends."""
    fields = STEP_LOG_FIELDS if name == "steps.csv" else LOG_FIELDS
    with atomic_path(run_dir / name) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})
