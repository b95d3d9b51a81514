"""The run's CSV logs: ``log.csv`` (one row per epoch) and ``steps.csv`` (one row every
:data:`bayesncl.core.engine.STEP_LOG_EVERY` optimiser steps). Their statistic columns are those of
the statistics the run logs (:class:`bayesncl.core.methods.Statistic`: its method's,
``Method.logged``, or fine-tuning's), by name: a run without a gate has no gate column, a run
without labels no ``online_acc`` (:func:`log_columns`). A resumed run keeps its files' header
(:func:`resumed_header`), so a log written before every column of an ungated run was dropped keeps
its empty gate columns."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bayesncl.core.methods import CONTRASTIVE_STATS, MethodConfig, Statistic
from bayesncl.runs.fileio import atomic_path

# the held-out batch scored at the epoch's end by bayesncl.app.heldout (train.monitor_samples; empty when 0)
HELDOUT_FIELDS = [
    "heldout_sc", "heldout_h_sum", "heldout_active_dims", "heldout_effective_rank", "heldout_gate_open",
    "heldout_gate_mean_alpha",
]
HELDOUT_GATE_FIELDS = ("heldout_gate_open", "heldout_gate_mean_alpha")
"""The held-out columns of a run with a gate only."""


def heldout_fields(gated: bool) -> list[str]:
    """The ``heldout_*`` columns of a pretraining run: :data:`HELDOUT_FIELDS`, the gate's only
    ``gated``."""
    return [f for f in HELDOUT_FIELDS if gated or f not in HELDOUT_GATE_FIELDS]


def stat_columns(stats: Iterable[Statistic], per_step: bool = False) -> list[str]:
    """The columns of ``stats``: each name, then its reference key (log.csv only, ``per_step`` False;
    a key that several statistics refer to, once, after the first)."""
    cols: list[str] = []
    for s in stats:
        if per_step and not s.per_step:
            continue
        cols += [s.name] + ([s.reference] if s.reference and not per_step and s.reference not in cols else [])
    return cols


@dataclass(frozen=True)
class LogColumns:
    """The headers of a run's two logs: ``epoch`` log.csv's, ``step`` steps.csv's."""

    epoch: tuple[str, ...]
    step: tuple[str, ...]


def log_columns(stats: Sequence[Statistic], heldout: Sequence[str] = ()) -> LogColumns:
    """The columns of a run that logs ``stats`` (in order; ``Method.logged(method, labeled)`` for
    pretraining, ``FINETUNE_STATS`` for fine-tuning) and the held-out monitor's ``heldout``
    (:func:`heldout_fields`; none in fine-tuning): log.csv's
    ``epoch, step``, each statistic (and its reference key), ``lr, epoch_time_s``, ``heldout``;
    steps.csv's ``step, epoch``, the per-step statistics, ``lr``."""
    return LogColumns(
        ("epoch", "step", *stat_columns(stats), "lr", "epoch_time_s", *heldout),
        ("step", "epoch", *stat_columns(stats, per_step=True), "lr"),
    )


ADDED_COLUMNS = ("gate_mean_alpha",)
"""Statistic columns added after runs were first logged: a log without them is still a log (a run
logged before ``gate_mean_alpha``, whose soft gate's ``gate_open`` held mean α, docs/metrics.md)."""
LOG_FIELDS = list(log_columns(CONTRASTIVE_STATS, HELDOUT_FIELDS).epoch)
"""log.csv's columns for a built-in method with a gate, and those of every run logged before a run's
columns were its own statistics' (an ungated run's gate columns empty there)."""
# steps.csv: one row every STEP_LOG_EVERY optimiser steps, the means over the steps since the
# previous row of the same epoch (epoch = step / steps per epoch, fractional)
STEP_LOG_FIELDS = list(log_columns(CONTRASTIVE_STATS).step)


def read_header(path: Path) -> list[str] | None:
    """The header of the CSV file ``path`` (its first line's columns), or None where it does not
    exist or has none (an empty file, unreadable text)."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            return next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError):
        return None


def resumed_header(path: Path, columns: Sequence[str]) -> tuple[str, ...]:
    """The header a resumed run's log ``path`` (log.csv or steps.csv) is rewritten under: the file's
    (:func:`read_header`) where it holds each of the run's ``columns`` (an older log's further ones,
    e.g. an ungated run's empty gate columns, stay), else ``columns``: no file, a log from before one
    of them, or a header edited by hand or damaged (without ``lr`` no row could be written under it).
    Either way every row is rewritten from the checkpoint's."""
    header = read_header(path)
    if header and set(columns) <= set(header):
        return tuple(header)
    return tuple(columns)


def write_log(
    run_dir: Path, rows: list[dict[str, Any]], name: str = "log.csv", fields: Sequence[str] | None = None
) -> None:
    """Write ``run_dir/log.csv`` (one row per epoch) or, with ``name="steps.csv"``, the per-step log,
    atomically, with ``\\n`` line ends, under the header ``fields`` (the run's :class:`LogColumns`;
    None: ``LOG_FIELDS`` or ``STEP_LOG_FIELDS``). Columns the rows have beyond those go before ``lr``,
    in the rows' order (not one that is empty in every row: an older run's gate cells, resumed
    without its log.csv); a cell a row lacks is empty; ``lr`` has 6 significant digits."""
    fields = list(fields) if fields is not None else STEP_LOG_FIELDS if name == "steps.csv" else LOG_FIELDS
    more = list(dict.fromkeys(k for r in rows for k, v in r.items() if k not in fields and v != ""))
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
