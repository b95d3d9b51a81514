"""The NCL paper's further evaluations and the BayesNCL paper's Appendix J as ``reproduce`` studies
(issue 26): ``ncl-mig`` (dSprites, MIG), ``ncl-ood`` (corrupted / shifted test sets) and ``appj``
(semantic entropy against background share per dimension, ``fashion-mnist-bg``).

Each adds its builder to :data:`bayesncl.paper.studies.STUDIES` and what it measures to
:data:`MEASURES` (merged into :data:`bayesncl.paper.reproduce.MEASURES`); the study machinery (store,
seeds, cache, table, figure) is the one of every other table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bayesncl.config import Config
from bayesncl.paper import studies
from bayesncl.paper.studies import Column, Panel, Row, Series, Study, Variant

__all__ = ["APPJ_METHODS", "MEASURES", "MIG_METHODS", "OOD_CORRUPTIONS", "OOD_SEVERITIES", "STUDIES"]

MIG_METHODS = (("CL", "cl"), ("NCL", "ncl"), ("BayesNCL", "bayesncl"))
APPJ_METHODS = MIG_METHODS
OOD_CORRUPTIONS: tuple[str, ...] | None = None  # None: the 15 ImageNet-C benchmark corruptions
OOD_SEVERITIES = (1, 2, 3, 4, 5)


def _finite(values: dict[str, Any]) -> dict[str, float | None]:
    """NaN -> None (the cache is strict JSON; a missing cell is left out of the mean)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}


# ----------------------------------------------------------------------------- ncl-mig
def _ncl_mig(dataset: str, overrides: list[str]) -> Study:
    from bayesncl.data.dsprites import FACTOR_NAMES, TEST_SIZE

    variants = [Variant(n, m, ("data.name=dsprites",)) for n, m in MIG_METHODS]
    per_factor = [Column(f"MIG {f}", f"mig.{f}", "{:.3f}") for f in FACTOR_NAMES]
    columns = [Column("MIG", "mig", "{:.3f}"), *per_factor, Column("LP@1 (shape)", "linear_probe_acc1")]
    notes = [
        "dSprites generated (data.name=dsprites): the recipe's data.train_subset images of the 737,280 "
        f"(0: all), MIG on the test sample (data.test_subset, default {TEST_SIZE}), z̃, 20 equal-width bins "
        "per dim",
        "the paper reports NCL's MIG (0.065), not CL's",
    ]
    return Study("ncl-mig", "NCL paper: disentanglement on dSprites (MIG)", "ncl-mig", variants,
                 [("mig", ())], columns, [Row(v.name, v.name) for v in variants],
                 {"NCL": {"mig": 0.065}}, defines=("method.name", "data.name"), notes=notes)  # fmt: skip


def _m_mig(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float | None]:
    from bayesncl.metrics.disentanglement import mig
    from bayesncl.paper.variants import stored_features as _features

    _, test = _features(sub)
    r = mig(test.features, test.factors, test.factor_names)
    return _finite({"mig": r["mig"], **{f"mig.{k}": v for k, v in r["mig_per_factor"].items()}})


# ----------------------------------------------------------------------------- ncl-ood
def _ood_names(dataset: str) -> tuple[str, ...]:
    from bayesncl.data.corruptions import CORRUPTIONS

    return OOD_CORRUPTIONS or CORRUPTIONS


