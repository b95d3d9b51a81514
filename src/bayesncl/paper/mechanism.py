"""The paper's mechanism, tested (issue 15): ``reproduce 6`` (the background probe of trained
encoders, paper Table 6) and ``reproduce mechanism`` (CL, NCL, BayesNCL and NCL-IPW at one budget
on ``fashion-mnist-bg``, with independent and spurious backgrounds).

The two tables' logic lives here as functions (:func:`table6`, :func:`mechanism`); the
``reproduce`` command dispatches to them. Metrics: docs/metrics.md, "Background metrics".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from bayesncl.app.report import format_table
from bayesncl.config import Config, ConfigError, build_config, refuse_fixed_keys
from bayesncl.paper import variants

__all__ = [
    "TABLE6_PAPER", "MECHANISM_METHODS", "MECHANISM_COLUMNS", "SPURIOUS", "table6", "mechanism_configs",
    "mechanism", "mechanism_weightless", "final_dynamics", "aggregate"
]

RECIPE = Path(__file__).parents[1] / "configs" / "fashion-mnist-demo.yaml"
# --dataset -> the recipe its runs take (always on fashion-mnist-bg's images): the demo's budget, or
# the long CPU recipe's (issue 24)
MECHANISM_RECIPES = {
    "fashion-mnist-bg": RECIPE, "fashion-mnist-bg-long": RECIPE.with_name("fashion-mnist-long.yaml"),
}
TABLE6_PAPER = {"ncl": 93.33, "bayesncl": 93.38}  # PAPER-NOTES §3: ImageNet-100 encoders on Waterbirds
TABLE6_DATASETS = ("waterbirds", "fashion-mnist-bg")
MECHANISM_METHODS = (("CL", "cl"), ("NCL", "ncl"), ("BayesNCL (STE)", "bayesncl"), ("NCL-IPW", "ncl-ipw"))
SPURIOUS = 0.9  # data.bg_correlation of the spurious setting
MECHANISM_COLUMNS = [
    ("SC %", "semantic_consistency", "{:.2f}"), ("bg dims", "background_dims_fraction", "{:.3f}"),
    ("bg mass", "background_mass_fraction", "{:.3f}"), ("closed bg", "gate_closure_background", "{:.3f}"),
    ("closed obj", "gate_closure_object", "{:.3f}"), ("bg probe %", "background_probe_acc1", "{:.2f}"),
    ("LP@1", "linear_probe_acc1", "{:.2f}"), ("AF–GV", "AF-GV", "{:.3f}"),
]


# ============================================================================ table 6
def table6(
    sources: list[str], dataset: str, run_dir: Path | None, overrides: list[str]
) -> dict[str, dict[str, Any]]:
    """``reproduce 6 --dataset waterbirds data.root=DIR CHECKPOINT_OR_RUN...``: the background probe
    (:func:`bayesncl.metrics.background.background_probe`, fitted on the train split's frozen h,
    scored on the test split) of each encoder; writes ``table6.md``/``.json`` into ``run_dir``
    (default ``runs/table6-<dataset>``) and returns ``{label: row}``. Raises ConfigError for no
    source or a dataset without places, EvalError / DataError for unusable input."""
    from bayesncl.app.evaluate import extract_split, load_trained
    from bayesncl.metrics.background import background_probe

    if dataset not in TABLE6_DATASETS:
        raise ConfigError(
            f"--dataset {dataset!r}: table 6 needs places; expected one of {', '.join(TABLE6_DATASETS)}"
        )
    if not sources:
        raise ConfigError("table 6 probes trained encoders: give one or more CHECKPOINT_OR_RUN")
    rows: dict[str, dict[str, Any]] = {}
    for src in sources:
        # the whole dataset, whatever subsets or class list the encoder was trained with
        data = [f"data.name={dataset}", "data.train_subset=0", "data.test_subset=0", "data.classes=null",
                "data.bg_correlation=0"]
        model, cfg, _ = load_trained(src, overrides=[*data, *overrides], command="reproduce 6")
        device = next(model.parameters()).device
        train = extract_split(model, cfg, "train", device, keys=("h",))
        test = extract_split(model, cfg, "test", device, keys=("h",))
        probe = background_probe(train["h"], train["places"], test["h"], test["places"], seed=cfg.seed)
        label = cfg.method.name if cfg.method.name not in rows else f"{cfg.method.name} ({src})"
        rows[label] = {"method": cfg.method.name, "source": str(src), **probe,
                       "paper bg probe %": TABLE6_PAPER.get(cfg.method.name)}
        print(f"{label}: background probe {probe['background_probe_acc1']:.2f} %")
    md = format_table(rows, [("bg probe %", "background_probe_acc1", "{:.2f}"),
                             ("paper bg probe %", "paper bg probe %", "{:.2f}")])
    header = f"Table 6: background (place) probe on frozen h, {dataset} (paper: ImageNet-100 encoders on "
    header += "Waterbirds)."
    out = run_dir or Path("runs") / f"table6-{dataset}"
    out.mkdir(parents=True, exist_ok=True)
    variants.write_table(out, "table6", rows, md, header, {}, report=False)  # its encoders are not runs here
    print(header)
    print(md)
    return rows


# ============================================================================ the mechanism study
def mechanism_configs(
    dataset: str, seeds: int, overrides: list[str], spurious: float = SPURIOUS
) -> dict[str, Config]:
    """Every run of the study, resolved up front (a typo fails before any training): each method
    of :data:`MECHANISM_METHODS` × ``data.bg_correlation`` in (0, ``spurious``) × ``seeds`` seeds,
    on the demo's recipe (``dataset`` fashion-mnist-bg) or the long CPU recipe (fashion-mnist-bg-long)
    with ``data.name=fashion-mnist-bg``, ``overrides`` last (the budget: e.g.
    ``train.epochs=5``). Keys: ``"<label> | p=<p> | seed=<s>"``."""
    if dataset not in MECHANISM_RECIPES:
        raise ConfigError(
            f"--dataset {dataset!r}: the mechanism study runs on {' or '.join(MECHANISM_RECIPES)}"
        )
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: expected >= 1")
    refuse_fixed_keys(
        overrides, ("method.name", "data.name", "data.bg_correlation", "seed"), "the runs of the study"
    )
    out = {}
    for p in (0.0, spurious):
        for label, method in MECHANISM_METHODS:
            for s in range(seeds):
                out[f"{label} | p={p:g} | seed={s}"] = build_config(MECHANISM_RECIPES[dataset], [
                    "data.name=fashion-mnist-bg", f"data.bg_correlation={p}", f"method.name={method}",
                    f"seed={s}", *overrides,
                ], warn_inert=False)  # fmt: skip
    return out


def final_dynamics(run_dir: Path, cfg: Config, samples: int = 1024) -> dict[str, float]:
    """Table 3's AF–GV, GV–SC, AF–SC (and ``dims``; :mod:`bayesncl.app.dynamics`' protocol) at a
    run's final checkpoint ``last.pt``, its data read under ``cfg``'s ``data.root`` (the config this
    command gives the run: :func:`variants.measure_overrides`)."""
    from bayesncl.app.dynamics import CORRELATIONS, checkpoint_dynamics

    corr, _, _ = checkpoint_dynamics(run_dir / "last.pt", samples, variants.measure_overrides(cfg))
    return {k: corr[k] for k in ("dims", *CORRELATIONS)}


def aggregate(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mean over seeds of every numeric column of :data:`MECHANISM_COLUMNS` per ``"<label> | p=<p>"``
    (a ``<key>_std`` beside each, ddof 1 as the tables of ``reproduce``, 0 for one seed; None where no
    seed has a value) and the seed count."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, m in results.items():
        groups.setdefault(name.rsplit(" | seed=", 1)[0], []).append(m)
    out: dict[str, dict[str, Any]] = {}
    for group, ms in groups.items():
        row: dict[str, Any] = {"seeds": len(ms)}
        for _, key, _ in MECHANISM_COLUMNS:
            vals = np.array([float(m[key]) for m in ms if m.get(key) is not None], dtype=float)
            vals = vals[np.isfinite(vals)]
            row[key] = float(vals.mean()) if vals.size else None
            row[f"{key}_std"] = float(vals.std(ddof=1 if vals.size > 1 else 0)) if vals.size else None
        out[group] = row
    return out


def _shown(means: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rows as the Markdown table shows them: "label, p=P" (no "|" inside a cell) and each cell
    "mean ± std" (the std for more than one seed)."""
    out: dict[str, dict[str, Any]] = {}
    for group, row in means.items():
        cells: dict[str, Any] = {"seeds": row["seeds"]}
        for _, key, fmt in MECHANISM_COLUMNS:
            m, sd = row[key], row[f"{key}_std"]
            spread = f" ± {fmt.format(sd)}" if row["seeds"] > 1 and sd is not None else ""
            cells[key] = None if m is None else fmt.format(m) + spread
        out[group.replace(" | ", ", ")] = cells
    return out


