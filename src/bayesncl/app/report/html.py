"""``bayesncl report``: a static HTML site of one or more runs that opens from disk (file://). Its
layout, inputs and sizes: README, "The HTML report". Pages are Jinja2 templates (package data
``templates/``); ``OUT/.bayesncl-report`` (:data:`MARKER`) marks a folder as a report, which a later
report may replace; thumbnails are shared in ``OUT/thumbs/<data>/<i>.png``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bayesncl.app.report import dimensions as dm
from bayesncl.app.report.figures import class_name

THUMB_PX = 64  # thumbnails: the split's images at their size, shrunk to this longest side if larger
MARKER = ".bayesncl-report"
FIGURES = (
    "training_curves.png", "top_activations.png", "sparsity.png", "suppressed_features.png", "dynamics.png",
    "embedding.png",
)
REPORT_FEATURE_KEYS = ("z", "features", "alpha", "mask")


@dataclass
class RunInput:
    """One run as the report sees it: ``feats`` (a features dict), its data config and metrics."""

    path: Path
    label: str
    feats: dict[str, np.ndarray]
    cfg: Any  # bayesncl.config.Config
    metrics: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- finding the runs
def _is_run(path: Path) -> bool:
    """A run the report can show: it has test features, or a checkpoint to extract them from."""
    return any((path / n).is_file() for n in ("last.pt", "features_test.npz"))


def is_packed(path: Path) -> bool:
    """A packed run: a finished run's results kept without its checkpoint or features (its
    ``metrics.json``, but neither ``last.pt`` nor ``features_test.npz``), as ``benchmarks/long_queue.sh
    pack`` commits a store's runs; a table reuses one, the report has nothing to show of it."""
    return (path / "metrics.json").is_file() and not _is_run(path)


PACKED_ADVICE = (
    "a report needs each run's last.pt or features_test.npz: `bayesncl report RUN_DIR` makes it where the "
    "runs were trained (the store that holds their checkpoints)"
)


def find_runs(sources: Sequence[str | Path]) -> list[Path]:
    """The run dirs of ``sources``: a run dir itself, or (a demo or reproduce run dir) the runs in
    its sub-folders, sorted. Raises RunDirError (one line) for a source holding neither (saying so
    where it is, or holds, only packed runs: :func:`is_packed`)."""
    from bayesncl.runs.messages import RunDirError, some_names

    runs: list[Path] = []
    for s in map(Path, sources):
        if not s.is_dir():
            why = "is a file, expected a run dir" if s.exists() else "no such run dir"
            raise RunDirError(f"{s}: {why}")
        if _is_run(s):
            runs.append(s)
            continue
        if is_packed(s):
            raise RunDirError(
                f"{s} is a packed run (its stored results, metrics.json and log.csv, without a checkpoint or "
                f"features), nothing to report on; {PACKED_ADVICE}"
            )
        folders = sorted(p for p in s.iterdir() if p.is_dir() and not p.name.startswith("."))
        subs = [p for p in folders if _is_run(p)]
        if not subs:
            packed = [p.name for p in folders if is_packed(p)]
            if packed:
                raise RunDirError(
                    f"{s} holds only packed runs ({some_names(packed)}: stored results without a checkpoint "
                    f"or features), nothing to report on; {PACKED_ADVICE}"
                )
            raise RunDirError(
                f"{s} holds no run to report on (no last.pt or features_test.npz, nor sub-folders with one)"
            )
        runs.extend(subs)
    return runs


def _labels(runs: Sequence[Path]) -> list[str]:
    """Folder-safe unique labels: the folder name, or parent-folder where names repeat."""
    names = [p.name for p in runs]
    out = [n if names.count(n) == 1 else f"{p.parent.name}-{n}" for n, p in zip(names, runs, strict=True)]
    return [o if out.count(o) == 1 else f"{o}-{i}" for i, o in enumerate(out)]


