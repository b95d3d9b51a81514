"""Training curves: the per-epoch log (``log.csv``) of one run or several, as one figure.

A panel against the epoch for each statistic with a title (a
:class:`bayesncl.core.methods.Statistic` of a registered method) that some run logged: InfoNCE
(nats), online probe accuracy (%) (a fine-tuning run's log: its train accuracy, titled by
:data:`~bayesncl.core.methods.FINETUNE_STATS`, :func:`log_statistics`), a method's own statistics
and, for gated runs, the KL term (:func:`bayesncl.core.losses.bernoulli_kl`, nats), the gate-open
rate (share of α > threshold) and the mean gate probability α, each with the prior ρ dashed
(PAPER-NOTES §1; docs/metrics.md, "The gate"). Markers are the epoch means; where the run has a
``steps.csv`` (a row every ``STEP_LOG_EVERY`` steps) a thin line of the same colour follows them.
One legend under the panels names each run once; where the runs are seeds of a few variants (labels
ending in ``seed N``, as ``reproduce`` names them), a variant's seeds share its colour, each seed
its marker, and the legend names each variant once (:func:`run_styles`). ``pretrain`` and
``finetune`` write ``training_curves.png``, demo and ``reproduce`` ``curves.png``; ``bayesncl curves
RUN_DIR ...`` draws any runs.
"""

from __future__ import annotations

import csv
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bayesncl.core import methods
from bayesncl.core.engine import STEP_LOG_EVERY
from bayesncl.runs.fileio import write_failure_reason
from bayesncl.runs.lock import set_aside_hint
from bayesncl.runs.logs import ADDED_COLUMNS, log_columns, stat_columns
from bayesncl.runs.messages import RunDirError

__all__ = [
    "read_log", "read_steps", "run_label", "run_styles", "training_curves_figure", "write_training_curves",
]


SEED_LABEL = re.compile(r"^(?P<variant>.+?)[\s|,]*\bseed[\s=]?(?P<seed>\d+)$")
"""A run label that ends in its seed: ``NCL seed 0``, ``CL | p=0.9 | seed=2``."""
MARKERS = "os^Dv<>ph*"


def run_styles(labels: Sequence[str]) -> tuple[list[tuple[int, str, str]], dict[int, str]]:
    """Per run label ``(colour index, marker, legend label)``, and ``{seed: marker}`` for the legend.

    Where every label ends in a seed (:data:`SEED_LABEL`) and some variant has several, the seeds of a
    variant share its colour (indices in order of first appearance), seed ``s`` gets marker
    ``MARKERS[s % 10]``, and only a variant's first run carries its name (the others ``_``: no legend
    entry); otherwise each run its own colour index, marker ``o`` and label, and no seed markers."""
    found = [SEED_LABEL.match(label) for label in labels]
    variants = [m["variant"] for m in found if m]
    if len(variants) < len(labels) or len(set(variants)) == len(labels):
        return [(i, "o", label) for i, label in enumerate(labels)], {}
    order = list(dict.fromkeys(variants))
    seeds = {int(m["seed"]): MARKERS[int(m["seed"]) % len(MARKERS)] for m in found if m}
    named: set[str] = set()
    styles = []
    for m in found:
        assert m is not None
        v = m["variant"]
        styles.append((order.index(v), seeds[int(m["seed"])], "_" + v if v in named else v))
        named.add(v)
    return styles, dict(sorted(seeds.items()))


def panels() -> list[methods.Statistic]:
    """The statistics with a panel: those of the built-in methods (ungated first), then any other
    registered method's."""
    stats = [s for s in methods.all_statistics().values() if s.title]
    return sorted(stats, key=lambda s: s.gated)


def log_statistics(rows: Sequence[Mapping[str, float]]) -> dict[str, methods.Statistic]:
    """The statistics a log's ``rows`` (:func:`read_log` or :func:`read_steps`) hold, by name: a
    fine-tuning run's (:data:`~bayesncl.core.methods.FINETUNE_STATS`: its ``online_acc`` is the
    classifier's train accuracy) where the log is a fine-tuning run's (:func:`_finetuning_log`), else
    the registered methods' (:func:`~bayesncl.core.methods.all_statistics`: ``online_acc`` the online
    probe's)."""
    if rows and _finetuning_log(rows):
        return {s.name: s for s in methods.FINETUNE_STATS}
    return methods.all_statistics()


