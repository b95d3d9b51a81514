"""The run's CSV logs: ``log.csv`` (one row per epoch) and ``steps.csv`` (one row every
:data:`bayesncl.core.engine.STEP_LOG_EVERY` optimiser steps). Their statistic columns are the
method's statistics (:class:`bayesncl.core.methods.Statistic`), by name."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bayesncl.core.configs import MethodConfig
from bayesncl.core.methods import CONTRASTIVE_STATS, Statistic
from bayesncl.runs.fileio import atomic_path

# the held-out batch scored at the epoch's end by bayesncl.app.heldout (train.monitor_samples; empty when 0)
HELDOUT_FIELDS = [
    "heldout_sc", "heldout_h_sum", "heldout_active_dims", "heldout_effective_rank", "heldout_gate_open",
    "heldout_gate_mean_alpha",
]


def stat_columns(stats: Iterable[Statistic], per_step: bool = False) -> list[str]:
    """The columns of ``stats``: each name, then its reference key (log.csv only, ``per_step`` False;
    a key that several statistics refer to, once, after the first)."""
    cols: list[str] = []
    for s in stats:
        if per_step and not s.per_step:
            continue
        cols += [s.name] + ([s.reference] if s.reference and not per_step and s.reference not in cols else [])
    return cols


ADDED_COLUMNS = ("gate_mean_alpha",)
"""Statistic columns added after runs were first logged: a log without them is still a log (a run
logged before ``gate_mean_alpha``, whose soft gate's ``gate_open`` held mean α, docs/metrics.md)."""
LOG_FIELDS = ["epoch", "step", *stat_columns(CONTRASTIVE_STATS), "lr", "epoch_time_s", *HELDOUT_FIELDS]
"""log.csv's columns for a built-in method; a method's further statistics go before ``lr``."""
# steps.csv: one row every STEP_LOG_EVERY optimiser steps, the means over the steps since the
# previous row of the same epoch (epoch = step / steps per epoch, fractional)
STEP_LOG_FIELDS = ["step", "epoch", *stat_columns(CONTRASTIVE_STATS, per_step=True), "lr"]


def write_log(run_dir: Path, rows: list[dict[str, Any]], name: str = "log.csv") -> None:
    """Write ``run_dir/log.csv`` (one row per epoch, ``LOG_FIELDS``) or, with ``name="steps.csv"``,
    the per-step log (``STEP_LOG_FIELDS``), atomically, with ``\\n`` line ends. Columns the rows have
    beyond those (a method's own statistics) go before ``lr``, in the rows' order; ``lr`` has 6
    significant digits."""
    fields = STEP_LOG_FIELDS if name == "steps.csv" else LOG_FIELDS
    more = list(dict.fromkeys(k for r in rows for k in r if k not in fields))
    at = fields.index("lr")
    fields = [*fields[:at], *more, *fields[at:]]
    with atomic_path(run_dir / name) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in rows:  # lr to 6 significant digits: 0.30000000000000004 -> 0.3 (the checkpoint keeps all)
            cells = {k: r.get(k, "") for k in fields}
            w.writerow({**cells, "lr": f"{cells['lr']:.6g}"} if isinstance(cells["lr"], float) else cells)


def _cells(stats: Sequence[Statistic], means: dict[str, float], per_step: bool) -> dict[str, Any]:
    """The statistics' cells; a NaN mean (an epoch resumed from a checkpoint older than its statistic,
    :func:`bayesncl.core.engine.train_one_epoch`) an empty one."""
    return {
        s.name: "" if math.isnan(means[s.name]) else round(100 * means[s.name], 3) if s.percent
        else round(means[s.name], 6)
        for s in stats if s.name in means and (s.per_step or not per_step)
    }


def epoch_row(
    epoch: int, step: int, stats: Sequence[Statistic], means: dict[str, float], method: MethodConfig,
    lr: float, seconds: float,
) -> dict[str, Any]:
    """A log.csv row for epoch ``epoch`` (1-based): ``means`` are the epoch's means of the method's
    ``stats`` (a percent one × 100; one not in ``means``, e.g. a gate's without a gate, an empty
    cell), beside each logged statistic its reference key's ``method`` value."""
    refs = {s.reference: getattr(method, s.reference) for s in stats if s.reference and s.name in means}
    return {"epoch": epoch, "step": step, **_cells(stats, means, False), **refs, "lr": lr,
            "epoch_time_s": round(seconds, 2)}


def step_row(
    step: int, steps_per_epoch: int, stats: Sequence[Statistic], means: dict[str, float], lr: float
) -> dict[str, Any]:
    """A steps.csv row: ``means`` of ``stats`` over the epoch's steps since the previous row."""
    return {"step": step, "epoch": round(step / steps_per_epoch, 4), **_cells(stats, means, True), "lr": lr}
