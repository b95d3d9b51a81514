"""The figures of ``bayesncl reproduce``: line plots of mean ± std over seeds, one line per method,
the paper's points beside ours.

Input is plain data, so the figure needs nothing but the study's table: ``panels`` is a list of
``(title, xlabel, ylabel, xscale, series)`` and each series ``(label, [(x, mean, std)], [(x,
paper value)])``; a missing mean (a cell no seed produced) is left out of its line. A series whose one
point has ``x`` None is a reference (a row that is not swept, e.g. CL beside CL+L1 against β): a dashed
horizontal line at its mean across the panel, with its ± std band.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

Point = tuple[float | None, float | None, float | None]  # (x, mean, std); x None: a reference
SeriesData = tuple[str, Sequence[Point], Sequence[tuple[float, float]]]
PanelData = tuple[str, str, str, str, Sequence[SeriesData]]


def write_error_bar_figure(panels: Sequence[PanelData], path: Path, title: str, seeds: int) -> Path:
    """Draw ``panels`` side by side (up to 2 per row for 4, else up to 3) into the PNG ``path``:
    per series a line through the means, error bars and a shaded band of ± 1 std over ``seeds``
    seeds (none for one seed), and the paper's points as open black-edged markers labelled
    "(paper)". Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from bayesncl.app.report.figures import legend_below, save_figure

    n = len(panels)
    cols = 2 if n == 4 else min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    order = list(dict.fromkeys(label for *_, series in panels for label, _, _ in series))
    for ax, (ptitle, xlabel, ylabel, xscale, series) in zip(axes.flat, panels, strict=False):
        for label, points, paper in series:
            color = f"C{order.index(label) % 10}"  # a series keeps its colour in every panel
            pts = [(x, m, s) for x, m, s in points if m is not None and math.isfinite(m)]
            if pts and pts[0][0] is None:  # a reference: one value, across the panel
                _, m, s = pts[0]
                ax.axhline(m, color=color, ls="--", lw=1.2, label=label)
                if seeds > 1 and s is not None and math.isfinite(s):
                    ax.axhspan(m - s, m + s, color=color, alpha=0.12, lw=0)
            elif pts:
                xs = [p[0] for p in pts]
                ms = [p[1] for p in pts]
                ss = [p[2] if p[2] is not None and math.isfinite(p[2]) else 0.0 for p in pts]
                ax.errorbar(xs, ms, yerr=ss if seeds > 1 else None, marker="o", ms=4, capsize=3,
                            color=color, label=label)  # fmt: skip
                if seeds > 1:
                    lo = [m - s for m, s in zip(ms, ss, strict=True)]
                    hi = [m + s for m, s in zip(ms, ss, strict=True)]
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)
            if paper:
                ax.scatter([p[0] for p in paper], [p[1] for p in paper], marker="D", s=36, facecolors="none",
                           edgecolors=color, linewidths=1.5, label=f"{label} (paper)", zorder=3)  # fmt: skip
        ax.set_xscale(xscale)
        xs_all = sorted({p[0] for _, points, _ in series for p in points if p[0] is not None})
        if xscale == "log":  # tick the swept values themselves (0.1, 0.25, ...), not only decades
            ax.set_xticks(xs_all, [f"{t:g}" for t in xs_all])
            ax.minorticks_off()
        elif xs_all and all(float(x).is_integer() for x in xs_all):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # whole epochs, quartiles: no 1.5
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if not ax.get_legend_handles_labels()[0]:  # no seed gave a value (a correlation over too few dims)
            ax.text(0.5, 0.5, "no values", transform=ax.transAxes, ha="center", color="gray")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    spread = f"mean ± std over {seeds} seeds" if seeds > 1 else "1 seed"
    # about 10 characters of an 11 pt title per inch: a title too long for one line wraps and the
    # spread gets a line of its own (never "... over 3" / "seeds"); one legend under the panels
    # (per-panel legends sat on the bands)
    width, full = int(fig.get_figwidth() * 10), f"{title} ({spread})"
    wrapped = full if len(full) <= width else f"{textwrap.fill(title, width)}\n({spread})"
    legend_below(fig, list(axes.flat)[:n], wrapped)
    save_figure(fig, path)
    return path