def load_run(path: Path, label: str, overrides: Sequence[str] = ()) -> RunInput:
    """The features (its ``features_test.npz``, else extracted from its checkpoint), config and
    metrics (``evaluation.json``, else ``metrics.json``) of the run in ``path``; ``overrides``
    (``data.root=DIR``: where its data lies now, if it moved since the run trained) set on its config
    before any data is read (the extraction's, the thumbnails')."""
    from bayesncl.metrics.inputs import EvalError
    from bayesncl.runs.export import load_run_config
    from bayesncl.runs.features import load_features

    cfg = load_run_config(path, list(overrides))
    file = path / "features_test.npz"
    if file.is_file():
        fs = load_features(file, threshold=cfg.method.threshold)  # an older file's α: at the run's threshold
        feats = {k: getattr(fs, k) for k in ("features", "labels", "indices", "z", "mask")}
        feats = {k: v for k, v in feats.items() if v is not None}
        if "soft_gating" in fs.meta:  # how its features were gated (an evaluate override, not the run's)
            cfg = replace(cfg, eval=replace(cfg.eval, use_soft_gating=bool(fs.meta["soft_gating"])))
    elif (path / "last.pt").is_file():
        from bayesncl.app.evaluate import extract_split, load_trained

        model, cfg, _ = load_trained(path, overrides=list(overrides))
        feats = extract_split(model, cfg, "test", next(model.parameters()).device, keys=REPORT_FEATURE_KEYS)
    else:
        raise EvalError(f"{path} has no features_test.npz and no last.pt: nothing to report on")
    if "indices" not in feats:
        feats["indices"] = np.arange(len(feats["labels"]))
    metrics: dict[str, Any] = {}
    for name in ("evaluation.json", "metrics.json"):
        if (path / name).is_file():
            metrics = json.loads((path / name).read_text())
            break
    return RunInput(path, label, feats, cfg, metrics)


# ----------------------------------------------------------------------------- the site
def _pct(v: float | None) -> str:
    """A fraction as a percentage to 0.1: "–" for None/NaN, "<0.1" for a value above 0 that would read
    "0.0" (a dim firing on 2 of 10,000 images is not silent)."""
    if v is None or v != v:
        return "–"
    return "<0.1" if 0 < v < 0.0005 else f"{100 * v:.1f}"


def _env() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("bayesncl.app.report", "templates"),
        autoescape=jinja2.select_autoescape(("html",)), trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["pct"] = _pct
    env.filters["num"] = lambda v, fmt="{:.3f}": "–" if v is None or v != v else fmt.format(v)
    env.globals["unselective"] = dm.UNSELECTIVE  # the firing rate from which no majority class is named
    return env


def prepare_out(out: Path) -> None:
    """Create ``out``, refusing a non-empty folder that is not an earlier report (RunDirError)."""
    from bayesncl.runs.messages import RunDirError

    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {out} is a file, expected a folder for the report")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise RunDirError(
            f"--out {out} is a folder that holds other files, not an earlier report: choose another"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by bayesncl report; a later report may replace this folder\n")


def _data_key(cfg: Any) -> str:
    d = cfg.data
    raw = f"{d.name}|{d.root}|{d.image_size}|{d.test_subset}"
    return f"{d.name}-{hashlib.sha1(raw.encode()).hexdigest()[:8]}"


def write_thumbnails(images: Any, split_indices: np.ndarray, folder: Path) -> None:
    """``folder/<i>.png`` for each split index ``i`` not already there: the image (uint8 (C, S, S)
    of ``images[i]``), shrunk to THUMB_PX on its longest side if larger."""
    import torch
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    todo = [int(i) for i in split_indices if not (folder / f"{int(i)}.png").exists()]
    for start in range(0, len(todo), 256):
        chunk = todo[start : start + 256]
        batch = images[torch.as_tensor(chunk)].numpy()
        for i, a in zip(chunk, batch, strict=True):
            gray = a.shape[0] == 1
            img = Image.fromarray(a[0], "L") if gray else Image.fromarray(a.transpose(1, 2, 0), "RGB")
            if max(img.size) > THUMB_PX:
                img.thumbnail((THUMB_PX, THUMB_PX))
            img.save(folder / f"{i}.png", optimize=True)