def _finetuning_log(rows: Sequence[Mapping[str, float]]) -> bool:
    """Whether ``rows`` are a fine-tuning run's log.csv or steps.csv: exactly its columns (a
    pretraining log also has its method's terms, and its log.csv the held-out columns), or a log
    written before a run's columns were its own statistics' (issue 45; a --resume keeps that header):
    the built-in methods' header (``runs.logs.LOG_FIELDS``, ``STEP_LOG_FIELDS``, perhaps without
    ``ADDED_COLUMNS``) with a number in fine-tuning's columns only (a pretraining run's has its loss
    term's, e.g. ``info_nce``, too)."""
    header = set(rows[0])
    filled = {k for k in header if _has(rows, k)}
    own = log_columns(methods.FINETUNE_STATS)
    for cols, per_step in ((own.epoch, False), (own.step, True)):
        built_in = set(stat_columns(methods.CONTRASTIVE_STATS, per_step)) - set(ADDED_COLUMNS)
        if header == set(cols) or (built_in <= header and filled == set(cols)):
            return True
    return False


def _panel_title(name: str, runs: Mapping[str, Sequence[Mapping[str, float]]],
                 stats: Mapping[str, Mapping[str, methods.Statistic]]) -> str:
    """The title of the panel of statistic ``name``: its title in the statistics of each run that
    logged it (``stats``, :func:`log_statistics` by run), each title once, one a line."""
    titles = [stats[r][name].title for r, rows in runs.items() if name in stats[r] and _has(rows, name)]
    return "\n".join(dict.fromkeys(t for t in titles if t))


def _gated(rows: Sequence[Mapping[str, float]]) -> bool:
    """Whether a run had a gate: a number in a gate statistic's reference column (its ρ)."""
    return any(_has(rows, s.reference) for s in methods.all_statistics().values() if s.gated and s.reference)

# the held-out batch scored at each epoch's end (bayesncl.app.heldout), a second row where logged
HELDOUT_PANELS = (
    ("heldout_sc", "held-out SC (%)"), ("heldout_h_sum", "held-out H_sum (nats)"),
    ("heldout_active_dims", "held-out active dims"), ("heldout_effective_rank", "held-out effective rank"),
)


def read_log(source: str | Path) -> list[dict[str, float]]:
    """Rows of a run's ``log.csv`` as floats (an empty cell, e.g. ``rho`` of an ungated run, is NaN).

    source: a run dir or a ``log.csv`` path. returns: one dict per logged epoch, in file order,
    keyed by the file's columns (its run's statistics: no gate column for a run without a gate, and
    in a log written before that the gate's columns empty, i.e. NaN). Raises RunDirError (one line)
    if there is no log, a column of :data:`REQUIRED` is missing, a cell is not a number, or no epoch
    is logged.
    """
    path = Path(source)
    if path.is_dir():
        path = path / "log.csv"
    if path.name == "steps.csv":
        raise RunDirError(f"{path} is the per-step log: pass its run dir or its log.csv")
    if not path.is_file():
        if path.name == "log.csv":
            where = f"{path.parent} has no log.csv"
        else:  # a mistyped run dir is no file either, but "not a file" suggests it is a folder
            where = f"{path} {'is not a file' if path.exists() else 'does not exist'}"
        raise RunDirError(
            f"{where}: expected a run dir (or its log.csv) with at least one finished epoch"
            + set_aside_hint(path.parent)
        )
    rows = _read_csv(path, "epoch,step,loss,<the run's statistics>,lr,epoch_time_s")
    if not rows:
        raise RunDirError(f"{path}: no epoch has finished yet (the log has a header only)")
    return rows


def read_steps(run_dir: str | Path) -> list[dict[str, float]]:
    """Rows of ``run_dir/steps.csv`` as floats (its columns), or [] where the run has none
    (fewer than 25 steps so far, or a run from before the per-step log). Raises RunDirError like
    :func:`read_log` for a malformed file."""
    path = Path(run_dir) / "steps.csv"
    return _read_csv(path, "step,epoch,loss,<the run's statistics>,lr") if path.is_file() else []


