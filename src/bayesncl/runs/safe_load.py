"""Reading checkpoint files without running code from them, and checking a bayesncl checkpoint's entries.

Reading files a user passes (:func:`load_checkpoint_file`) never runs code: ``.safetensors`` files
are read with safetensors, everything else with ``torch.load(weights_only=True)``; a pickle that
would import anything beyond tensors and plain values is refused with a one-line
:class:`CheckpointError`. :func:`check_checkpoint_entries` turns a bayesncl checkpoint
(:data:`CHECKPOINT_FORMAT`) with a missing or edited entry into one line too.
"""

from __future__ import annotations

import pickle
import re
import reprlib
import warnings
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_FORMAT = "bayesncl-checkpoint-v1"


class CheckpointError(ValueError):
    """A file cannot be read as a checkpoint (missing, not a checkpoint, unsafe); one line."""


class NotACheckpoint(CheckpointError):
    """A file that does not read as a checkpoint (:func:`load_checkpoint_file`): empty, neither a
    torch.save archive nor a pickle, a safetensors file or zip archive that does not read, a truncated
    or damaged checkpoint, a NumPy .npz, a pickle the safe loader refuses. ``reason`` says what the
    file is, or why it does not read; the message adds what to do where one thing always fits (another
    copy of a damaged file, ``metrics`` for an .npz). What to do depends on why the file was given: a
    caller that knows (``finetune --resume``, ``reproduce``'s stored runs) says it after ``reason``."""

    def __init__(self, reason: str, advice: str = "") -> None:
        super().__init__(reason + advice)
        self.reason = reason


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name when the message is empty."""
    text = str(e).strip()
    return text.splitlines()[0].strip() if text else type(e).__name__


def _refusal(path: Path, e: BaseException) -> NotACheckpoint:
    """Turn torch's multi-paragraph weights_only error into one line saying what was refused."""
    text = str(e)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        what = f"it would import and call {found.group(1)}, which can run code"
    elif (op := re.search(r"Unsupported operand (\d+)", text)) is not None:
        what = f"it holds pickle opcode {op.group(1)}, which plain tensor checkpoints do not use"
    else:
        what = first_line(e).replace("WeightsUnpickler error: ", "")
    return NotACheckpoint(
        f"{path} was refused by the safe loader (torch.load weights_only=True): {what}",
        "; nothing in it was run. Only tensors and plain values are accepted",
    )


def load_checkpoint_file(path: str | Path) -> Any:
    """Read a file a user passed, without ever running code from it.

    ``.safetensors`` → ``{name: tensor}``; anything else → ``torch.load(weights_only=True,
    map_location="cpu")``. Raises CheckpointError (one line) if the file is missing, empty, not a
    checkpoint, truncated, damaged (CRC-32 mismatch in its zip, which ``torch.load`` alone would read
    as wrong weights), or a pickle that would import anything beyond tensors and plain values.
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
        raise CheckpointError(f"cannot read {path}: {first_line(e)}") from None
    if not head:
        raise NotACheckpoint(f"{path} is empty, not a checkpoint")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for bad files
            raise NotACheckpoint(f"{path} is not a readable safetensors file ({first_line(e)})") from None
    is_zip, is_pickle = head.startswith(b"PK\x03\x04"), head[:1] == b"\x80"
    if not (is_zip or is_pickle):
        raise NotACheckpoint(
            f"{path} is not a PyTorch checkpoint: neither a torch.save zip archive nor a pickle "
            f"(it starts with {head!r})"
        )
    npz, bad = _zip_facts(path) if is_zip else (False, None)
    if npz:
        raise NotACheckpoint(
            f"{path} is a NumPy .npz (a features file?), not a checkpoint", f": use `bayesncl metrics {path}`"
        )
    if bad is not None:
        raise NotACheckpoint(
            f"{path} is damaged: the checksum of its record {bad} does not match (a partial copy or a "
            "disk error)", "; use another copy, or an earlier checkpoint of the run (epoch-NNNN.pt)"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "Detected pickle protocol 4": the error below says it all
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise _refusal(path, e) from None
        except Exception as e:  # noqa: BLE001 - truncated zips, bad records, ... all mean "unreadable"
            raise NotACheckpoint(
                f"{path} is not a readable PyTorch checkpoint (truncated or damaged? {first_line(e)})"
            ) from None


def _zip_facts(path: Path) -> tuple[bool, str | None]:
    """``(a NumPy .npz?, its first record whose CRC-32 does not match, zipfile.testzip)`` of a zip
    archive; one zipfile cannot open is neither (torch.load then names what is wrong)."""
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if names and all(n.endswith(".npy") for n in names):
                return True, None
            return False, z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, UnicodeDecodeError):
        return False, None


def is_bayesncl_checkpoint(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT


# What a bayesncl checkpoint holds: for its model (extract, evaluate), and also to resume from it.
_MODEL_ENTRIES: dict[str, type | tuple[type, ...]] = {"config": dict, "state_dict": dict}
_RESUME_ENTRIES: dict[str, type | tuple[type, ...]] = {
    "optimizer": dict, "scaler": dict, "epoch": int, "step": int, "steps_per_epoch": int, "log": list,
    "step_log": list, "rng": dict,
}


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def check_checkpoint_entries(obj: dict[str, Any], path: Path, *, resume: bool = False) -> None:
    """Raise CheckpointError (one line) unless the bayesncl checkpoint ``obj`` read from ``path`` has
    the entries its model (and, ``resume``, a resume, with its ``precision`` if recorded) needs, of the
    right kinds. A file with the format marker but a missing or edited entry used to end in a
    KeyError or TypeError traceback."""
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
    precision = obj.get("precision")  # what the run trained in; None or absent: not recorded
    if resume and precision is not None and not (
        isinstance(precision, dict) and precision.get("dtype") in ("fp32", "bf16", "fp16")
        and isinstance(precision.get("channels_last"), bool)
    ):
        raise CheckpointError(
            f"{path}: its 'precision' entry is {reprlib.repr(precision)}, expected a mapping of 'dtype' "
            "(fp32, bf16 or fp16) and 'channels_last' (true or false) (damaged or edited): use another copy, "
            "or an earlier checkpoint of the run (epoch-NNNN.pt)"
        )
    odd = [k for k, v in obj["state_dict"].items() if not isinstance(v, torch.Tensor)]
    if odd:
        raise CheckpointError(
            f"{path}: its 'state_dict' entry {odd[0]!r} is {_a(type(obj['state_dict'][odd[0]]).__name__)}, "
            "expected a tensor (damaged or edited): use another copy, or an earlier checkpoint of the run "
            "(epoch-NNNN.pt)"
        )