def _run_pages(env: Any, run: RunInput, out: Path, class_names: Sequence[str], images: Any) -> dict[str, Any]:
    """Write the run's dimension index and pages (and their thumbnails); returns the index row. Features
    gated softly (``eval.use_soft_gating``) say so (``gating``); ``mask`` is the hard mask still."""
    from bayesncl.app.evaluate import gating_text

    feats = run.feats
    n_classes = max(len(class_names), int(feats["labels"].max()) + 1)
    rows = dm.summarise(feats, n_classes)
    dims = [r.dim for r in rows]
    corr = dm.correlations(feats["features"], dims)
    counts = dm.class_fire_counts(np.abs(feats["features"]) > dm.EPS, feats["labels"], n_classes)
    details = [dm.detail(feats, k, counts, corr[k]) for k in dims]
    thumbs = f"thumbs/{_data_key(run.cfg)}"
    write_thumbnails(images, feats["indices"][dm.images_used(details)], out / thumbs)
    folder = out / run.label
    folder.mkdir(parents=True, exist_ok=True)
    cls = partial(class_name, class_names)
    gated = feats.get("mask") is not None
    common = {"run": run, "gated": gated, "gating": gated and gating_text(run.cfg), "names": class_names,
              "cls": cls, "root": "../"}

    def cell(row: int) -> dict[str, str]:  # a feature row's thumbnail and class name
        return {"src": f"../{thumbs}/{int(feats['indices'][row])}.png", "cls": cls(int(feats["labels"][row]))}

    (folder / "dims.html").write_text(env.get_template("dims.html").render(rows=rows, **common))
    page = env.get_template("dim.html")
    by_dim = {r.dim: r for r in rows}
    for d in details:
        html = page.render(
            d=d, s=by_dim[d.dim], cell=cell, bars=dm.svg_bars(d.hist[0]), f=feats["features"], **common
        )
        (folder / f"dim-{d.dim}.html").write_text(html)
    return {"n_dims": feats["features"].shape[1], "n_active": len(rows), "n_images": len(feats["labels"])}


def _copy_figures(run: RunInput, out: Path) -> list[str]:
    """Copy the run's figures into ``out/<run>/figures/`` (training curves redrawn from log.csv);
    returns their paths relative to ``out``."""
    dest = out / run.label / "figures"
    dest.mkdir(parents=True, exist_ok=True)
    found = []
    for name in FIGURES:
        if name == "training_curves.png" and (run.path / "log.csv").is_file():
            if not _curves([run], dest / name):
                continue
        elif (run.path / name).is_file():
            shutil.copyfile(run.path / name, dest / name)
        else:
            continue
        found.append(f"{run.label}/figures/{name}")
    return found


def _curves(runs: Sequence[RunInput], out: Path) -> bool:
    """Draw the training curves of ``runs`` into ``out``; False where a log cannot be read."""
    from bayesncl.app.report.curves import write_training_curves
    from bayesncl.runs.messages import RunDirError

    try:
        write_training_curves([r.path for r in runs], out, labels=[r.label for r in runs])
    except RunDirError:
        return False
    return True


def _sparsity(runs: Sequence[RunInput], out: Path) -> bool:
    """The runs' per-sample activation sparsity overlaid (:mod:`bayesncl.app.report.sparsity`) into
    ``out``; False where no run has test features."""
    from bayesncl.app.report.sparsity import sparsity_figure

    feats = {r.label: r.feats["features"] for r in runs if r.feats.get("features") is not None}
    if not feats:
        return False
    sparsity_figure(feats, out, title="Per-sample activation sparsity, the runs overlaid (NCL Fig. 1 c, d)")
    return True


def write_report(
    runs: Sequence[RunInput], out: Path, *, heading: str = "", intro: str = "", table: str = "",
    figure: str = "",
) -> Path:
    """Write the site of ``runs`` into ``out`` (README, "The HTML report"); returns ``out/index.html``.
    ``heading``: what the page shows (a table's ID: by default the runs' labels); ``intro``: a paragraph
    under it (which runs these are of a table, which were left out); ``table``: a link to the table the
    runs make (relative to ``out``); ``figure``: the table's figure (a PNG, relative to ``out``), shown
    under the run links."""
    from bayesncl.app.report import MAIN_COLUMNS
    from bayesncl.app.stages import Stages
    from bayesncl.config import dump_yaml
    from bayesncl.data import dataset_info, load_split_images

    prepare_out(out)
    env = _env()
    sections = []
    stages = Stages("report:", len(runs) + 1, enabled=all(r.cfg.train.progress for r in runs))
    for run in runs:
        stages.next(f"pages of {run.label} (a page per dimension, thumbnails)")
        names = list(dataset_info(run.cfg.data).class_names)
        images, _ = load_split_images(run.cfg.data, "test")
        facts = _run_pages(env, run, out, names, images)
        sections.append(
            {"run": run, "facts": facts, "figures": _copy_figures(run, out), "config": dump_yaml(run.cfg),
             "scalars": _scalars(run.metrics)}
        )
    stages.next("index page" + (" and overlaid curves" if len(runs) > 1 else ""))
    logged = [r for r in runs if (r.path / "log.csv").is_file()]  # several runs: their curves overlaid
    curves = "curves.png" if len(runs) > 1 and logged and _curves(logged, out / "curves.png") else None
    sparsity = "sparsity.png" if len(runs) > 1 and _sparsity(runs, out / "sparsity.png") else None
    html = env.get_template("index.html").render(
        sections=sections, columns=MAIN_COLUMNS, curves=curves, sparsity=sparsity, root="", thumb_px=THUMB_PX,
        heading=heading, intro=intro, table=table, figure=figure,
    )
    (out / "index.html").write_text(html)
    stages.done()
    return out / "index.html"


