"""``bayesncl reproduce ID --dataset DS [--seeds N]``: one command per table or figure of both papers.

A study (:mod:`bayesncl.paper.studies`) lists variants, each pretrained once per seed 0..N-1 into a
store shared by every study: ``STORE/<hash>/`` (:func:`bayesncl.paper.variants.variant_hash`; default
``variants/`` beside the run dir), an ordinary pretrain run dir, reused by any study that needs it
and continued when interrupted. What a study measures beyond pretrain's evaluation is cached
beside it (``reproduce.json``, ``features_{test,train}.npz``). The plan (and estimated time) is
printed first; each cell is the mean ± std (ddof 1) over seeds, ``<stem>.json`` keeping the
per-seed ``values`` and the paper's value; figures are ``<stem>.png`` with error bars.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bayesncl.config import Config, ConfigError, build_config, ignored, inert_method_keys, refuse_fixed_keys
from bayesncl.paper import ncl_studies, studies, variants  # importing ncl_studies adds its IDs
from bayesncl.paper.studies import Study

# what decides how fast a run trains (runs that agree on these share a measured images/s)
COST_KEYS = ("data.name", "data.image_size", "model.backbone", "model.cifar_stem", "train.batch_size",
             "train.device", "train.precision", "train.channels_last")  # fmt: skip


def pretrain_minutes(run_dir: Path) -> float:
    """Pretraining time of a finished run, in minutes: the sum of its ``log.csv`` epoch times
    (``epoch_time_s``: the training loop alone, each epoch whole however often the run was resumed;
    not the data loading before it, the export or the evaluation after it). Table 7's "minutes".
    Raises RunDirError if the run has no readable log."""
    from bayesncl.app.report.curves import read_log

    return sum(row["epoch_time_s"] for row in read_log(run_dir)) / 60


# ----------------------------------------------------------------------------- configs and the plan
Cells = dict[tuple[str, int], str]  # (variant, seed) -> the run's hash


def study_configs(
    study: Study, dataset: str, overrides: list[str], seeds: int
) -> dict[tuple[str, int], Config]:
    """Every (variant, seed)'s resolved config, up front (a typo fails before any training).
    Raises ConfigError for ``--seeds`` < 1, a key the study's variants or ``--seeds`` set, or a
    bad override."""
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: expected >= 1 (the number of pretraining seeds, 0..N-1)")
    refuse_fixed_keys(overrides, study.defines, f"the variants of {_what(study)}")
    refuse_fixed_keys(overrides, ("seed",), "the runs' seeds (--seeds N trains seeds 0..N-1)")
    out: dict[tuple[str, int], Config] = {}
    for v in study.variants:
        recipe = studies.recipe_for(dataset, v.method)
        # the user's method keys that this variant's method does not read (ρ/λ for NCL in a table run
        # at another ρ/λ) are left out, so that its run keeps its name and a stored one is reused
        probe = build_config(recipe, [f"method.name={v.method}", *overrides, *v.overrides], warn_inert=False)
        keys = [o.split("=", 1)[0].strip() for o in overrides if "=" in o]
        inert = set(inert_method_keys(probe.method, keys))
        mine = [o for o in overrides if o.split("=", 1)[0].strip() not in inert]
        for s in range(seeds):
            # the user's overrides set the base, the variant its own keys (a sweep's value wins)
            given = [f"method.name={v.method}", *mine, *v.overrides, f"seed={s}"]
            out[v.name, s] = build_config(recipe, given)
    return out


def _what(study: Study, start: bool = False) -> str:
    """The study as messages name it: ``"table 1"`` (``start``, heading a page or a sentence:
    ``"Table 1"``), or its ID (``"fig3"``, ``"ncl-ood"``)."""
    return f"{'Table' if start else 'table'} {study.id}" if study.id.isdigit() else study.id


def _status(sub: Path) -> str:
    if variants.finished(sub):
        return "reuse"
    return "resume" if (sub / "last.pt").exists() else "train"


def _logged_rate(sub: Path) -> tuple[tuple[Any, ...], float] | None:
    """``(cost key, images/s)`` of a stored run from its config.yaml and log.csv, else None. The rate
    of its fastest logged epoch: an epoch slowed by other jobs on the cores (or a resume's first
    epoch) says nothing of this machine's speed, the fastest one comes closest to it."""
    from bayesncl.app.report.curves import read_log
    from bayesncl.config import load_run_yaml

    try:
        flat = load_run_yaml(sub / "config.yaml")
        rows = read_log(sub)
    except (ValueError, OSError):  # ConfigError / RunDirError: no usable record
        return None
    seconds = min((r["epoch_time_s"] for r in rows), default=0.0)
    images = rows[-1]["step"] / len(rows) * int(flat["train.batch_size"]) if rows else 0  # one epoch's
    return (tuple(flat.get(k) for k in COST_KEYS), images / seconds) if seconds > 0 else None


def _rates(store: Path) -> dict[tuple[Any, ...], list[float]]:
    out: dict[tuple[Any, ...], list[float]] = {}
    for sub in sorted(store.glob("*/log.csv")) if store.is_dir() else []:
        if (r := _logged_rate(sub.parent)) is not None:
            out.setdefault(r[0], []).append(r[1])
    return out


