"""The training state a bit-identical resume needs, and its atomic save.

One checkpoint dict (format :data:`~bayesncl.runs.safe_load.CHECKPOINT_FORMAT`) holds the model,
optimiser, grad scaler, every RNG (as tensors and plain values: it loads with
``weights_only=True``), epoch, step and the logs. Not stored, as functions of what is: the lr
schedule (config, group, ``step``: ``core.optim.LrSchedule``) and the data order and augmentation
(``(seed, epoch, rank, step)``: ``TwoViewLoader.set_epoch``, so worker RNGs need no state).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bayesncl.config import Config
from bayesncl.core.engine import Cursor
from bayesncl.core.optim import Precision, cpu_flags
from bayesncl.runs.fileio import atomic_path
from bayesncl.runs.safe_load import CHECKPOINT_FORMAT


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


#: The environment variables that cap the instruction set of torch's own kernels, oneDNN's and MKL's.
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def kernel_record(device: torch.device) -> dict[str, Any]:
    """What decides a run's digits besides its config and seed: the torch build, the device, and on
    a CPU the kernels it dispatches to (torch's ``get_cpu_capability()``, e.g. ``"AVX2"`` or
    ``"AVX512"``; the CPU's vector flags, which oneDNN and MKL choose theirs by; the caps set in
    :data:`ISA_CAPS`) and the thread count (a reduction's split). Two machines that differ here
    compute other floats from step 1 on (CONFIG.md, "Not bitwise reproducible"). Plain values only."""
    rec: dict[str, Any] = {
        "torch": str(torch.__version__), "device": device.type, "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(device)
        return rec
    rec["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    rec["cpu_flags"] = " ".join(sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma"))))
    rec["caps"] = " ".join(f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k))
    return rec


def describe_kernels(rec: dict[str, Any]) -> str:
    """``torch 2.14.1+cu130, CPU AVX512 kernels (avx2 ... avx512f), 2 threads`` for a warning."""
    where = f"GPU {rec.get('gpu')}" if rec.get("device") == "cuda" else (
        f"CPU {rec.get('cpu_capability')} kernels ({rec.get('cpu_flags') or 'no vector flags'}"
        + (f"; {rec['caps']}" if rec.get("caps") else "") + ")"
    )
    threads = rec.get("threads")
    return f"torch {rec.get('torch')}, {where}, {threads} thread{'' if threads == 1 else 's'}"


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
    cursor: Cursor | None = None  # stopped inside epoch+1: where (core.engine.EpochResult.cursor)
    steps_per_epoch: int = 0
    # Under DDP: every rank's RNG state (rank order), gathered at the save; rank 0's is also "rng".
    rng_ranks: list[dict[str, Any]] | None = None
    precision: Precision | None = None  # what the run computes in (train.precision=auto resolved)
    # where it computed: kernel_record() with "from_step", one entry per change of machine (a resume)
    kernels: list[dict[str, Any]] = field(default_factory=list)


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
    state: TrainState, cfg: Config,
) -> None:
    """Everything needed for a bit-identical resume, in one file (written atomically)."""
    atomic_save({
        "format": CHECKPOINT_FORMAT, "config": cfg.to_dict(), "state_dict": model.state_dict(),
        "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "epoch": state.epoch,
        "step": state.step, "log": state.log, "step_log": state.step_log,
        "partial": state.cursor and state.cursor.to_dict(),
        "steps_per_epoch": state.steps_per_epoch, "rng_ranks": state.rng_ranks, "rng": rng_state(),
        "kernels": state.kernels,
        "precision": state.precision and {
            "dtype": state.precision.name, "channels_last": state.precision.channels_last,
        },
    }, path)  # fmt: skip