def _checked(
    dataset: str, run_dir: Path | None, overrides: list[str], seeds: int, store: Path | None, plan: bool
) -> tuple[dict[str, Config], Path, dict[str, Path], list[Path]]:
    """``(configs, run dir, {run: its folder}, the folders of the runs that lack their weights)`` of
    :func:`mechanism`, its folders checked (:func:`variants.check_dirs`; with ``plan`` the finished runs
    without ``last.pt`` whose dynamics are not yet in their metrics are returned, not refused)."""
    configs = mechanism_configs(dataset, seeds, overrides)
    run_dir = run_dir or Path("runs") / f"mechanism-{dataset}"
    subs = {n: store / variants.variant_hash(c) if store else run_dir / variants.slug(n)
            for n, c in configs.items()}  # fmt: skip
    links = tuple(variants.slug(n) for n in configs) if store else ()
    folders = {subs[n]: (n.replace(" | ", ", "), c) for n, c in configs.items()}  # labels as the table's
    unlinked = "; from before --store? the same command without --store reuses them in place"
    lacking = variants.check_dirs(run_dir, store, "the mechanism study", folders, links=links,
                                  unlinked=unlinked, plan=plan,
                                  needs_weights=lambda sub: "AF-GV" not in variants.finished_metrics(sub))
    return configs, run_dir, subs, list(lacking)