def _scalars(metrics: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The metrics dict's numbers and strings as (label, value, unit) rows, in its order: label, unit
    and format from the metric registry (:mod:`bayesncl.metrics.registry`), else from
    :data:`bayesncl.app.evaluate.RESULT_KEYS`, else the key and the value as they are."""
    from bayesncl.app.evaluate import RESULT_KEYS
    from bayesncl.metrics.registry import BACKGROUND_METRICS, FACTOR_METRICS, METRICS

    registry = {m.key: m for m in (*METRICS, *BACKGROUND_METRICS, *FACTOR_METRICS)}
    rows = []
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            continue
        if k in registry:
            m = registry[k]
            rows.append((m.label, m.text(v), m.unit))
        else:
            label, unit, fmt = RESULT_KEYS.get(k, (k, "", "{:.4g}" if isinstance(v, float) else "{}"))
            rows.append((label, fmt.format(v), unit))
    return rows


def report_command(
    sources: Sequence[str | Path], out: str | Path | None = None, overrides: Sequence[str] = (), **page: str
) -> Path:
    """``bayesncl report``: find the runs of ``sources`` (:func:`find_runs`), load each (``overrides``:
    :func:`load_run`'s, ``data.root=DIR``) and write the site into ``out`` (default: ``SOURCE/report``
    for one source, ``./report`` for several; ``page``: :func:`write_report`'s heading, intro,
    table and figure). Returns the index page. Raises RunDirError / EvalError (one line) for unusable
    input."""
    paths = find_runs(sources)
    dest = Path(out) if out is not None else (Path(sources[0]) if len(sources) == 1 else Path()) / "report"
    runs = [load_run(p, label, overrides) for p, label in zip(paths, _labels(paths), strict=True)]
    return write_report(runs, dest, **page)


def write_run_report(
    out_dir: Path, test: dict[str, np.ndarray], cfg: Any, result: dict[str, Any]
) -> Path | None:
    """``evaluate``'s report (its ``report`` hook): the run just evaluated, from memory (``test``:
    the features dict, ``cfg`` its Config, ``result`` the evaluation), into ``out_dir/report/``."""
    run = RunInput(out_dir, out_dir.name or "run", test, cfg, result)
    return write_report_or_warn([out_dir], out_dir / "report", run=run)


def write_report_or_warn(
    sources: Sequence[str | Path], out: Path, run: RunInput | None = None, overrides: Sequence[str] = (),
    **page: str,
) -> Path | None:
    """:func:`report_command` for ``demo``, ``evaluate`` and ``reproduce`` (``run``: one run
    already in memory, written as it is; ``overrides``: :func:`load_run`'s, the command's ``data.root``
    for runs it reuses, :func:`bayesncl.paper.variants.measure_overrides`; ``page``: a table's heading,
    intro, link and figure, :func:`write_report`): prints the index's path; a
    report that cannot be written is a one-line warning, never the command's failure."""
    from bayesncl.app.errors import user_errors

    try:
        index = (write_report([run], out) if run is not None
                 else report_command(sources, out, overrides, **page))  # fmt: skip
    except (*user_errors(), OSError) as e:
        print(f"bayesncl: warning: no HTML report: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        return None
    print(f"HTML report: {index}")
    return index