def estimate_seconds(
    to_train: dict[str, Config], store: Path, *, time_here: bool = True
) -> tuple[dict[str, float], str]:
    """Estimated training seconds of each run (by hash) and where the rate came from: the median
    images/s of stored runs of the same cost (:data:`COST_KEYS`), else a 3-step measurement here
    (``time_here``; without it such a run has no estimate, and the source says so)."""
    from bayesncl.app.timing import images_per_second
    from bayesncl.data import dataset_info

    logged = _rates(store)
    measured: dict[tuple[Any, ...], float] = {}
    out, sources = {}, set()
    for h, cfg in to_train.items():
        flat = variants.identity(cfg)
        key = tuple(flat.get(k) for k in COST_KEYS)
        if key in logged:
            rate = sorted(logged[key])[len(logged[key]) // 2]
            sources.add(f"{len(logged[key])} stored run(s)' log.csv")
        elif not time_here:
            continue
        else:
            if key not in measured:  # no stored run of this cost: say why the plan is not printed yet
                print(f"timing {cfg.model.backbone} here (3 training steps) for the plan ...", flush=True)
                measured[key] = images_per_second(cfg)
            rate = measured[key]
            sources.add("a 3-step measurement")
        steps = max(1, dataset_info(cfg.data).num_train // cfg.train.batch_size)
        done = _logged_epochs(store / h)
        out[h] = (cfg.train.epochs - done) * steps * cfg.train.batch_size / rate
    return out, " and ".join(sorted(sources)) or ("nothing timed" if to_train else "nothing to train")


def _logged_epochs(sub: Path) -> int:
    log = sub / "log.csv"
    return max(0, len(log.read_text().splitlines()) - 1) if log.exists() and (sub / "last.pt").exists() else 0


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _print_plan(study: Study, dataset: str, seeds: int, store: Path, cells: Cells,
                runs: dict[str, tuple[Config, str]], est: dict[str, float], source: str,
                lacking: dict[str, str] | None = None, run_dir: Path | None = None) -> None:  # fmt: skip
    """The plan; ``lacking`` (``--plan``): ``{hash: what the run lacks that the table reads}``, each
    marked on its line and named at the end (:func:`variants.check_dirs` with ``plan``)."""
    lacking = lacking or {}
    counts = {s: sum(1 for _, st in runs.values() if st == s) for s in ("train", "resume", "reuse")}
    print(f"reproduce {study.id} ({study.title}) on {dataset}: {len(study.variants)} variant(s) x {seeds} "
          f"seed(s) = {len(cells)} run(s), {len(runs)} distinct; to train {counts['train']}, to continue "
          f"{counts['resume']}, reused {counts['reuse']} (store {store})")  # fmt: skip
    if run_dir is not None:
        print(f"  the table goes to {run_dir}")
    for (name, seed), h in cells.items():
        status = runs[h][1]
        extra = f", ~{_duration(est[h])}" if h in est else ""
        extra += f" ({lacking[h]})" if h in lacking else ""
        if status != "reuse" and (pid := _busy(store, h)):
            extra += f" (another process is training it now, pid {pid})"
        print(f"  {name} seed {seed}: {status} {h}{extra}")
    device = next(iter(runs.values()))[0].train.device
    untimed = [h for h, (_, st) in runs.items() if st != "reuse" and h not in est]
    why = (f"{len(untimed)} run(s) of a cost no stored run's log.csv gives a rate for (--plan --time times "
           "3 training steps here)")  # fmt: skip
    if untimed and not est:
        print(f"estimated training time on this device ({device}): none, not timed: {why}")
    else:
        of = f" for {len(est)} of the {len(est) + len(untimed)} run(s) to train" if untimed else ""
        print(f"estimated training time on this device ({device}){of}: {_duration(sum(est.values()))} "
              f"(from {source}; evaluation not included)")  # fmt: skip
        if untimed:
            print(f"not timed: {why}")
    for note in study.notes:
        print(f"note: {note}")
    if lacking:
        print(f"without --plan {_what(study)} refuses {len(lacking)} run(s) that lack weights it reads: "
              f"{' '.join(sorted(lacking))}; move them out of the store to train them again "
              "(--list-weightless lists them, one a line; benchmarks/long_queue.sh sets them aside so)")


def _warn_cpu_resnet50(study: Study, runs: dict[str, tuple[Config, str]], est: dict[str, float]) -> None:
    """Table 5 trains ResNet-50: on a CPU say how long it would take, before any training."""
    import torch

    from bayesncl.core.distributed import resolve_device

    big = [h for h, (cfg, st) in runs.items() if st != "reuse" and cfg.model.backbone == "resnet50"]
    if big and resolve_device(runs[big[0]][0].train.device).type == "cpu":
        warnings.warn(
            f"{_what(study)} trains ResNet-50 on the CPU ({torch.get_num_threads()} threads): about "
            f"{_duration(sum(est[h] for h in big))} for {len(big)} run(s); a GPU is advised",
            stacklevel=3,
        )


# ----------------------------------------------------------------------------- measures
_features = variants.stored_features  # (train, test) features of a stored run, under the command's data.root


@variants.files_only
def _m_base(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    m = variants.finished_metrics(sub)
    return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@variants.files_only
def _m_flops(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.paper.benchmark import flops_per_image

    return {"gflops_per_image": flops_per_image(cfg) / 1e9}


def _m_probe3(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.metrics import knn_accuracy, linear_probe

    train, test = _features(sub, cfg)
    lp = linear_probe(train.h, train.labels, test.h, test.labels, seeds=[cfg.seed + i for i in range(3)])
    knn = knn_accuracy(train.h, train.labels, test.h, test.labels)
    return {"lp3_acc1": lp["acc1"], "lp3_acc5": lp["acc5"], "knn_acc1": knn["acc1"]}


def _m_retrieval(sub: Path, cfg: Config, ks: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.metrics import retrieval_metrics

    _, test = _features(sub, cfg)
    r = retrieval_metrics(test.features, test.labels, dims=list(ks), topk=(1, 5, 10))
    return {f"K{k}.{m}": v for k, row in r.items() for m, v in row.items()}


def _m_retrieval_sel(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """Table 2's retrieval: P@1/5/10 and mAP@10 on the top-K dims (``params``: (K,)); none for CL,
    whose dims the paper does not select."""
    from bayesncl.metrics import retrieval_metrics

    if cfg.method.name == "cl":
        return {}
    _, test = _features(sub, cfg)
    (row,) = retrieval_metrics(test.features, test.labels, dims=[int(params[0])], topk=(1, 5, 10)).values()
    return {f"sel.{m}": v for m, v in row.items()}


def _soft_gated(sub: Path) -> bool:
    """Whether the stored run in ``sub`` has the soft gate (its config.yaml's ``method.gate``; True where
    it cannot be read, as for any measure that loads the weights)."""
    from bayesncl.config import load_run_yaml

    try:
        return load_run_yaml(sub / "config.yaml").get("method.gate") == "soft"
    except (ValueError, OSError):  # ConfigError: no usable record
        return True


@variants.weights_if(_soft_gated)
def _m_soft_eval(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """A soft-gated run (``method.gate=soft``) evaluated the other way: its test split's features gated
    by α (``eval.use_soft_gating=true``: z̃ = normalize(normalize(z) ⊙ α), the authors' main_eval.py)
    instead of by the hard mask 1[α > threshold] of its evaluation (metrics.json, the authors' default).
    Every metric of :data:`bayesncl.metrics.registry.METRICS` and, with ``params`` (K,), Table 2's
    retrieval on the top-K dims (``sel.*``), keys prefixed
    :data:`bayesncl.paper.studies.SOFT_EVAL`; no other metric changes (h,
    the gate's open rate and mean α are the same either way). None for another gate: its row would be the
    hard mask's again. The data read under this command's ``data.root`` (:func:`variants.load_stored`)."""
    import dataclasses

    from bayesncl.app.evaluate import extract_split
    from bayesncl.metrics import compute_all, retrieval_metrics

    if cfg.method.gate != "soft":
        return {}
    model, loaded, _ = variants.load_stored(sub, cfg)
    soft = dataclasses.replace(loaded, eval=dataclasses.replace(loaded.eval, use_soft_gating=True))
    test = extract_split(model, soft, "test", next(model.parameters()).device, keys=("features",))
    m = compute_all(test["features"], test["labels"])
    out = {f"{studies.SOFT_EVAL}{k}": float(v) for k, v in m.items() if isinstance(v, (int, float))}
    if params:
        (row,) = retrieval_metrics(test["features"], test["labels"], dims=[int(params[0])],
                                   topk=(1, 5, 10)).values()  # fmt: skip
        out.update({f"{studies.SOFT_EVAL}sel.{k}": v for k, v in row.items()})
    return out


def _m_fs(sub: Path, cfg: Config, ks: tuple[Any, ...]) -> dict[str, float]:
    """Top-K dims by expected activation (of the train z̃) vs K random dims (seed = the run's):
    :func:`~bayesncl.metrics.selection_probes`; keys ``K<k>.top_acc1`` / ``K<k>.random_acc1``."""
    from bayesncl.metrics import selection_probes

    train, test = _features(sub, cfg)
    r = selection_probes(train.features, train.labels, test.features, test.labels, [int(k) for k in ks],
                         seed=cfg.seed)  # fmt: skip
    return {f"K{k}.{m}": v for k, row in r.items() for m, v in row.items()}


def _m_selection_authors(sub: Path, cfg: Config, ks: tuple[Any, ...]) -> dict[str, float]:
    """ncl-fs under ``eval.selection_probe=authors``: :func:`~bayesncl.metrics.authors_selection_probes`
    on the projector output p of both splits (un-augmented, through the stored run), the random dims
    drawn as the fast form draws them; keys ``K<k>.top_acc1`` / ``K<k>.random_acc1``."""
    from bayesncl.app.evaluate import extract_split
    from bayesncl.metrics.authors_selection import authors_selection_probes

    model, loaded, _ = variants.load_stored(sub, cfg)
    device = next(model.parameters()).device
    train, test = (extract_split(model, loaded, s, device, keys=("p",)) for s in ("train", "test"))
    r = authors_selection_probes(train["p"], train["labels"], test["p"], test["labels"], [int(k) for k in ks],
                                 seed=cfg.seed)  # fmt: skip
    return {f"K{k}.{m}": v for k, row in r.items() for m, v in row.items()}


def _m_sepin(sub: Path, cfg: Config, ks: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.metrics import sepin_at_k

    _, test = _features(sub, cfg)
    return {f"sepin@{k}": 100 * sepin_at_k(test.features, test.labels, k) for k in ks}  # in 10⁻² nats


def _m_sepin_x(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """SEPIN about the input x (``params``: (images, *ks)): :func:`~bayesncl.metrics.sepin_input_scores`
    of the z̃ of two training augmentations of that many train images (:func:`extract_views`, the
    run's seed), keys ``sepin_x@k`` in 10⁻² nats."""
    from bayesncl.app.views import extract_views
    from bayesncl.metrics import sepin_input_scores, sepin_top_k

    n_images, *ks = params
    model, run_cfg, _ = variants.load_stored(sub, cfg)
    views = extract_views(model, run_cfg, next(model.parameters()).device, int(n_images))
    info, sep = sepin_input_scores(views)
    return {f"sepin_x@{k}": 100 * sepin_top_k(info, sep, k) for k in ks}


def _m_dynamics(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.app.dynamics import dynamics_command

    epochs, samples = params
    result = dynamics_command(
        sub, samples=int(samples), epochs=set(epochs), overrides=variants.measure_overrides(cfg)
    )
    return {f"e{r['epoch']}.{k}": r[k] for r in result["rows"] for k in ("AF-GV", "GV-SC", "AF-SC")}


def _m_trajectory(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """At each periodic checkpoint ``epoch-NNNN.pt`` of ``params[0]`` (the convergence study): SC,
    active dims and (gated runs) the gate-open rate of the test split's z̃, and the fast linear
    probe's Acc@1 on h (fitted on the train split, scored on the test split); the data read under this
    command's ``data.root`` (:func:`variants.load_stored`)."""
    from bayesncl.app.evaluate import extract_split
    from bayesncl.metrics import compute_all, linear_probe

    (epochs,) = params
    out: dict[str, float] = {}
    for e in epochs:
        model, ck_cfg, _ = variants.load_stored(sub / f"epoch-{int(e):04d}.pt", cfg)
        device = next(model.parameters()).device
        train = extract_split(model, ck_cfg, "train", device, keys=("h",))
        test = extract_split(model, ck_cfg, "test", device, keys=("h", "features", "mask"))
        m = compute_all(test["features"], test["labels"])
        out[f"e{e}.semantic_consistency"] = m["semantic_consistency"]
        out[f"e{e}.active_dims"] = float(m["active_dims"])
        if test.get("mask") is not None:
            out[f"e{e}.gate_open"] = float(test["mask"].mean())
        lp = linear_probe(train["h"], train["labels"], test["h"], test["labels"], seeds=ck_cfg.seed)
        out[f"e{e}.linear_probe_acc1"] = lp["acc1"]
    return out


def _m_finetune(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """``bayesncl finetune`` of the stored run with the ``train.*`` overrides ``params``, into its own
    run dir ``sub/finetune-<hash of params>/`` (continued if interrupted; the run itself is only read),
    its data read under this command's ``data.root`` (:func:`variants.measure_overrides`)."""
    import hashlib
    import json

    from bayesncl.app.finetune import finetune

    ft = sub / f"finetune-{hashlib.sha256(repr(params).encode()).hexdigest()[:8]}"
    if (ft / "finetune.json").exists():
        result = json.loads((ft / "finetune.json").read_text())
    else:
        resume = (ft / "last.pt").exists()
        given = [*params, *variants.measure_overrides(cfg)]  # (data.root: not in the folder's name)
        result = finetune(sub, ft, given, resume=resume, overwrite=ft.exists() and not resume)
    return {"ft_acc1": result["acc1"], "ft_acc5": result["acc5"]}


MEASURES = {"base": _m_base, "flops": _m_flops, "probe3": _m_probe3, "retrieval": _m_retrieval,
            "selection": _m_fs, "selection_authors": _m_selection_authors, "sepin": _m_sepin,
            "sepin_x": _m_sepin_x, "dynamics": _m_dynamics, "finetune": _m_finetune,
            "retrieval_sel": _m_retrieval_sel, "trajectory": _m_trajectory, "soft_eval": _m_soft_eval,
            **ncl_studies.MEASURES}  # fmt: skip
"""What a study can measure of a trained run: ``name -> f(run dir, config, params) -> {key: value}``."""


def needs_weights(sub: Path, wanted: list[tuple[str, tuple[Any, ...]]]) -> bool:
    """Whether measuring the finished run in ``sub`` loads its weights: a measure of ``wanted`` that
    reads them (:func:`variants.reads_weights`) and is not yet cached in its ``reproduce.json``."""
    cache = variants.read_cache(sub)
    return any(variants.reads_weights(MEASURES[name], sub) and f"{name}{list(params)}" not in cache
               for name, params in wanted)


def measure(sub: Path, cfg: Config, wanted: list[tuple[str, tuple[Any, ...]]]) -> dict[str, float]:
    """The metrics ``wanted`` of the finished run in ``sub``, from its cache where computed before
    (``reproduce.json``), plus its ``pretrain_minutes``."""
    cache = variants.read_cache(sub)
    out: dict[str, float] = {}
    changed = False
    for name, params in [("base", ()), *wanted]:
        key = f"{name}{list(params)}"
        if key not in cache:
            with variants.measuring(sub):  # a checkpoint of the run missing or damaged: named, with advice
                cache[key] = MEASURES[name](sub, cfg, params)
            changed = True
        out.update({k: v for k, v in cache[key].items() if v is not None})
    if changed:
        variants.write_cache(sub, cache)
    if (sub / "log.csv").exists():
        out["pretrain_minutes"] = pretrain_minutes(sub)
    return out


# ----------------------------------------------------------------------------- the table
def cell(values: list[float | None]) -> dict[str, Any]:
    """``{"mean", "std", "values"}`` of one table cell over seeds: std with ddof 1 (None for one
    value), missing values (None, NaN) left out of both; mean None when no value."""
    ok = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    mean = sum(ok) / len(ok) if ok else None
    std = math.sqrt(sum((v - mean) ** 2 for v in ok) / (len(ok) - 1)) if len(ok) > 1 else None
    return {"mean": mean, "std": std, "values": values}


def aggregate(study: Study, per_run: dict[tuple[str, int], dict[str, float]], seeds: int) -> dict[str, Any]:
    """``{row label: {column key: cell + "paper"}}`` over seeds 0..seeds-1."""
    rows: dict[str, Any] = {}
    for row in study.rows:
        paper = study.paper.get(row.label, {})
        rows[row.label] = {
            c.key: {**cell([per_run[row.variant, s].get(row.key(c.key)) for s in range(seeds)]),
                    "paper": paper.get(c.key)}
            for c in study.columns
        }  # fmt: skip
    return rows


def _fmt(c: dict[str, Any], fmt: str) -> str:
    if c["mean"] is None:
        return "–"
    return fmt.format(c["mean"]) + (f" ± {fmt.format(c['std'])}" if c["std"] is not None else "")


def format_study(study: Study, rows: dict[str, Any]) -> str:
    """Markdown: one row per study row, ``mean ± std`` cells, then the paper's value of every column
    the paper reports."""
    with_paper = [c for c in study.columns if any(rows[r][c.key]["paper"] is not None for r in rows)]
    head = ["row", *(c.header for c in study.columns), *(f"paper {c.header}" for c in with_paper)]
    head = [h.replace("|", r"\|") for h in head]  # (a pipe in a cell would split it: "|x| < 1e-5")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for label, cells in rows.items():
        ours = [_fmt(cells[c.key], c.fmt) for c in study.columns]
        paper = [c.fmt.format(p) if (p := cells[c.key]["paper"]) is not None else "–" for c in with_paper]
        lines.append("| " + " | ".join([label.replace("|", r"\|"), *ours, *paper]) + " |")
    return "\n".join(lines)


def _figure(study: Study, rows: dict[str, Any], path: Path, seeds: int, title: str) -> None:
    from bayesncl.app.report.plots import write_error_bar_figure

    panels = [
        (p.title, p.xlabel, p.ylabel, p.xscale, [
            (s.label, [(x, rows[r][k]["mean"], rows[r][k]["std"]) for x, r, k in s.points], s.paper)
            for s in p.series
        ])
        for p in study.panels
    ]  # fmt: skip
    write_error_bar_figure(panels, path, title, seeds)


# ----------------------------------------------------------------------------- the command
def _train(h: str, cfg: Config, sub: Path, label: str, i: int, n: int, est: float | None) -> None:
    eta = f" (~{_duration(est)})" if est else ""
    print(f"[{i}/{n}] {label}: {variants.training(sub)} {sub}{eta}", flush=True)
    t = time.time()
    metrics = variants.train_run(cfg, sub)
    variants.save_metrics(sub, label, metrics)
    print(f"[{i}/{n}] {label}: done in {_duration(time.time() - t)}", flush=True)


@dataclass
class _Prepared:
    """What :func:`reproduce` (and :func:`weightless_runs`) knows once its folders are checked."""

    study: Study
    configs: dict[tuple[str, int], Config]
    run_dir: Path
    store: Path
    cells: Cells
    runs: dict[str, tuple[Config, str]]  # hash -> (its config, "train" | "resume" | "reuse")
    label: dict[str, str]  # hash -> "variant seed N"
    lacking: dict[str, str]  # hash -> what the run lacks that the table reads (plan only: else refused)


def _claim_file(store: Path, h: str) -> Path:
    """The lock file by which a reproduce process holds the stored run ``h`` while it trains it: beside
    the run's folder, so that a process takes it before it reads the run's state or writes a file."""
    return store / f".training-{h}.lock"


def _busy(store: Path, h: str) -> str | None:
    """The pid of another process training the stored run ``h`` (a reproduce's claim, or the run dir's
    own lock, held by a pretrain), else None (:func:`lock.lock_holder`: reads only)."""
    from bayesncl.runs.layout import LOCK_NAME
    from bayesncl.runs.lock import lock_holder

    return lock_holder(_claim_file(store, h)) or lock_holder(store / h / LOCK_NAME)


def _train_all(p: _Prepared, to_train: dict[str, Config], est: dict[str, float], shared: bool
               ) -> tuple[list[str], list[str]]:  # fmt: skip
    """Train (or continue) each run of ``to_train`` into the store and measure it (cached beside it now,
    not at the table's end), each held by its claim (:func:`_claim_file`) from before its state is read:
    a run another process finished meanwhile is passed over. One another process is training (its
    claim, or its run dir's lock) raises RunDirError (one line), or with ``shared`` (``--train-only``)
    is passed over too; ``shared`` on a store without file locks raises RunDirError (each process
    would train every run). Returns the hashes ``(trained, passed over)``."""
    from bayesncl.runs.lock import lock_file
    from bayesncl.runs.messages import RunDirBusy, RunDirError

    trained, passed = [], []
    if to_train:
        p.store.mkdir(parents=True, exist_ok=True)  # (checked writable by _prepare) for the claims
    for i, (h, cfg) in enumerate(to_train.items(), 1):
        sub, n, label, claim = p.store / h, len(to_train), p.label[h], None
        try:
            claim = lock_file(_claim_file(p.store, h), "{pid}")
            if claim is None and shared:
                raise RunDirError(f"--train-only: the store {p.store} takes no file locks, so a process "
                                  "cannot tell which runs another one trains; run one process (without "
                                  "--train-only), or give a --store on a file system with flock")  # fmt: skip
            if variants.finished(sub):
                print(f"[{i}/{n}] {label}: passed over, another process finished it meanwhile", flush=True)
                passed.append(h)
                continue
            _train(h, cfg, sub, label, i, n, est.get(h))
        except RunDirBusy as e:
            if not shared:
                raise RunDirError(f"{label}: another bayesncl process is training it in {sub} (pid {e.pid}); "
                                  "wait for it to end, give --train-only to train the table's other runs "
                                  "meanwhile, or --finished for the table so far") from None  # fmt: skip
            print(f"[{i}/{n}] {label}: passed over, another process is training it (pid {e.pid})", flush=True)
            passed.append(h)
            continue
        finally:
            if claim is not None:
                claim.release()
        measure(sub, cfg, p.study.measures)
        trained.append(h)
    return trained, passed


def _value_name(value: str) -> str:
    """A value as a run dir names it: a number in one spelling (``3e-5`` and ``3e-05`` → ``3e-05``)."""
    try:
        return str(int(value))
    except ValueError:
        pass
    try:
        return f"{float(value):g}"
    except ValueError:
        return value


def default_run_dir(stem: str, dataset: str, overrides: list[str]) -> Path:
    """``runs/<stem>-<dataset>``, followed by each override as ``-<key>=<value>`` (``method.`` left off the
    key), so that one table at two settings writes two run dirs: ``["method.rho=0.3", "method.lam=1e-5"]``
    → ``runs/headline-cifar100-rho=0.3-lam=1e-05``; ``train.batch_size=64`` → ``-train.batch_size=64``.
    A key given twice counts once, at its last value (the one applied); a number is spelled one way
    (``:g``). Left out: what changes neither the runs nor the table (:data:`variants.IDENTITY_IGNORES`
    but ``eval.*``: ``data.root``, ``train.progress``, ...; ``train.compile``, held in a run's name).
    Characters other than letters, digits and ``._=+-`` become ``_``, and the name then ends in
    ``-<sha1 of the sorted parts as given, 6 hex>`` (``a/b`` and ``a_b`` keep two names); a name over
    180 characters ends in ``-overrides-<that sha1, 10 hex>`` instead."""
    last: dict[str, str] = {}
    for o in overrides:
        key, _, value = (x.strip() for x in o.partition("="))
        unnamed = ignored(key, variants.IDENTITY_IGNORES) and not key.startswith("eval.")
        if key in variants.IDENTITY_HELD or unnamed:
            continue
        last.pop(key, None)
        last[key] = value
    given = [f"{k.removeprefix('method.')}={_value_name(v)}" for k, v in last.items()]
    parts = [re.sub(r"[^A-Za-z0-9._=+-]", "_", part) for part in given]
    name = "-".join([stem, dataset, *parts])
    digest = hashlib.sha1("\n".join(sorted(given)).encode()).hexdigest()[:10]
    if len(name) > 180:
        name = f"{stem}-{dataset}-overrides-{digest}"
    elif parts != given:  # "a/b" and "a_b" would share a name: the values as given, hashed, tell them apart
        name += f"-{digest[:6]}"
    return Path("runs") / name


def _prepare(
    study_id: str, dataset: str, run_dir: Path | None, overrides: list[str], seeds: int, store: Path | None,
    plan: bool,
) -> _Prepared:
    """The study's configs, runs and folders, checked (:func:`variants.check_dirs`; with ``plan`` the
    runs that lack weights the table reads are returned, not refused)."""
    study = studies.build(study_id, dataset, overrides)
    configs = study_configs(study, dataset, overrides, seeds)
    run_dir = run_dir or default_run_dir(study.stem, dataset, overrides)
    store = store or run_dir.parent / "variants"
    cells = {key: variants.variant_hash(cfg) for key, cfg in configs.items()}
    runs: dict[str, tuple[Config, str]] = {}
    for key, h in cells.items():
        runs.setdefault(h, (configs[key], _status(store / h)))
    label = {h: f"{n} seed {s}" for (n, s), h in reversed(cells.items())}
    links = tuple(f"{variants.slug(n)}-s{s}" for n, s in cells)
    folders = {store / h: (label[h], cfg) for h, (cfg, _) in runs.items()}

    def weights(sub: Path) -> bool:
        return needs_weights(sub, study.measures)

    lacking = variants.check_dirs(run_dir, store, _what(study), folders, links=links,
                                  checkpoints=study.checkpoints, monitor=study.monitor, needs_weights=weights,
                                  plan=plan)  # fmt: skip
    return _Prepared(study, configs, run_dir, store, cells, runs, label,
                     {sub.name: note for sub, note in lacking.items()})  # fmt: skip


def weightless_runs(
    study_id: str, dataset: str, run_dir: Path | None, overrides: list[str], *, seeds: int = 1,
    store: Path | None = None,
) -> list[str]:
    """``reproduce ID --list-weightless``: the store hashes (in the table's order) of the runs that
    :func:`reproduce` would refuse for weights they lack and it reads: finished runs without
    ``last.pt`` (small files only, as a packed store restores them) whose measures not yet cached
    beside them load their weights (:func:`variants.weightless`), and runs without the
    ``epoch-NNNN.pt`` the table reads. The same checks as :func:`reproduce` before them (ConfigError,
    RunDirError); the data is not read, nothing is printed or written. ``benchmarks/long_queue.sh``
    moves them out of the store before the table, which then trains them again."""
    return list(_prepare(study_id, dataset, run_dir, overrides, seeds, store, plan=True).lacking)


def reproduce(
    study_id: str, dataset: str, run_dir: Path | None, overrides: list[str], *, seeds: int = 1,
    store: Path | None = None, plan_only: bool = False, time_here: bool | None = None, finished: bool = False,
    train_only: bool = False,
) -> dict[str, Any]:
    """Train (or reuse) every variant of ``study_id`` on ``dataset`` for seeds 0..``seeds``-1, measure
    them, and write ``RUN_DIR/<stem>.md`` / ``.json`` (and ``<stem>.png`` for a figure, ``curves.png``)
    with links ``RUN_DIR/<variant>-s<seed>`` to the stored runs. Returns the JSON's dict.

    ``run_dir``: default ``runs/<stem>-<dataset>`` and the overrides (:func:`default_run_dir`); ``store``:
    default ``RUN_DIR/../variants``.
    Raises ConfigError for a bad ID (listing the valid ones), dataset, ``seeds`` or override,
    RunDirError for an unusable run dir or store, DataError for data that cannot be read (the runs' or
    the study's ``extra_data``), before any training. ``plan_only`` (``--plan``): the same checks and
    printed plan, where the runs that lack weights the table reads (:func:`weightless_runs`: no
    ``last.pt``, or no ``epoch-NNNN.pt`` of the table's) are marked, not refused, then nothing is
    trained, measured or written; returns ``{"train", "resume", "reuse", "needs_weights"}``, each a
    sorted list of store hashes (``needs_weights``: those marked). ``time_here`` (``--time``; None:
    ``not plan_only``, so a run without ``--plan`` always): time 3 training steps here for a run of a
    cost that no stored run's log.csv gives a rate for; without it (``--plan`` alone) the plan prints
    at once, such runs without an estimate. ``finished`` (``--finished``): train nothing and write
    the table from the runs that have finished (a long queue's results so far): a cell of a run not
    finished is empty (–, None in the JSON, listed under ``"missing"``), and the header says how many
    runs of how many it holds. ``train_only`` (``--train-only``): train (or continue) the runs and stop,
    measuring each but writing no table, and pass over a run another process is training or finished
    meanwhile (its lock), so that several processes (GPUs, machines) given the same command and store
    split the table's runs; returns ``{"trained", "passed_over"}``, lists of store hashes."""
    if finished:
        return _finished_only(study_id, dataset, run_dir, overrides, seeds, store)
    p = _prepare(study_id, dataset, run_dir, overrides, seeds, store, plan=plan_only)
    study, configs, run_dir, store, cells, runs = p.study, p.configs, p.run_dir, p.store, p.cells, p.runs
    from bayesncl.data import DataError, dataset_info

    for data in {repr(cfg.data): cfg.data for cfg, _ in runs.values()}.values():
        dataset_info(data)  # the data is there (DataError before any training)
    for what, data in study.extra_data:  # and a measure's own (ncl-fs's transfer set)
        try:
            dataset_info(data)
        except DataError as e:
            raise DataError(f"{what}: {e}") from e
    to_train = {h: cfg for h, (cfg, st) in runs.items() if st != "reuse"}
    timed = not plan_only if time_here is None else time_here
    est, source = estimate_seconds(to_train, store, time_here=timed)
    _print_plan(study, dataset, seeds, store, cells, runs, est, source, p.lacking,
                None if train_only else run_dir)  # fmt: skip
    if plan_only:
        plan = {k: sorted(h for h, (_, st) in runs.items() if st == k) for k in ("train", "resume", "reuse")}
        return {**plan, "needs_weights": sorted(p.lacking)}
    _warn_cpu_resnet50(study, runs, est)
    trained, passed = _train_all(p, to_train, est, shared=train_only)
    if train_only:
        print(f"--train-only: trained {len(trained)}, passed over {len(passed)} (another process trains or "
              f"trained them); {len(runs) - len(to_train)} finished before. Once every process is done, the "
              "same command without --train-only writes the table (and trains what is left)", flush=True)
        return {"trained": trained, "passed_over": passed}
    per_run = {key: measure(store / h, configs[key], study.measures) for key, h in cells.items()}
    rows = aggregate(study, per_run, seeds)
    given = variants.named_overrides(overrides)
    return _write(study, dataset, seeds, run_dir, store, cells, runs, rows, given)


def _finished_only(study_id: str, dataset: str, run_dir: Path | None, overrides: list[str], seeds: int,
                   store: Path | None) -> dict[str, Any]:  # fmt: skip
    """``reproduce ID --finished``: :func:`reproduce`'s table of the finished runs only, training nothing
    (plan mode: a finished run without the weights a measure not cached reads is refused by
    :func:`measure` in one line, as without the flag)."""
    p = _prepare(study_id, dataset, run_dir, overrides, seeds, store, plan=True)
    done = {key: h for key, h in p.cells.items() if p.runs[h][1] == "reuse"}
    if not done:
        what = f"{len(p.cells)} run(s) of {_what(p.study)}"
        raise ConfigError(f"--finished: none of the {what} has finished in {p.store} (run it without "
                          "--finished to train them)")
    per_run = {key: measure(p.store / h, p.configs[key], p.study.measures) if key in done else {}
               for key, h in p.cells.items()}  # fmt: skip
    rows = aggregate(p.study, per_run, seeds)
    missing = {key: h for key, h in p.cells.items() if key not in done}
    given = variants.named_overrides(overrides)
    return _write(p.study, dataset, seeds, p.run_dir, p.store, p.cells, p.runs, rows, given, missing=missing)


def _write(study: Study, dataset: str, seeds: int, run_dir: Path, store: Path, cells: Cells,
           runs: dict[str, tuple[Config, str]], rows: dict[str, Any],
           given: list[str], missing: Cells | None = None) -> dict[str, Any]:  # fmt: skip
    from bayesncl.app.report import write_results
    from bayesncl.app.report.curves import write_training_curves

    run_dir.mkdir(parents=True, exist_ok=True)
    data = sorted({cfg.data.name for cfg, _ in runs.values()})
    recipe = studies.base_config(dataset, "ncl", []).data.name  # imagenet100's is imagefolder
    overridden = data and data != [recipe]  # a data.name override: say what the runs trained on
    dataset_shown = f"{', '.join(data)} (with the {dataset} recipe)" if overridden else dataset
    if given:  # the command's key=value that name its runs: a table says what it was run with
        dataset_shown += f" ({' '.join(given)})"
    result = {
        "id": study.id, "title": study.title, "dataset": dataset, "data": data, "overrides": given,
        "seeds": list(range(seeds)),
        "store": str(store), "columns": [{"header": c.header, "key": c.key} for c in study.columns],
        "rows": rows, "notes": study.notes,
        "runs": {f"{n} seed {s}": h for (n, s), h in cells.items()},
        "trained": sorted(h for h, (_, st) in runs.items() if st == "train"),
        "continued": sorted(h for h, (_, st) in runs.items() if st == "resume"),
        "reused": sorted(h for h, (_, st) in runs.items() if st == "reuse"),
    }  # fmt: skip
    missing = missing or {}
    if missing:  # --finished: the runs not finished yet, and nothing trained or continued here
        result.update(trained=[], continued=[], missing={f"{n} seed {s}": h for (n, s), h in missing.items()})
        cells = {key: h for key, h in cells.items() if key not in missing}
    md = format_study(study, rows)
    spread = f"mean ± std (ddof 1) over seeds 0..{seeds - 1}" if seeds > 1 else "one seed (0)"
    paper = any(c.get("paper") is not None for r in rows.values() for c in r.values() if isinstance(c, dict))
    versus = " vs the paper's reported values" if paper else "; the paper reports no values for this setting"
    header = f"{study.title} on {dataset_shown}: ours ({spread}){versus}."
    if missing:
        header += (f" So far: {len(cells)} of the {len(cells) + len(missing)} run(s) finished (--finished); "
                   "a cell without its run is –.")
    notes = "".join(f"\n- {n}" for n in study.notes)  # what the protocol is (printed with the plan)
    write_results(run_dir, study.stem, result, md + (f"\n\nNotes:{notes}" if notes else ""), header=header)
    for (name, s), h in cells.items():
        variants.link(run_dir, f"{variants.slug(name)}-s{s}", store / h)
    if study.panels:
        _figure(study, rows, run_dir / f"{study.stem}.png", seeds, f"{study.title} on {dataset_shown}")
    logged = {f"{n} s{s}": store / h for (n, s), h in cells.items() if s == 0}
    logged = {k: p for k, p in logged.items() if (p / "log.csv").exists()}
    if logged and len(logged) <= 12:
        write_training_curves(list(logged.values()), run_dir / "curves.png", labels=list(logged))
    print(header)
    print(md)
    figure = f", {study.stem}.png" if study.panels else ""
    print(f"wrote {run_dir / (study.stem + '.md')} and .json{figure}")
    # the HTML report of seed 0 of every variant (the table holds the seeds' spread)
    seed0 = [run_dir / f"{variants.slug(n)}-s0" for n, s in cells if s == 0]
    intro = (f"{header} This page: seed 0 of each variant (the table holds the seeds' mean ± std)."
             if seeds > 1 else header)  # fmt: skip
    variants.write_report(seed0, run_dir / "report", next(iter(runs.values()))[0],
                          heading=_what(study, start=True),
                          intro=intro, table=f"../{study.stem}.md",
                          figure=f"../{study.stem}.png" if study.panels else "")
    return result
