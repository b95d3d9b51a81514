"""The features file: load, validate, save.

A NumPy ``.npz`` read with ``allow_pickle=False``: ``features`` (N, D) float32 z̃ and ``labels``
(N,) int64, optionally ``indices``, ``h`` (N, H), ``p``, ``z``, ``alpha``, ``mask`` (N, D),
``places`` (N,), ``factors`` (N, F) int generative factor codes (dSprites; their names in
``meta["factor_names"]``) and ``meta`` (0-d JSON string); the keys and their meaning:
docs/architecture.md, "Features file". A plain ``.npz`` with only ``features`` and ``labels`` is a
valid input everywhere. Every problem with a file is an :class:`~bayesncl.metrics.EvalError` (a
``ValueError``), one line saying what was found.
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bayesncl.metrics.inputs import EvalError, validate_features
from bayesncl.runs.fileio import atomic_path, write_failure_reason
from bayesncl.runs.safe_load import first_line

#: Optional per-row arrays of a features file, in the order they are stored.
OPTIONAL_ARRAYS = ("indices", "h", "p", "z", "alpha", "mask", "places", "factors")


@dataclass
class FeatureSet:
    """The contents of one features file. Optional fields are ``None`` when absent."""

    features: np.ndarray
    labels: np.ndarray
    indices: np.ndarray | None = None
    h: np.ndarray | None = None
    p: np.ndarray | None = None
    z: np.ndarray | None = None
    alpha: np.ndarray | None = None
    mask: np.ndarray | None = None
    places: np.ndarray | None = None
    factors: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def factor_names(self) -> list[str]:
        """The names of the ``factors`` columns (``meta["factor_names"]``; ``factor_<j>`` where absent)."""
        if self.factors is None:
            return []
        names = self.meta.get("factor_names")
        width = self.factors.shape[1] if self.factors.ndim == 2 else 1
        if isinstance(names, list) and len(names) == width:
            return [str(n) for n in names]
        return [f"factor_{j}" for j in range(width)]

    @property
    def num_samples(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])


def _parse_meta(raw: np.ndarray, path: Path) -> dict[str, Any]:
    if raw.dtype.kind not in "US" or raw.ndim != 0:
        raise EvalError(
            f"{path}: 'meta' must be a 0-d string array holding JSON; got dtype {raw.dtype} shape {raw.shape}"
        )
    text = str(raw[()])
    try:
        meta = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise EvalError(f"{path}: 'meta' is not valid JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(meta, dict):
        raise EvalError(f"{path}: 'meta' must hold a JSON object; got {type(meta).__name__}")
    return meta


def load_features(path: str | os.PathLike[str], threshold: float = 0.5) -> FeatureSet:
    """Load and validate a features file (or a plain ``.npz`` with ``features`` and ``labels``).

    ``mask`` is the 0/1 mask: a file written under ``eval.use_soft_gating`` before it stayed so holds
    α there, read as 1[α > ``threshold``], the run's gate threshold (``method.threshold``; pass it where
    the run's config is known, the default 0.5 is that key's default).
    Raises :class:`EvalError` naming what was found when the file is missing, is not an ``.npz``
    archive, lacks ``features`` or ``labels``, holds pickled objects, or has inconsistent shapes.
    """
    path = Path(path)
    if not path.exists():
        raise EvalError(f"features file not found: {path}")
    if path.is_dir():
        raise EvalError(f"{path} is a directory, not a features file (.npz)")
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head.startswith(b"\x93NUMPY"):
        shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
        raise EvalError(
            f"{path} is not a features file: it holds a single .npy array of shape {shape}; "
            "expected an .npz archive with 'features' and 'labels'"
        )
    if not head.startswith(b"PK"):
        raise EvalError(
            f"{path} is not a features file: not a NumPy .npz (zip) archive (first bytes {head!r})"
        )
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        reason = first_line(exc)
        raise EvalError(f"{path} is not a features file: cannot read it as .npz ({reason})") from exc
    with data:
        keys = sorted(data.files)
        missing = [k for k in ("features", "labels") if k not in keys]
        if missing and any(k.endswith("data.pkl") for k in keys):
            raise EvalError(
                f"{path} is a PyTorch checkpoint, not a features file: run `bayesncl extract {path}` first"
            )
        if missing:
            shown = keys[:8] + (["..."] if len(keys) > 8 else [])
            found = ", ".join(repr(k) for k in shown) or "no arrays"
            raise EvalError(
                f"{path} is not a features file: missing {' and '.join(repr(k) for k in missing)} "
                f"(found {found})"
            )
        arrays: dict[str, np.ndarray] = {}
        for key in ("features", "labels", *OPTIONAL_ARRAYS, "meta"):
            if key in keys:
                try:
                    value = data[key]
                except ValueError as exc:
                    if "allow_pickle" in str(exc):
                        raise EvalError(
                            f"{path}: array {key!r} holds Python objects (pickled); "
                            "features files must be plain numeric arrays"
                        ) from exc
                    raise EvalError(f"{path}: array {key!r} cannot be read: {first_line(exc)}") from exc
                except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                    raise EvalError(
                        f"{path}: array {key!r} cannot be read, the archive is damaged: {first_line(exc)}"
                    ) from exc
                if not isinstance(value, np.ndarray):  # a member that is not a .npy: NumPy gives its bytes
                    raise EvalError(f"{path}: member {key!r} is not a NumPy .npy array")
                arrays[key] = value
    feats = arrays["features"]
    f, y = validate_features(feats, arrays["labels"])
    n = f.shape[0]
    fs = FeatureSet(features=feats, labels=arrays["labels"].astype(np.int64, copy=False))
    for key in OPTIONAL_ARRAYS:
        if key in arrays:
            arr = arrays[key]
            if arr.ndim == 0 or arr.shape[0] != n:
                raise EvalError(f"{path}: {key!r} has shape {arr.shape} but features has {n} rows")
            setattr(fs, key, arr)
    if "meta" in arrays:
        fs.meta = _parse_meta(arrays["meta"], path)
    if fs.meta.get("soft_gating") and fs.mask is not None and not np.isin(fs.mask, (0, 1)).all():
        fs.mask = (fs.mask > threshold).astype(fs.mask.dtype)  # an older soft-gated file's mask held α
    return fs


def save_features(
    path: str | os.PathLike[str], *, features: Any, labels: Any, meta: dict[str, Any] | None = None,
    compress: bool = False, **arrays: Any,
) -> Path:
    """Write a features file atomically (``features`` float32, ``labels`` int64, the optional per-row
    ``arrays`` of :data:`OPTIONAL_ARRAYS`, tensors or NumPy, ``meta`` as 0-d JSON); its folder is
    created. Returns the path. Raises :class:`EvalError` for bad arrays, and (one line naming
    ``path`` and the reason) when the file cannot be written; nothing is left behind then.
    """
    path = Path(path)
    unknown = sorted(set(arrays) - set(OPTIONAL_ARRAYS))
    if unknown:
        raise EvalError(
            f"unknown features-file array(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONAL_ARRAYS)}"
        )
    f, y = validate_features(features, labels)
    out: dict[str, np.ndarray] = {"features": f.to(torch.float32).numpy(), "labels": y.numpy()}  # type: ignore[union-attr]
    n = f.shape[0]
    for key in OPTIONAL_ARRAYS:
        if key in arrays and arrays[key] is not None:
            val = arrays[key]
            arr = val.detach().cpu().numpy() if isinstance(val, torch.Tensor) else np.asarray(val)
            if arr.dtype == object:
                raise EvalError(f"{key!r} must be a numeric array; got dtype object")
            if arr.ndim == 0 or arr.shape[0] != n:
                raise EvalError(f"{key!r} has shape {arr.shape} but features has {n} rows")
            out[key] = arr
    if meta is not None:
        out["meta"] = np.array(json.dumps(meta, sort_keys=True))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp, tmp.open("wb") as fh:
            (np.savez_compressed if compress else np.savez)(fh, **out)
    except OSError as exc:
        reason = write_failure_reason(path, exc)
        raise EvalError(f"features file {path} cannot be written: {reason}") from None
    return path