def _read_csv(path: Path, expected: str) -> list[dict[str, float]]:
    """The rows of the log ``path`` as floats; ``expected``: its header, as a RunDirError says it."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:  # (a byte-order mark from an editor)
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = _missing_columns(header)
            if missing:
                no = ", ".join(missing)
                raise RunDirError(f"{path}: not a bayesncl log (no column {no}; expected {expected})")
            rows = []
            for line, r in enumerate(reader, start=2):
                if None in r or None in r.values():
                    raise RunDirError(f"{path} line {line}: expected {len(header)} fields, as in its header")
                rows.append({k: _number(v, path, line, k) for k, v in r.items()})
            return rows
    except UnicodeDecodeError:
        raise RunDirError(f"{path}: not a bayesncl log (not UTF-8 text)") from None


REQUIRED = ("epoch", methods.LOSS.name)
"""The columns every bayesncl log has (its x, every run's first statistic: a method's loss or
fine-tuning's cross-entropy); the others are the run's own statistics (an ungated run has no gate
column, a log written before issue 45 has them empty), read where present."""


def _missing_columns(header: Sequence[str]) -> list[str]:
    """What a log lacks to be a bayesncl log (of :data:`REQUIRED`); [] for a log."""
    return [k for k in REQUIRED if k not in header]


def _number(value: str | None, path: Path, line: int, column: str) -> float:
    if value is None or value.strip() == "":
        return math.nan
    try:
        return float(value)
    except ValueError:
        raise RunDirError(f"{path} line {line}: {column}={value!r} is not a number") from None


def run_label(paths: Sequence[Path]) -> list[str]:
    """Legend labels for run dirs: the folder name, or the whole path where names repeat."""
    names = [Path(p).name or str(p) for p in paths]
    return [n if names.count(n) == 1 else str(p) for n, p in zip(names, paths, strict=True)]


def _has(rows: Sequence[Mapping[str, float]], key: str) -> bool:
    """Whether some row of ``rows`` holds a number in column ``key``."""
    return any(not math.isnan(r.get(key, math.nan)) for r in rows)


def training_curves_figure(
    runs: Mapping[str, Sequence[Mapping[str, float]]],
    title: str = "",
    steps: Mapping[str, Sequence[Mapping[str, float]]] | None = None,
    open_is_mean_alpha: Sequence[str] = (),
) -> Any:
    """A matplotlib figure of ``runs = {label: rows of read_log}``: one panel per statistic of
    :func:`panels` that some run logged (a gate's only if some run is gated; titled as each run's own
    statistic of that name, :func:`log_statistics`: a fine-tuning log's train accuracy), one line with
    markers per run, the same colour across panels; ``steps = {label: rows of read_steps}`` adds each run's
    per-step means as a thin line of its colour. A panel whose values vary by less than 1 % of their
    size is drawn flat (y-limits ± 10 % around them, :func:`_flat_reads_flat`).
    ``open_is_mean_alpha``: the runs whose ``gate_open`` is the soft gate's mean α (logs from before
    ``gate_mean_alpha``, :func:`older_soft_log`); the gate-open panel's title says so.

    Raises ValueError if ``runs`` is empty or a run has no rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not runs or any(len(rows) == 0 for rows in runs.values()):
        raise ValueError("training_curves_figure: expected at least one run, each with >= 1 logged epoch")
    gated = any(_gated(rows) for rows in runs.values())
    drawn = [s for s in panels() if (gated or not s.gated) and any(_has(r, s.name) for r in runs.values())]
    own = {run: log_statistics(rows) for run, rows in runs.items()}  # a fine-tuning log: its own titles
    panels_ = [(s.name, _panel_title(s.name, runs, own) or s.title) for s in drawn]
    by_name = {s.name: s for s in drawn}
    logged = [(k, t) for k, t in HELDOUT_PANELS if any(_has(rows, k) for rows in runs.values())]
    # rows of max(training panels, half of all): a gated run's 4 training + 4 held-out panels make two
    # rows, an ungated run's 2 + 4 two rows of 3 (no empty slot where the gate's panels would be)
    every = panels_ + logged
    cols = max(len(panels_), math.ceil(len(every) / 2))
    n_rows = math.ceil(len(every) / cols)
    fig, grid = plt.subplots(n_rows, cols, figsize=(3.3 * cols, 3.0 * n_rows), squeeze=False)
    for ax in grid.flat[len(every) :]:
        ax.axis("off")
    axes = list(grid.flat[: len(every)])
    styles, seed_markers = run_styles(list(runs))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if max(c for c, _, _ in styles) >= len(colours):  # 20 distinct colours before any repeats
        colours = [plt.get_cmap("tab20")(i) for i in range(20)]
    for (index, marker, label), (run, rows) in zip(styles, runs.items(), strict=True):
        colour = colours[index % len(colours)]
        epochs = [r["epoch"] for r in rows]
        run_gated = _gated(rows)
        fine = (steps or {}).get(run, [])  # by the run's own name (``label`` may be its variant's)
        for ax, (key, _) in zip(axes, every, strict=True):
            stat = by_name.get(key)
            if (stat is not None and stat.gated and not run_gated) or not _has(rows, key):
                continue  # an ungated run has no KL and no gate; an older log no held-out columns
            ax.plot(epochs, [r[key] for r in rows], marker=marker, ms=3, color=colour, label=label)
            if fine and key in fine[0]:
                ax.plot([r["epoch"] for r in fine], [r[key] for r in fine], color=colour, lw=0.7, alpha=0.45,
                        label="_steps")
            if stat is not None and stat.reference and _has(rows, stat.reference):
                ax.axhline(rows[-1][stat.reference], color=colour, ls="--", lw=1)
            if _has(rows, f"heldout_{key}"):  # the held-out batch's value of the same statistic
                ax.plot(epochs, [r[f"heldout_{key}"] for r in rows], color=colour, ls=":", marker="x",
                        ms=3, label="_held-out")
    last = max(r["epoch"] for rows in runs.values() for r in rows)
    older = [r for r in open_is_mean_alpha if r in runs]
    for ax, (key, text) in zip(axes, every, strict=True):
        if key == "gate_open" and older:  # a soft gate's older log held its mean α there
            named = older[0] if len(older) == 1 else f"{len(older)} runs"
            text += f"\n(mean α for {named}: a soft gate's log before gate_mean_alpha)"
        ax.set_title(text, fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_xlim(0, last * 1.05)  # from the start of training (a 1-epoch run is a dot at x = 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)  # a flat series (CE's SC at 10 %) read "+1e1"
        ax.grid(alpha=0.3)
        if key in by_name and by_name[key].ylim is not None:
            ax.set_ylim(*by_name[key].ylim)
        else:
            _flat_reads_flat(ax)
    _shared_legend(fig, axes, title, seed_markers)
    return fig


def _flat_reads_flat(ax: Any, rel: float = 0.01) -> None:
    """A panel whose values all lie within ``rel`` of their size (CL's held-out SC at 11.000 ± 0.0005,
    its H_sum at log 10) gets y-limits of ± 10 ``rel`` around them: matplotlib zoomed into the noise and
    drew a flat statistic as a jagged one."""
    lo, hi = ax.dataLim.intervaly
    size = max(abs(lo), abs(hi))
    if not (math.isfinite(lo) and math.isfinite(hi)) or size == 0 or hi - lo >= rel * size:
        return
    mid, half = (lo + hi) / 2, 10 * rel * size
    ax.set_ylim(mid - half, mid + half)


def _shared_legend(fig: Any, axes: Sequence[Any], title: str, seed_markers: Mapping[int, str]) -> None:
    """The runs' legend under all panels (a run has one colour everywhere; per-panel legends cover
    the lines once a report overlays a dozen runs), each seed's marker and each line style once, and
    the title above."""
    from matplotlib.lines import Line2D

    from bayesncl.app.report.figures import legend_below

    drawn = {line.get_label() for ax in axes for line in ax.get_lines()}
    styles = {
        f"seed {s}": Line2D([], [], color="gray", ls="", marker=m, ms=4) for s, m in seed_markers.items()
    }
    if "_steps" in drawn:
        styles[f"every {STEP_LOG_EVERY} steps (thin)"] = Line2D([], [], color="gray", lw=0.7, alpha=0.45)
    if "_held-out" in drawn:
        styles["held-out batch (dotted, ×)"] = Line2D([], [], color="gray", ls=":", marker="x", ms=3)
    legend_below(fig, axes, title, styles, title_size=10)


def older_soft_log(run_dir: Path, rows: Sequence[Mapping[str, float]]) -> bool:
    """Whether ``rows`` (:func:`read_log` of ``run_dir``) are a soft gate's log from before
    ``gate_mean_alpha``, whose ``gate_open`` column holds the mean gate probability α, not the share of
    α > threshold: a ``gate_open`` and no ``gate_mean_alpha`` logged, and ``method.gate=soft`` in the
    run's config (False where it cannot be read)."""
    if not _has(rows, "gate_open") or _has(rows, "gate_mean_alpha"):
        return False
    from bayesncl.config import ConfigError
    from bayesncl.runs.export import load_run_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the config's own warnings: not this figure's business
            return load_run_config(run_dir).method.gate == "soft"
    except (ConfigError, RunDirError, OSError, ValueError):
        return False


def write_training_curves(
    sources: Sequence[str | Path], out: Path, labels: Sequence[str] | None = None
) -> Path:
    """Read each run's ``log.csv`` (run dir or file) and write the curves PNG ``out`` atomically.

    labels: legend entries, one per source (default :func:`run_label` of the run dirs). Raises
    RunDirError (one line) for a missing or malformed log, or when ``out`` cannot be written;
    nothing is written then. returns ``out``."""
    from bayesncl.app.report.figures import save_figure

    out = Path(out)
    dirs = [Path(s).parent if Path(s).is_file() else Path(s) for s in sources]
    names = list(labels) if labels is not None else run_label(dirs)
    runs = {name: read_log(s) for name, s in zip(names, sources, strict=True)}
    steps = {name: read_steps(d) for name, d in zip(names, dirs, strict=True)}
    older = [name for name, d in zip(names, dirs, strict=True) if older_soft_log(d, runs[name])]
    if len(runs) > 1:
        title = f"Training curves of {len(names)} runs"
    else:  # the method (the label pretrain gives) and the run
        title = f"Training curves: {names[0]}" + (f", run {dirs[0].name}" if dirs[0].name != names[0] else "")
    fig = training_curves_figure(runs, title, steps, open_is_mean_alpha=older)
    try:
        return save_figure(fig, out)
    except OSError as exc:
        raise RunDirError(f"figure {out} cannot be written: {write_failure_reason(out, exc)}") from None
