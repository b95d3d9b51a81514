"""Run directory and checkpoint state: atomic saves, RNG capture, safe loading, resume checks.

Everything a bit-identical resume needs lives in one checkpoint dict (DESIGN.md "Resume"):
model, optimiser, grad scaler, every RNG, epoch, step and the per-epoch log. RNG states are stored
as tensors and plain Python values so checkpoints load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bayesncl.config import Config, config_from_dict, diff_configs

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
]


class RunDirError(ValueError):
    """The run directory cannot be used as asked (exists, unwritable, config differs)."""


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
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@dataclass
class TrainState:
    epoch: int = 0  # epochs completed
    step: int = 0  # optimiser steps completed
    log: list[dict[str, Any]] = field(default_factory=list)


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
            "format": "bayesncl-checkpoint-v1",
            "config": cfg.to_dict(),
            "state_dict": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "epoch": state.epoch,
            "step": state.step,
            "log": state.log,
            "rng": rng_state(),
        },
        path,
    )


def prepare_run_dir(run_dir: Path, cfg: Config, *, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """Check the run dir *before* anything is written. Returns the checkpoint to resume from or None.

    Raises RunDirError if it already holds a run (without --resume/--overwrite), if --resume finds
    no checkpoint or a config that differs (naming the keys), or if it is not writable.
    """
    has_run = (run_dir / "config.yaml").exists() or (run_dir / "last.pt").exists()
    if resume:
        ckpt_path = run_dir / "last.pt"
        if not ckpt_path.exists():
            raise RunDirError(f"--resume: no checkpoint {ckpt_path} to resume from")
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        old = config_from_dict(ckpt["config"])
        diff = diff_configs(old, cfg)
        if diff:
            pairs = ", ".join(f"{k}" for k in diff)
            raise RunDirError(f"--resume: the config differs from the run's in: {pairs}")
        return ckpt
    if has_run and not overwrite:
        raise RunDirError(
            f"run dir {run_dir} already holds a run; pass --resume to continue it, "
            "--overwrite to replace it, or choose another --run-dir"
        )
    probe = run_dir if run_dir.exists() else next((p for p in run_dir.parents if p.exists()), Path("."))
    if not os.access(probe, os.W_OK):
        raise RunDirError(f"run dir {run_dir} is not writable (no write permission on {probe})")
    return None


def write_log(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    tmp = run_dir / ".log.csv.tmp"
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=LOG_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in LOG_FIELDS})
    os.replace(tmp, run_dir / "log.csv")
