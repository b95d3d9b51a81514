"""The NCL paper's comparisons and further evaluations, and the BayesNCL paper's Appendix J, as studies
for ``bayesncl reproduce ID``: ``ncl-sparsity`` (L1 against non-negativity), ``ncl-spectral`` (the
spectral loss), ``ncl-supervised`` (CE/NCE, SupCon/NCL-SupCon), ``ncl-dead`` (ReLU against the
GELU-gradient reparameterisation), ``ncl-mig`` (dSprites, MIG), ``ncl-ood`` (corrupted / shifted test
sets) and ``appj`` (semantic entropy against background share per dimension, ``fashion-mnist-bg``),
with the measures they need and those of ncl-fs's NCL map and transfer columns.

Importing the module adds its builders to :data:`bayesncl.paper.studies.STUDIES`; :data:`MEASURES`
is merged into :data:`bayesncl.paper.reproduce.MEASURES` (the study machinery is every table's).

Paper values: the NCL paper (Wang et al., ICLR 2024) as our seed summary records them: spectral CL on
CIFAR-10, linear accuracy 88.0 → 88.6 with non-negative outputs and 88.0 → 87.2 with L1 instead; an
L1 regulariser reaching 0.03 % sparsity where NCL reaches 69.65 % (the dataset is not given, so the
tables print it as a note, not as a paper value).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bayesncl.config import Config, ConfigError
from bayesncl.paper import studies
from bayesncl.paper.studies import (
    LP1,
    SC,
    Column,
    Panel,
    Row,
    Series,
    Study,
    Variant,
    base_config,
    recipe_for,
    rows_of,
    transfer_config,
)
from bayesncl.paper.variants import files_only, finished_metrics, load_stored, stored_features

L1_BETAS = (1e-3, 1e-2, 1e-1, 1.0)  # ncl-sparsity: β over 3 decades (a module constant: tests shorten it)
SPARSITY = [Column("sparsity % (|x|<1e-5)", "sparsity_paper"), Column("sparsity % (ε)", "sparsity_eps")]
SPECTRAL_PAPER = {"cifar10": {"SCL": 88.0, "NCL-SCL": 88.6, "SCL+L1": 87.2}}  # LP@1, linear accuracy
SPARSITY_NOTE = "paper: L1 reaches 0.03 % sparsity where NCL reaches 69.65 % (the dataset is not given)"
MIG_METHODS = (("CL", "cl"), ("NCL", "ncl"), ("BayesNCL", "bayesncl"))
APPJ_METHODS = MIG_METHODS
OOD_CORRUPTIONS: tuple[str, ...] | None = None  # None: the 15 ImageNet-C benchmark corruptions
OOD_SEVERITIES = (1, 2, 3, 4, 5)


# ----------------------------------------------------------------- sparsity, spectral, supervised, dead
def _variant(dataset: str, name: str, method: str, *overrides: str) -> Variant:
    """A variant of ``method``; on a dataset whose recipes set φ and where ``method`` has no recipe of
    its own (the CL recipe stands in: :func:`~bayesncl.paper.studies.recipe_for`), also its φ."""
    from bayesncl.core import methods

    own = recipe_for(dataset, method).stem == f"{dataset}-{method}" or dataset.startswith("fashion-mnist")
    phi = () if own else (f"method.nonneg={methods.get(method).nonneg}",)
    return Variant(name, method, (*phi, *overrides))


def ncl_sparsity(dataset: str, overrides: list[str]) -> Study:
    l1 = [_variant(dataset, f"CL+L1 β={b:g}", "cl-l1", f"method.beta={b}") for b in L1_BETAS]
    variants = [Variant("CL", "cl"), *l1, Variant("NCL", "ncl")]
    panels = [Panel(f"{c.header} against β", "β (L1 weight)", c.header + ("" if "%" in c.header else " (%)"),
                    (Series("CL+L1", tuple((b, v.name, c.key) for b, v in zip(L1_BETAS, l1, strict=True))),
                     Series("CL", ((None, "CL", c.key),)), Series("NCL", ((None, "NCL", c.key),))),
                    xscale="log") for c in (SPARSITY[0], SC, LP1)]  # fmt: skip
    notes = ["sparsity: the fraction of test features with |x| < 1e-5 (the paper's, on the unit rows z̃) and "
             "with |x| ≤ 1e-5·‖row‖ (ours, docs/metrics.md)", SPARSITY_NOTE]
    title = "NCL paper: sparsity from L1 against non-negativity"
    return Study("ncl-sparsity", title, "ncl-sparsity", variants, [("sparsity", ())], [*SPARSITY, SC, LP1],
                 rows_of(variants), panels=panels,
                 defines=("method.name", "method.beta", "method.nonneg"), notes=notes)  # fmt: skip


def ncl_spectral(dataset: str, overrides: list[str]) -> Study:
    names = (("SCL", "scl"), ("NCL-SCL", "ncl-scl"), ("SCL+L1", "scl-l1"))
    variants = [_variant(dataset, n, m) for n, m in names]
    beta = base_config(dataset, "scl-l1", overrides).method.beta
    paper = {n: {LP1.key: v} for n, v in SPECTRAL_PAPER.get(dataset, {}).items()}
    notes = [f"SCL+L1 at β={beta:g} (method.beta); the paper's 88.0/88.6/87.2 are its own linear protocol"]
    return Study("ncl-spectral", "NCL paper: the spectral contrastive loss, non-negative and with L1",
                 "ncl-spectral", variants, [("sparsity", ())], [LP1, SC, *SPARSITY], rows_of(variants), paper,
                 defines=("method.name", "method.nonneg"), notes=notes)  # fmt: skip


def ncl_supervised(dataset: str, overrides: list[str]) -> Study:
    names = (("CE", "ce"), ("NCE", "nce"), ("SupCon", "supcon"), ("NCL-SupCon", "ncl-supcon"))
    variants = [_variant(dataset, n, m) for n, m in names]
    columns = [Column("own classifier", "head_acc1"), LP1, SC, *SPARSITY]
    notes = ["own classifier: test accuracy of the classifier CE/NCE train on z (SupCon has none); "
             "LP@1: the fast linear probe on frozen h, as for every other table"]
    return Study("ncl-supervised", "NCL paper: non-negativity in supervised learning (CE/NCE, SupCon)",
                 "ncl-supervised", variants, [("head", ()), ("sparsity", ())], columns, rows_of(variants),
                 defines=("method.name", "method.nonneg"), notes=notes)  # fmt: skip


def ncl_dead(dataset: str, overrides: list[str]) -> Study:
    cfg = base_config(dataset, "ncl", overrides)
    if cfg.train.monitor_samples == 0:  # its per-epoch rows read the monitor: none would have a value
        raise ConfigError(
            "train.monitor_samples=0: ncl-dead reads the dead dims per epoch from the held-out monitor, "
            "which 0 turns off; give train.monitor_samples >= 1 (the recipe's, or leave it out)"
        )
    every = cfg.train.monitor_every
    epochs = tuple(range(every, cfg.train.epochs + 1, every))
    variants = [Variant("ReLU", "ncl", ("method.nonneg=relu",)), Variant("rep_relu", "ncl")]
    dead = Column("dead dims", "dead_dims", "{:.1f}")
    per_epoch = [Row(f"{v.name} epoch {e}", v.name, f"e{e}.") for v in variants for e in epochs]
    rows = [*rows_of(variants), *per_epoch]
    panels = [Panel("dead dimensions over training", "epoch", "dims never active on the held-out images",
                    tuple(Series(v.name, tuple((e, f"{v.name} epoch {e}", dead.key) for e in epochs))
                          for v in variants))]  # fmt: skip
    notes = [f"dead dims: of D={cfg.model.proj_dim}, never active on the test split (final rows) or on the "
             f"held-out monitor's {cfg.train.monitor_samples} test images (per epoch, log.csv)",
             "paper: rep_relu revives dead neurons (feature diversity) on CIFAR; ReLU is better on IN-100"]
    title = "NCL paper: ReLU against rep_relu (dead dimensions, feature diversity)"
    return Study("ncl-dead", title, "ncl-dead", variants, [("dead", ())], [dead, SC, LP1], rows,
                 panels=panels, defines=("method.name", "method.nonneg"), notes=notes,
                 monitor="the per-epoch dead dims (log.csv's heldout_active_dims)")  # fmt: skip


# ----------------------------------------------------------------------------- their measures
def m_sparsity(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """Sparsity of the test features z̃ in %: the paper's (|x| < 1e-5, entries of unit rows) and ours
    (the ``sparsity`` metric, relative to each row's norm)."""
    _, test = stored_features(sub, cfg)
    ours = finished_metrics(sub).get("sparsity")
    out = {"sparsity_paper": 100.0 * float((abs(test.features) < 1e-5).mean())}
    if isinstance(ours, (int, float)):
        out["sparsity_eps"] = 100.0 * float(ours)
    return out


def m_head(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """Test accuracy (%) of the method's own classifier (``heads.classifier``: CE, NCE) on its raw
    features z (z ⊙ m with a gate); nothing for a method without one."""
    import torch

    from bayesncl.app.evaluate import extract_split
    from bayesncl.core.parts import raw_features

    model, loaded, _ = load_stored(sub, cfg)
    if "classifier" not in model.heads:
        return {}
    device = next(model.parameters()).device
    test = extract_split(model, loaded, "test", device, keys=("z", "mask"))
    z = torch.as_tensor(test["z"], device=device)
    mask = None if test.get("mask") is None else torch.as_tensor(test["mask"], device=device)
    with torch.no_grad():
        pred = model.heads["classifier"](raw_features(z, mask)).argmax(1).cpu().numpy()
    return {"head_acc1": 100.0 * float((pred == test["labels"]).mean())}


@files_only
def m_dead(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """Dead dims (never active): D − the test split's active dims (final), and D − log.csv's
    ``heldout_active_dims`` per epoch (``e{epoch}.dead_dims``)."""
    import csv

    d = cfg.model.proj_dim
    out: dict[str, float] = {}
    active = finished_metrics(sub).get("active_dims")
    if isinstance(active, (int, float)):
        out["dead_dims"] = float(d - active)
    with open(sub / "log.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("heldout_active_dims"):
                out[f"e{int(row['epoch'])}.dead_dims"] = float(d - float(row["heldout_active_dims"]))
    return out


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
                 [("mig", ())], columns, rows_of(variants),
                 {"NCL": {"mig": 0.065}}, defines=("method.name", "data.name"), notes=notes)  # fmt: skip


# (a measure's NaN, e.g. MIG of a constant code, is stored as null and left out of the cell's mean)
def _m_mig(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.metrics.disentanglement import mig

    _, test = stored_features(sub, cfg)
    r = mig(test.features, test.factors, test.factor_names)
    return {"mig": r["mig"], **{f"mig.{k}": v for k, v in r["mig_per_factor"].items()}}


# ----------------------------------------------------------------------------- ncl-ood
def _ncl_ood(dataset: str, overrides: list[str]) -> Study:
    from bayesncl.data.corruptions import CORRUPTIONS, check_corruptions

    names, sevs = check_corruptions(OOD_CORRUPTIONS or CORRUPTIONS, OOD_SEVERITIES)
    variants = [Variant(n, m) for n, m in MIG_METHODS]
    columns = [Column("clean", "clean_acc1"), *(Column(f"s{s}", f"sev{s}") for s in sevs),
               Column("mean", "corruption_mean")]  # fmt: skip
    if dataset == "imagenet100":
        columns += [Column("Sketch", "sketch_acc1"), Column("Stylized", "stylized_acc1")]
    rows = rows_of(variants)
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


def _m_ood(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.app.ood import ood_evaluate

    names, sevs = params
    model, loaded, _ = load_stored(sub, cfg)
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
    return out


# ----------------------------------------------------------------------------- appendix J
def _appj(dataset: str, overrides: list[str]) -> Study:
    from bayesncl.metrics.entropy_background import BINS

    variants = [Variant(n, m, ("data.name=fashion-mnist-bg",)) for n, m in APPJ_METHODS]
    columns = [Column("ρ(H, bg share)", "spearman", "{:.3f}"), Column("dims", "dims", "{:.0f}"),
               Column("H_sum (nats)", "entropy", "{:.3f}"), Column("bg share", "bg_share", "{:.3f}"),
               Column("bg dims", "bg_dims", "{:.3f}")]  # fmt: skip
    rows = rows_of(variants)
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


def _m_appj(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    from bayesncl.metrics.entropy_background import entropy_background

    _, test = stored_features(sub, cfg)
    return entropy_background(test.features, test.labels, test.places)


def _m_nclmap(sub: Path, cfg: Config, ks: tuple[Any, ...]) -> dict[str, float]:
    """NCL's own retrieval ``map`` (:mod:`bayesncl.metrics.ncl_retrieval`) at each K, for ncl-fs."""
    from bayesncl.metrics.ncl_retrieval import ncl_map

    _, test = stored_features(sub, cfg)
    return {f"K{k}.ncl_map": ncl_map(test.features, test.labels, int(k)) for k in ks}


# ----------------------------------------------------------------------------- ncl-fs: transfer
def _m_fs_transfer(sub: Path, cfg: Config, params: tuple[Any, ...]) -> dict[str, float]:
    """ncl-fs's transfer columns: :func:`~bayesncl.metrics.selection_probes` on the z̃ of the transfer
    set ``params[0]`` = (data.name, train_subset, test_subset), both splits through the stored run's
    frozen encoder, the top-K dims ranked on the transfer set's own train split (as the NCL code's
    selected-dims probe ranks on the split it is fitted on: ``solo/methods/linear.py``), at every K
    of ``params[1]``; keys ``K<k>.transfer_top_acc1`` / ``K<k>.transfer_random_acc1``. The data is read
    under this command's ``data.root`` (:func:`~bayesncl.paper.variants.load_stored`, as every measure
    reads it), the root the study's ``extra_data`` check read before any training."""
    from bayesncl.app.evaluate import extract_split
    from bayesncl.metrics import selection_probes

    (name, n_train, n_test), ks = params
    model, loaded, _ = load_stored(sub, cfg)
    moved = transfer_config(loaded, name, n_train, n_test)
    device = next(model.parameters()).device
    train, test = (extract_split(model, moved, s, device, keys=("features",)) for s in ("train", "test"))
    r = selection_probes(train["features"], train["labels"], test["features"], test["labels"],
                         [int(k) for k in ks], seed=cfg.seed)  # fmt: skip
    return {f"K{k}.transfer_{m}": v for k, row in r.items() for m, v in row.items()}


STUDIES: dict[str, Callable[[str, list[str]], Study]] = {
    "ncl-sparsity": ncl_sparsity, "ncl-spectral": ncl_spectral, "ncl-supervised": ncl_supervised,
    "ncl-dead": ncl_dead, "ncl-mig": _ncl_mig, "ncl-ood": _ncl_ood, "appj": _appj,
}  # fmt: skip
"""This module's studies by reproduce ID (added to :data:`bayesncl.paper.studies.STUDIES`)."""
MEASURES = {"sparsity": m_sparsity, "head": m_head, "dead": m_dead, "mig": _m_mig, "ood": _m_ood,
            "appj": _m_appj, "nclmap": _m_nclmap, "fs_transfer": _m_fs_transfer}  # fmt: skip
"""What this module's studies (and ncl-fs) measure: ``reproduce.MEASURES`` entries."""
studies.STUDIES.update(STUDIES)