def _ncl_ood(dataset: str, overrides: list[str]) -> Study:
    from bayesncl.data.corruptions import check_corruptions

    names, sevs = check_corruptions(_ood_names(dataset), OOD_SEVERITIES)
    variants = [Variant(n, m) for n, m in MIG_METHODS]
    columns = [Column("clean", "clean_acc1"), *(Column(f"s{s}", f"sev{s}") for s in sevs),
               Column("mean", "corruption_mean")]  # fmt: skip
    if dataset == "imagenet100":
        columns += [Column("Sketch", "sketch_acc1"), Column("Stylized", "stylized_acc1")]
    rows = [Row(v.name, v.name) for v in variants]
    rows += [Row(f"{v.name} {c}", v.name, f"{c}.") for v in variants for c in names]
    paper: dict[str, dict[str, float]] = {}
    if dataset == "imagenet100":  # ImageNet-C, mean over corruptions and severities
        paper = {"CL": {"corruption_mean": 34.5}, "NCL": {"corruption_mean": 36.1}}
    panels = [Panel("mean over corruptions", "severity (0 = clean)", "linear probe Acc@1 (%)", tuple(
        Series(v.name, ((0.0, v.name, "clean_acc1"), *((float(s), v.name, f"sev{s}") for s in sevs)))
        for v in variants))]  # fmt: skip
    where = "the test split corrupted here (imagecorruptions, seed 0, cached)"
    if dataset == "imagenet100":
        where = "the released imagenet-c/, imagenet-sketch/, stylized-imagenet/ under data.root"
    notes = [f"fast linear probe fitted on clean train h, tested on {where}; {len(names)} corruptions x "
             f"severities {', '.join(map(str, sevs))}; rows '<method> <corruption>': that corruption alone"]
    return Study("ncl-ood", "NCL paper: out-of-distribution transfer (linear probe on shifted test sets)",
                 "ncl-ood", variants, [("ood", (tuple(names), tuple(sevs)))], columns, rows, paper, panels,
                 notes=notes)  # fmt: skip


def _m_ood(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float | None]:
    from bayesncl.app.evaluate import load_trained
    from bayesncl.app.ood import ood_evaluate

    names, sevs = params
    model, loaded, _ = load_trained(sub)
    folder = loaded.data.name == "imagefolder"
    names = None if folder else list(names)  # a folder: every corruption folder of its imagenet-c/
    r = ood_evaluate(model, loaded, corruptions=names, severities=list(sevs), seed=0)
    out: dict[str, Any] = {"clean_acc1": r["clean_acc1"], "corruption_mean": r.get("corruption_mean")}
    out.update({f"sev{s}": v for s, v in r.get("severity_mean", {}).items()})
    for c, row in r.get("corruptions", {}).items():
        out.update({f"{c}.sev{s}": v for s, v in row.items()})
        out[f"{c}.corruption_mean"] = sum(row.values()) / len(row)
    for key in ("sketch_acc1", "stylized_acc1"):
        if key in r:
            out[key] = r[key]
    return _finite(out)


# ----------------------------------------------------------------------------- appendix J
def _appj(dataset: str, overrides: list[str]) -> Study:
    from bayesncl.metrics.entropy_background import BINS

    variants = [Variant(n, m, ("data.name=fashion-mnist-bg",)) for n, m in APPJ_METHODS]
    columns = [Column("ρ(H, bg share)", "spearman", "{:.3f}"), Column("dims", "dims", "{:.0f}"),
               Column("H_sum (nats)", "entropy", "{:.3f}"), Column("bg share", "bg_share", "{:.3f}"),
               Column("bg dims", "bg_dims", "{:.3f}")]  # fmt: skip
    rows = [Row(v.name, v.name) for v in variants]
    rows += [Row(f"{v.name} H quartile {i}", v.name, f"q{i}.") for v in variants for i in range(1, BINS + 1)]
    panels = [
        Panel(title, "semantic entropy quartile (1 = lowest H)", ylabel, tuple(
            Series(v.name, tuple((float(i), f"{v.name} H quartile {i}", key) for i in range(1, BINS + 1)))
            for v in variants))
        for title, ylabel, key in (("background share by entropy", "mean background share", "bg_share"),
                                   ("background dims by entropy", "share of background dims", "bg_dims"))
    ]  # fmt: skip
    notes = ["on fashion-mnist-bg (backgrounds independent of the class), test-split z̃; background share "
             "b_k = place lift / (class lift + place lift) (docs/metrics.md, 'Appendix J'); the paper shows "
             "this for ImageNet-scale NCL without numbers"]
    title = "BayesNCL Appendix J: high-entropy dimensions encode the background"
    return Study("appj", title, "appj", variants, [("appj", ())], columns, rows, panels=panels,
                 defines=("method.name", "data.name"), notes=notes)  # fmt: skip