def mechanism_weightless(
    dataset: str, run_dir: Path | None, overrides: list[str], *, seeds: int = 1, store: Path | None = None
) -> list[str]:
    """``reproduce mechanism --list-weightless``: the folder names (in the store: the hashes) of the
    runs :func:`mechanism` would refuse for want of their weights (finished, without ``last.pt``, their
    dynamics not yet in their metrics), after the same checks; nothing printed or written."""
    return [sub.name for sub in _checked(dataset, run_dir, overrides, seeds, store, plan=True)[3]]


def mechanism(
    dataset: str, run_dir: Path | None, overrides: list[str], *, seeds: int = 1, samples: int = 1024,
    store: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """``reproduce mechanism --dataset fashion-mnist-bg [--seeds N] [--store DIR]``: train (or reuse)
    every run of :func:`mechanism_configs` into ``run_dir/<run>`` (default ``runs/mechanism-<dataset>``)
    or, with ``store``, into the store of runs every table shares (``STORE/<hash>``, linked from
    ``run_dir/<run>``), add :func:`final_dynamics` (``samples`` train images) to its metrics, then
    write ``mechanism.md``/``.json`` (the per-run rows and the seed means of :func:`aggregate`).
    Returns the means. Every folder is checked before any training (:func:`variants.check_dirs`):
    RunDirError (one line) for an unusable run dir or store, a finished run with other settings, an
    unfinished one started with settings its continuation would refuse, a finished run without
    ``last.pt`` whose dynamics are not yet in its metrics (:func:`final_dynamics` reads its weights),
    or, with ``store``, folders of the run dir's own where its links go (runs from before ``--store``).
    A run cut short before its first checkpoint (a ``config.yaml``, a ``log.csv``, no ``last.pt``) is
    trained again, as by the tables (:func:`variants.train_run`)."""
    configs, run_dir, subs, _ = _checked(dataset, run_dir, overrides, seeds, store, plan=False)
    results: dict[str, dict[str, Any]] = {}
    for name, cfg in configs.items():
        sub = subs[name]
        if variants.finished(sub):  # its settings checked above
            print(f"== {name}: reusing {sub / 'metrics.json'}")
            m = variants.finished_metrics(sub)
        else:
            print(f"== {name}: {variants.training(sub)} {sub}")
            m = variants.train_run(cfg, sub)  # as every table: continued, or trained over a run cut short
        if "AF-GV" not in m:
            with variants.measuring(sub, in_store=store is not None, label=name.replace(" | ", ", ")):
                m.update(final_dynamics(sub, cfg, samples))
            variants.save_metrics(sub, name, m)
        results[name] = m
    means = aggregate(results)
    shown_columns = [("seeds", "seeds", "{}"), *((h, k, "{}") for h, k, _ in MECHANISM_COLUMNS)]
    md = format_table(_shown(means), shown_columns)
    header = (
        f"The mechanism on {dataset}: p = data.bg_correlation of the train split (test independent); "
        f"means over {seeds} seed(s). bg dims/mass: share of active dims (of activation mass) on background "
        "dims; closed bg/obj: the gate's closure of firing entries on background/object dims (kinds on z)."
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    if store:  # the table's folder shows its runs
        for name, sub in subs.items():
            variants.link(run_dir, variants.slug(name), sub)
    # the runs as the table's folder names them (its links, with --store: not the store's hashes)
    shown = {n: run_dir / variants.slug(n) if store else sub for n, sub in subs.items()}
    logged = {n: shown[n] for n, sub in subs.items() if (sub / "log.csv").exists()}
    variants.write_table(run_dir, "mechanism", {"means": means, "runs": results}, md, header, logged,
                         cfg=next(iter(configs.values())))  # its report reads the data at the command's root
    print(header)
    print(md)
    return means
