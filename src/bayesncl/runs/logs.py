"""The run's CSV logs: ``log.csv`` (one row per epoch) and ``steps.csv`` (one row every
:data:`bayesncl.core.engine.STEP_LOG_EVERY` optimiser steps)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from bayesncl.runs.fileio import atomic_path

LOG_FIELDS = [
    "epoch", "step", "loss", "info_nce", "kl", "gate_open", "rho", "rows_all_closed", "online_acc", "lr",
    "epoch_time_s",
    # the held-out batch scored at the epoch's end (train.monitor_samples; empty when 0):
    # bayesncl.app.heldout.HELDOUT_FIELDS
    "heldout_sc", "heldout_h_sum", "heldout_active_dims", "heldout_effective_rank", "heldout_gate_open",
]
# steps.csv: one row every STEP_LOG_EVERY optimiser steps, the means over the steps since the
# previous row of the same epoch (epoch = step / steps per epoch, fractional)
STEP_LOG_FIELDS = ["step", "epoch", "loss", "info_nce", "kl", "gate_open", "online_acc", "lr"]


def write_log(run_dir: Path, rows: list[dict[str, Any]], name: str = "log.csv") -> None:
    """Write ``run_dir/log.csv`` (one row per epoch, ``LOG_FIELDS``) or, with ``name="steps.csv"``,
    the per-step log (``STEP_LOG_FIELDS``), atomically, with ``\\n`` line ends."""
    fields = STEP_LOG_FIELDS if name == "steps.csv" else LOG_FIELDS
    with atomic_path(run_dir / name) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in fields})


def epoch_row(
    epoch: int, step: int, stats: dict[str, float], lr: float, seconds: float, rho: float | str
) -> dict[str, Any]:
    """A log.csv row for epoch ``epoch`` (1-based): ``stats`` are the epoch's means
    (``core.engine.STATS``; online_acc becomes a percentage), ``rho`` the gate's target ("" if none)."""
    return {
        "epoch": epoch, "step": step,
        **{k: round(stats[k], 6) for k in ("loss", "info_nce", "kl", "gate_open")}, "rho": rho,
        "rows_all_closed": round(stats["rows_all_closed"], 6),
        "online_acc": round(100 * stats["online_acc"], 3), "lr": lr, "epoch_time_s": round(seconds, 2),
    }


def step_row(step: int, steps_per_epoch: int, means: dict[str, float], lr: float) -> dict[str, Any]:
    """A steps.csv row: ``means`` over the epoch's steps since the previous row (``core.engine.STATS``)."""
    return {
        "step": step, "epoch": round(step / steps_per_epoch, 4),
        **{k: round(means[k], 6) for k in ("loss", "info_nce", "kl", "gate_open")},
        "online_acc": round(100 * means["online_acc"], 3), "lr": lr,
    }