def _m_appj(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float | None]:
    from bayesncl.metrics.entropy_background import entropy_background
    from bayesncl.paper.variants import stored_features as _features

    _, test = _features(sub)
    return _finite(entropy_background(test.features, test.labels, test.places))


def _m_nclmap(sub: Path, cfg: Config, ks: tuple[Any, ...]) -> dict[str, float | None]:
    """NCL's own retrieval ``map`` (:mod:`bayesncl.metrics.ncl_retrieval`) at each K, for ncl-fs."""
    from bayesncl.metrics.ncl_retrieval import ncl_map
    from bayesncl.paper.variants import stored_features as _features

    _, test = _features(sub)
    return {f"K{k}.ncl_map": ncl_map(test.features, test.labels, int(k)) for k in ks}


# ----------------------------------------------------------------------------- ncl-fs: transfer
def transfer_config(cfg: Config, name: str, train_subset: int = 0, test_subset: int = 0) -> Config:
    """``cfg`` with its data replaced by the labelled dataset ``name`` (``train_subset`` /
    ``test_subset`` images, 0: all; the run's ``data.root``, ``data.download`` and image size), the
    way ``eval.data.*`` is read (:func:`bayesncl.config.eval_data`); ``cfg`` itself is not altered."""
    import dataclasses

    from bayesncl.app.evaldata import with_eval_data
    from bayesncl.config import EvalDataConfig

    moved = EvalDataConfig(name=name, root=cfg.data.root, download=cfg.data.download,
                           train_subset=int(train_subset), test_subset=int(test_subset))  # fmt: skip
    return with_eval_data(dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, data=moved)))


def _m_fs_transfer(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """ncl-fs's transfer columns: :func:`~bayesncl.metrics.selection_probes` on the z̃ of the transfer
    set ``params[0]`` = (data.name, train_subset, test_subset), both splits through the stored run's
    frozen encoder, the top-K dims ranked on the transfer set's own train split (as the NCL code's
    selected-dims probe ranks on the split it is fitted on: ``solo/methods/linear.py``), at every K
    of ``params[1]``; keys ``K<k>.transfer_top_acc1`` / ``K<k>.transfer_random_acc1``. Raises
    DataError (one line, naming the set) when the transfer set cannot be read."""
    from bayesncl.app.evaluate import extract_split, load_trained
    from bayesncl.data import DataError
    from bayesncl.metrics import selection_probes

    (name, n_train, n_test), ks = params
    model, loaded, _ = load_trained(sub)
    moved = transfer_config(loaded, name, n_train, n_test)
    device = next(model.parameters()).device
    try:
        train, test = (extract_split(model, moved, s, device, keys=("features",)) for s in ("train", "test"))
    except DataError as e:
        where = f"studies.TRANSFER_DATA for {loaded.data.name}"
        raise DataError(f"ncl-fs's transfer set {name} ({where}): {e}") from e
    r = selection_probes(train["features"], train["labels"], test["features"], test["labels"],
                         [int(k) for k in ks], seed=cfg.seed)  # fmt: skip
    return {f"K{k}.transfer_{m}": v for k, row in r.items() for m, v in row.items()}


STUDIES: dict[str, Callable[[str, list[str]], Study]] = {
    "ncl-mig": _ncl_mig, "ncl-ood": _ncl_ood, "appj": _appj,
}
MEASURES = {"mig": _m_mig, "ood": _m_ood, "appj": _m_appj, "nclmap": _m_nclmap, "fs_transfer": _m_fs_transfer}
studies.STUDIES.update(STUDIES)
