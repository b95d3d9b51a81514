"""Every table and figure of both papers as a *study* for ``bayesncl reproduce ID`` (data only).

A study is a list of variants (a method and overrides on the dataset's recipe), the measures to
take of every trained variant (:data:`bayesncl.paper.reproduce.MEASURES`), the table's rows and
columns, the paper's values where the paper text gives them, and for a figure its panels. What a
study sweeps may depend on the resolved recipe (the latent width D, ρ, λ): :func:`build` makes
the concrete study for a dataset and the user's overrides.

Paper values: PAPER-NOTES §4 and the two papers' texts; where a paper reports a
figure or a table without numbers in the text we have (Tables 3, 5, 15; Figs. 3, 4b), no paper
value is drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bayesncl.config import Config, ConfigError, DataConfig, build_config

RECIPES = Path(__file__).parents[1] / "configs"
DATASETS = ("cifar10", "cifar100", "imagenet100", "fashion-mnist", "fashion-mnist-long")


@dataclass(frozen=True)
class Variant:
    """One configuration to train (once per seed): ``method.name`` and overrides on the recipe."""

    name: str
    method: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Column:
    header: str
    key: str  # a key of the variant's measured metrics, after the row's prefix
    fmt: str = "{:.2f}"


@dataclass(frozen=True)
class Row:
    """One table row: the metrics of ``variant`` under ``prefix + column.key``; ``shared``: column keys
    read without the prefix (one measurement serving every row of the variant, e.g. the probe on h
    beside a row of other gated features)."""

    label: str
    variant: str
    prefix: str = ""
    shared: tuple[str, ...] = ()

    def key(self, column: str) -> str:
        """The measured key of this row's cell in ``column`` (a :attr:`Column.key`)."""
        return column if column in self.shared else self.prefix + column


@dataclass(frozen=True)
class Series:
    """One line of a figure panel: ``points`` are ``(x, row label, column key)``; ``paper`` the
    paper's ``(x, value)`` points, drawn beside ours. One point with ``x`` None: a reference row (not
    swept), drawn as a dashed horizontal line at its mean with its ± std band."""

    label: str
    points: tuple[tuple[float | None, str, str], ...]
    paper: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: tuple[Series, ...]
    xscale: str = "linear"


@dataclass
class Study:
    id: str
    title: str
    stem: str  # the output files' name: table1.md, fig3.png
    variants: list[Variant]
    measures: list[tuple[str, tuple[object, ...]]]  # (name in reproduce.MEASURES, its parameters)
    columns: list[Column]
    rows: list[Row]
    paper: dict[str, dict[str, float]] = field(default_factory=dict)  # row label -> column key -> value
    panels: list[Panel] = field(default_factory=list)
    defines: tuple[str, ...] = ("method.name",)  # keys the variants set: refused as overrides
    notes: list[str] = field(default_factory=list)  # printed with the plan (what the protocol is)
    checkpoints: tuple[int, ...] = ()  # the epochs whose epoch-NNNN.pt every run must keep (Table 3)
    # what of the held-out monitor (log.csv's heldout_*) a measure reads, "" for none: every run must
    # have logged it as this command would (variants.check_dirs; ncl-dead's per-epoch dead dims)
    monitor: str = ""
    # (what, data) a measure reads besides the runs' data: checked with theirs before any training
    extra_data: tuple[tuple[str, DataConfig], ...] = ()


def recipe_for(dataset: str, method: str) -> Path:
    """The shipped recipe for ``dataset`` × ``method``: fashion-mnist: the demo's budget;
    fashion-mnist-long: the long CPU recipe (Fashion-MNIST at ~30x the demo's steps); both for any
    method; else ``<dataset>-<method>.yaml``, or the dataset's CL recipe for a method without its own
    (a study then sets the method's φ)."""
    if dataset == "fashion-mnist":
        return RECIPES / "fashion-mnist-demo.yaml"
    if (RECIPES / f"{dataset}.yaml").exists():
        return RECIPES / f"{dataset}.yaml"
    own = RECIPES / f"{dataset}-{method}.yaml"
    return own if own.exists() else RECIPES / f"{dataset}-cl.yaml"  # a method without its own recipe


def base_config(dataset: str, method: str, overrides: list[str]) -> Config:
    """The recipe of ``dataset`` × ``method`` with the user's overrides (no warnings: the variants'
    own resolution warns)."""
    return build_config(recipe_for(dataset, method), [f"method.name={method}", *overrides], warn_inert=False)


# ----------------------------------------------------------------------------- shared pieces
# The sweeps (module constants, so that a test can make them shorter)
GATE_LR_RATIOS = (0.1, 0.25, 0.5, 1.0)  # Table 15: gating-head lr / backbone lr
WIDTH_FACTORS = (0.25, 0.5, 1.0, 2.0)  # Fig. 4(a): latent widths D x these (the recipe's D among them)
RHOS = (0.1, 0.3, 0.5, 0.7, 0.9)  # Fig. 4(b): the prior rho
LAMS = (3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)  # Fig. 4(b): the KL weight λ (around the paper's 3e-5 and > 4e-5)
PAPER_RHO = 0.8  # the BayesNCL paper's example prior (with λ = 3e-5; it reports λ > 4e-5 hurting SC)
TABLE5_METHODS = ("cl", "ncl", "bayesncl")  # Table 5: ResNet-50
SC = Column("SC %", "semantic_consistency")
LP1 = Column("LP@1", "linear_probe_acc1")
ACT = Column("Act.", "activation_ratio", "{:.3f}")
GATE_OPEN_TEST = Column("open (test)", "gate_open_rate", "{:.4f}")  # fraction of α > threshold, test split
MEAN_ALPHA = Column("mean α (test)", "gate_mean_alpha", "{:.4f}")
HSUM = Column("H_sum", "semantic_entropy_sum", "{:.3f}")
TABLE1_COLUMNS = [SC, HSUM, ACT, LP1]
TABLE1_METHODS = [("CL", "cl"), ("NCL", "ncl"), ("NCL+TopK", "ncl-topk"),
                  ("BayesNCL (GS)", "bayesncl-gs"), ("BayesNCL (STE)", "bayesncl")]  # fmt: skip
TABLE1_PAPER = {  # SC % (PAPER-NOTES §4); IN-100 also H_sum and Act.
    "cifar10": dict(zip([n for n, _ in TABLE1_METHODS], (10.00, 53.82, 51.81, 53.68, 56.50), strict=True)),
    "cifar100": dict(zip([n for n, _ in TABLE1_METHODS], (1.00, 9.91, 12.32, 20.75, 22.02), strict=True)),
    "imagenet100": dict(zip([n for n, _ in TABLE1_METHODS], (1.00, 14.93, 14.27, 11.66, 36.14), strict=True)),
}
IN100_HSUM_ACT = {"CL": (4.59, 1.00), "NCL": (3.28, 0.48), "NCL+TopK": (3.35, 0.47),
                  "BayesNCL (GS)": (3.36, 0.13), "BayesNCL (STE)": (2.10, 0.50)}  # fmt: skip


TABLE2_K = {"cifar10": 64, "cifar100": 128, "imagenet100": 256}  # Table 2's retrieval K per dataset
RETRIEVAL = ("P@1", "P@5", "P@10", "mAP@10")
LP5 = Column("LP@5", "lp3_acc5")
LP3 = Column("LP@1", "lp3_acc1")  # the fast probe, mean of 3 probe seeds (measure probe3)


def table2_k(dataset: str, overrides: list[str]) -> int:
    """Table 2's K (selected dims) for ``dataset``: the paper's 64 / 128 / 256 for CIFAR-10 / -100 /
    ImageNet-100, 64 for fashion-mnist (10 classes, as CIFAR-10), at most the latent width D."""
    d = base_config(dataset, "ncl", overrides).model.proj_dim
    return min(TABLE2_K.get(dataset, 64), d)


def _retrieval_columns(k: int) -> list[Column]:
    return [Column(f"{m} (K={k})", f"sel.{m}") for m in RETRIEVAL]


def rows_of(variants: list[Variant]) -> list[Row]:
    """One row per variant, named as it."""
    return [Row(v.name, v.name) for v in variants]


def _table1(dataset: str, overrides: list[str]) -> Study:
    variants = [Variant(n, m) for n, m in TABLE1_METHODS]
    paper = {n: {SC.key: v} for n, v in TABLE1_PAPER.get(dataset, {}).items()}
    if dataset == "imagenet100":
        for n, (h, a) in IN100_HSUM_ACT.items():
            paper[n].update(semantic_entropy_sum=h, activation_ratio=a)
    return Study("1", "Table 1: interpretability", "table1", variants, [("base", ())], TABLE1_COLUMNS,
                 rows_of(variants), paper)  # fmt: skip


def _table2(dataset: str, overrides: list[str]) -> Study:
    variants = [Variant("CL", "cl"), Variant("NCL", "ncl"), Variant("BayesNCL", "bayesncl")]
    lp1 = {"cifar10": (87.88, 87.80, 88.02), "cifar100": (59.72, 60.67, 60.69),
           "imagenet100": (68.31, 69.63, 70.44)}  # fmt: skip
    lp5 = {"imagenet100": (90.24, 91.23, 91.71)}
    paper: dict[str, dict[str, float]] = {v.name: {} for v in variants}
    for key, table in (("lp3_acc1", lp1), ("lp3_acc5", lp5)):
        for v, value in zip(variants, table.get(dataset, ()), strict=False):
            paper[v.name][key] = value
    k = table2_k(dataset, overrides)
    columns = [LP3, LP5, Column("kNN@1", "knn_acc1"), *_retrieval_columns(k)]
    notes = ["LP@1/LP@5: the fast probe on frozen h, mean of 3 probe seeds per run (the paper: 3 seeds)",
             f"retrieval: P@1/5/10 and mAP@10 (%) on the top-{k} dims of z̃ by expected activation (the "
             "paper's K per dataset); not for CL, as in the paper (selecting dims of CL is meaningless)",
             ]  # fmt: skip
    return Study("2", "Table 2: linear probe, kNN and retrieval with feature selection", "table2", variants,
                 [("probe3", ()), ("retrieval_sel", (k,))], columns, rows_of(variants),
                 {name: v for name, v in paper.items() if v}, notes=notes)  # fmt: skip


def _checkpoints(dataset: str, overrides: list[str]) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
    """``(every, epochs, overrides)``: ~10 checkpoints, every tenth of the recipe's run (the paper looks
    every 10 of 200 epochs), and the variants' ``train.checkpoint_every`` (none where the user sets it)."""
    epochs = base_config(dataset, "bayesncl", overrides).train.epochs
    every = max(1, epochs // 10)
    given = any(o.split("=", 1)[0].strip() == "train.checkpoint_every" for o in overrides)
    ckpt = () if given else (f"train.checkpoint_every={every}",)
    return every, tuple(range(every, epochs + 1, every)), ckpt


def _table3(dataset: str, overrides: list[str]) -> Study:
    from bayesncl.app.dynamics import DYNAMICS_LABELS  # (not ρ in the labels: that is the gate's prior)

    every, epochs, ckpt = _checkpoints(dataset, overrides)
    variants = [Variant("NCL", "ncl", ckpt), Variant("BayesNCL", "bayesncl", ckpt)]
    rows = [Row(f"{v.name} epoch {e}", v.name, f"e{e}.") for v in variants for e in epochs]
    columns = [Column("AF–GV", "AF-GV", "{:.3f}"), Column("GV–SC", "GV-SC", "{:.3f}"),
               Column("AF–SC", "AF-SC", "{:.3f}")]  # fmt: skip
    panels = [
        Panel(f"{c.header}: {DYNAMICS_LABELS[c.key]}", "epoch", "Spearman rank correlation", tuple(
            Series(v.name, tuple((e, f"{v.name} epoch {e}", c.key) for e in epochs)) for v in variants
        ))
        for c in columns
    ]  # fmt: skip
    notes = [f"checkpoints every {every} epoch(s); protocol: bayesncl dynamics (docs/metrics.md)"]
    return Study("3", "Table 3: gradient dynamics (Spearman correlations per checkpoint)", "table3", variants,
                 [("dynamics", (epochs, 1024))], columns, rows, panels=panels, notes=notes,
                 checkpoints=epochs)  # fmt: skip


def _convergence(dataset: str, overrides: list[str]) -> Study:
    """Issue 24: how SC, active dims, the gate-open rate, AF–GV and LP@1 move over training, per
    method, at ~10 checkpoints (every tenth of the run): does the ordering of the methods settle?"""
    every, epochs, ckpt = _checkpoints(dataset, overrides)
    variants = [Variant(n, m, ckpt) for n, m in (("CL", "cl"), ("NCL", "ncl"), ("BayesNCL", "bayesncl"))]
    rows = [Row(f"{v.name} epoch {e}", v.name, f"e{e}.") for v in variants for e in epochs]
    columns = [Column("SC %", "semantic_consistency"), Column("active", "active_dims", "{:.1f}"),
               Column("gate open", "gate_open", "{:.3f}"), Column("AF–GV", "AF-GV", "{:.3f}"),
               Column("LP@1 (h)", "linear_probe_acc1")]  # fmt: skip
    panels = [
        Panel(c.header, "epoch", c.header, tuple(
            Series(v.name, tuple((e, f"{v.name} epoch {e}", c.key) for e in epochs))
            for v in variants if c.key != "gate_open" or v.method == "bayesncl"
        ))
        for c in columns
    ]  # fmt: skip
    notes = [f"checkpoints every {every} epoch(s): test-split SC, active dims and gate-open rate of z̃, "
             "AF–GV as Table 3 (1,024 train images), LP@1 = the fast linear probe on h"]  # fmt: skip
    return Study("convergence", "Metrics over training (convergence)", "convergence", variants,
                 [("trajectory", (epochs,)), ("dynamics", (epochs, 1024))], columns, rows, panels=panels,
                 notes=notes, checkpoints=epochs)  # fmt: skip


def _table5(dataset: str, overrides: list[str]) -> Study:
    variants = [Variant(n, m, ("model.backbone=resnet50",)) for n, m in TABLE1_METHODS if m in TABLE5_METHODS]
    return Study("5", "Table 5: interpretability with ResNet-50", "table5", variants, [("base", ())],
                 TABLE1_COLUMNS, rows_of(variants), defines=("method.name", "model.backbone"))  # fmt: skip


def _table15(dataset: str, overrides: list[str]) -> Study:
    ratios = GATE_LR_RATIOS
    variants = [Variant(f"gate lr ×{r:g}", "bayesncl", (f"method.gate_lr_ratio={r}",)) for r in ratios]
    pairs = list(zip(ratios, variants, strict=True))
    panels = [Panel(c.header, "gating-head lr / backbone lr", "SC (%)" if c is SC else "LP@1 (%)",
                    (Series("BayesNCL", tuple((r, v.name, c.key) for r, v in pairs)),), xscale="log")
              for c in (SC, LP1)]  # fmt: skip
    return Study("15", "Table 15: gating-head learning rate (× the backbone's)", "table15", variants,
                 [("base", ())], [SC, LP1], rows_of(variants), panels=panels,
                 defines=("method.name", "method.gate_lr_ratio"),
                 notes=["the paper finds 0.25× best (no values in the text we have)"])  # fmt: skip


def k_grid(d: int) -> tuple[int, ...]:
    """Fig. 3's K values for latent width ``d``: 32, 64, ... up to min(512, D) as the authors sweep
    (D >= 64), else D/8, 2D/8, ..., D (at least 1)."""
    if d >= 64:
        return tuple(range(32, min(512, d) + 1, 32))
    return tuple(sorted({max(1, round(d * i / 8)) for i in range(1, 9)}))


def _method_pair(names: tuple[str, str] = ("NCL", "BayesNCL")) -> list[Variant]:
    return [Variant(n, n.lower()) for n in names]


def _fig3(dataset: str, overrides: list[str]) -> Study:
    d = base_config(dataset, "bayesncl", overrides).model.proj_dim
    ks = k_grid(d)
    variants = _method_pair()
    metrics = ("P@1", "P@5", "P@10", "mAP@10")
    columns = [Column(m, m) for m in metrics]
    rows = [Row(f"{v.name} K={k}", v.name, f"K{k}.") for v in variants for k in ks]
    panels = [Panel(m, "selected dims K", f"{m} (%)", tuple(
        Series(v.name, tuple((k, f"{v.name} K={k}", m) for k in ks)) for v in variants)) for m in metrics]
    notes = [f"K = {', '.join(map(str, ks))} of D={d} (top-K dims by expected activation)"]
    return Study("fig3", "Fig. 3: retrieval with feature selection against K", "fig3", variants,
                 [("retrieval", ks)], columns, rows, panels=panels, notes=notes)  # fmt: skip


def _fig4a(dataset: str, overrides: list[str]) -> Study:
    d = base_config(dataset, "bayesncl", overrides).model.proj_dim
    widths = tuple(sorted({max(1, round(d * f)) for f in WIDTH_FACTORS}))
    variants = [Variant(f"{n} D={w}", n.lower(), (f"model.proj_dim={w}",)) for n in ("NCL", "BayesNCL")
                for w in widths]  # fmt: skip
    paper = {"NCL": ((2048.0, 14.93),), "BayesNCL": ((2048.0, 36.14),)} if dataset == "imagenet100" else {}
    panels = [Panel("SC against latent width", "latent width D (dims)", "SC (%)", tuple(
        Series(n, tuple((w, f"{n} D={w}", SC.key) for w in widths), paper.get(n, ()))
        for n in ("NCL", "BayesNCL")), xscale="log")]  # fmt: skip
    return Study("fig4a", "Fig. 4(a): semantic consistency against the latent width D", "fig4a", variants,
                 [("base", ())], [SC, LP1], rows_of(variants), panels=panels)  # fmt: skip


def _fig4b(dataset: str, overrides: list[str]) -> Study:
    cfg = base_config(dataset, "bayesncl", overrides)
    rho0, lam0 = cfg.method.rho, cfg.method.lam
    lines = tuple(dict.fromkeys((PAPER_RHO, rho0)))  # the paper's example ρ first, then the recipe's

    def cell(rho: float, lam: float) -> Variant:
        return Variant(f"rho={rho:g} lambda={lam:g}", "bayesncl", (f"method.rho={rho}", f"method.lam={lam}"))

    lam_sweep = {r: {lam: cell(r, lam) for lam in LAMS} for r in lines}
    rho_sweep = {r: cell(r, lam0) for r in RHOS}
    # the ρ panels draw every cell at λ0: the ρ sweep and the λ lines' cells there (the paper's ρ = 0.8)
    at_lam0 = {r: d[lam0] for r, d in lam_sweep.items() if lam0 in d}
    rho_points = dict(sorted({**rho_sweep, **at_lam0}.items()))
    variants = list({v.name: v for v in [*(v for d in lam_sweep.values() for v in d.values()),
                                          *rho_sweep.values()]}.values())  # fmt: skip
    open_col = GATE_OPEN_TEST
    panels = [
        *(Panel(f"{c.header} against λ", "λ (KL weight)", c.header + ("" if "%" in c.header else ""),
                tuple(Series(f"ρ={r:g}", tuple((lam, v.name, c.key) for lam, v in lam_sweep[r].items()))
                      for r in lines), xscale="log") for c in (SC, open_col)),
        *(Panel(f"{c.header} against ρ (λ={lam0:g})", "ρ (prior)", c.header,
                (Series(f"λ={lam0:g}", tuple((r, v.name, c.key) for r, v in rho_points.items())),))
          for c in (SC, open_col)),
    ]  # fmt: skip
    notes = [f"λ swept over {', '.join(f'{x:g}' for x in LAMS)} at ρ = {', '.join(f'{r:g}' for r in lines)} "
             f"(the paper's example ρ = {PAPER_RHO:g}, and the base config's); ρ swept at λ = {lam0:g}, "
             f"the config's after overrides (`method.lam=X` sweeps ρ at another λ: the λ lines are reused)",
             "open (test): the share of the test split's gates with α > threshold (the hard mask the "
             "features are gated by); mean α: the mean gate probability on the test split"]  # fmt: skip
    columns = [SC, LP1, ACT, open_col, MEAN_ALPHA]
    return Study("fig4b", "Fig. 4(b): SC, LP@1 and the gate's open rate against ρ and λ", "fig4b", variants,
                 [("base", ())], columns, rows_of(variants), panels=panels, notes=notes)  # fmt: skip


# ncl-fs's transfer columns: the run's data.name -> (transfer data.name, train_subset, test_subset; 0:
# the whole split) on whose labelled splits the selection probes are fitted and tested, through the run's
# frozen encoder (why these sets: docs/paper-notes.md N13). No entry (image folders, imagenet100,
# synthetic): the columns stay empty and a note says so. A module constant: tests replace it.
TRANSFER_DATA: dict[str, tuple[str, int, int]] = {
    "fashion-mnist": ("dsprites", 10_000, 5_000),
    "cifar10": ("cifar100", 0, 0),
    "cifar100": ("cifar10", 0, 0),
    "stl10": ("cifar10", 0, 0),
}


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


def _ncl_fs_paper(d: int) -> dict[str, dict[str, float]]:
    """The NCL paper's ImageNet-100 cells (our seed summary of it): top-512 68.9, CL random 512 66.2,
    its code's map 10.9 -> 14.2 (all dims) and 14.2 (top 512), transfer 19.9 (all dims), 19.8 (top 512)."""
    return {"NCL K=512": {"top_acc1": 68.9, "ncl_map": 14.2, "transfer_top_acc1": 19.8},
            "CL K=512": {"random_acc1": 66.2}, f"CL K={d}": {"ncl_map": 10.9},
            f"NCL K={d}": {"ncl_map": 14.2, "transfer_top_acc1": 19.9}}  # fmt: skip


def _ncl_fs(dataset: str, overrides: list[str]) -> Study:
    cfg = base_config(dataset, "ncl", overrides)
    d = cfg.model.proj_dim
    ks = tuple(sorted({max(1, d >> i) for i in range(5, -1, -1)}))
    variants = _method_pair(("CL", "NCL"))
    probes = [Column("top-K by EA", "top_acc1"), Column("random K", "random_acc1")]
    moved = [Column("transfer top-K", "transfer_top_acc1"),
             Column("transfer random K", "transfer_random_acc1")]
    columns = [*probes, Column("mAP@10", "mAP@10"), Column("NCL map", "ncl_map"), *moved]
    rows = [Row(f"{v.name} K={k}", v.name, f"K{k}.") for v in variants for k in ks]
    paper = _ncl_fs_paper(d) if dataset == "imagenet100" and 512 in ks else {}
    transfer = TRANSFER_DATA.get(cfg.data.name)
    # in domain left, transfer right (a panel only where its columns are measured); a series is named by
    # the probe, not the column, so that it keeps its colour in both panels
    drawn = [("in domain", probes), *([(f"transfer: {transfer[0]}", moved)] if transfer else [])]
    panels = [Panel(title, "selected dims K", "linear probe Acc@1 (%)", tuple(
        Series(f"{v.name} {probe.header}", tuple((k, f"{v.name} K={k}", c.key) for k in ks),
               tuple((512.0, p[c.key]) for r, p in paper.items() if r == f"{v.name} K=512" and c.key in p))
        for v in variants for probe, c in zip(probes, cols, strict=True)), xscale="log")
        for title, cols in drawn]  # fmt: skip
    authors = cfg.eval.selection_probe == "authors"
    probe_note = ("the NCL authors' probe (eval.selection_probe=authors): SGD lr 1.0, batch 128, 50 epochs "
                  "on the top-K dims of the projector output p by expected activation (dims 0..K-1 in the "
                  "first epoch, as their code) vs K random dims of p (seed = run seed); p of un-augmented "
                  "images"
                  if authors else
                  "fast linear probe on the top-K train-ranked dims of z̃ vs K random dims (seed = run seed)")
    notes = [probe_note,
             "mAP@10: ours (cosine, re-normalised top-K); NCL map: the NCL repository's main_eval.py number "
             "(Euclidean, un-renormalised top-K slices), the one its paper reports (10.9 -> 14.2)",
             ]  # fmt: skip
    # "selection", not the older "fs": a stored run's cached "fs" cells were probed on the top-K columns in
    # rank order (K = D then differed from random K by ~0.01 points); the new name recomputes them
    probe = ("selection_authors", ks) if authors else ("selection", ks)
    measures: list[tuple[str, tuple[object, ...]]] = [probe, ("retrieval", ks), ("nclmap", ks)]
    extra: tuple[tuple[str, DataConfig], ...] = ()
    if transfer:
        name, n_train, n_test = transfer
        sizes = ", ".join(f"{s} {n or 'all'}" for s, n in (("train", n_train), ("test", n_test)))
        form = " (the fast form)" if authors else ""
        notes.append(f"transfer: the same two probes{form} on {name} ({sizes}; through the frozen encoder "
                     f"at the run's image size), the top-K dims ranked on {name}'s own train z̃, as the NCL "
                     "code's selected-dims probe ranks on the split it is fitted on "
                     "(docs/paper-notes.md N13)")
        measures.append(("fs_transfer", (transfer, ks)))
        what = f"ncl-fs's transfer set {name} (studies.TRANSFER_DATA for {cfg.data.name})"
        extra = ((what, transfer_config(cfg, *transfer).data),)
    else:
        notes.append(f"transfer columns empty: no transfer set for data.name={cfg.data.name} "
                     "(studies.TRANSFER_DATA)")
    if paper:
        notes.append("paper transfer accuracy (NCL: all dims 19.9, top 512 19.8) as our summary of the paper "
                     "records it; the transfer set behind it is not named in our sources")
    title = "NCL paper: feature selection (top-K by expected activation vs random K)"
    return Study("ncl-fs", title, "ncl-fs", variants, measures, columns, rows, paper, panels, notes=notes,
                 extra_data=extra)


# images (two augmented views each) of SEPIN about x (a module constant: a test shortens it)
SEPIN_X_IMAGES = 10000
# the NCL paper's SEPIN on ImageNet-100, ×10⁻² (PAPER-NOTES)
NCL_SEPIN_PAPER = {"CL": {"sepin_x@100": 0.69, "sepin_x@all": 0.47},
                   "NCL": {"sepin_x@100": 3.87, "sepin_x@all": 0.48}}  # fmt: skip


def _ncl_sepin(dataset: str, overrides: list[str]) -> Study:
    d = base_config(dataset, "ncl", overrides).model.proj_dim
    ks: list[int | str] = [k for k in (1, 10, 100) if k <= d]
    dropped = [str(k) for k in (1, 10, 100) if k > d]
    ks.append("all")
    variants = _method_pair(("CL", "NCL"))
    # SEPIN_x: about the input x (the paper's quantity, Do & Tran's I(x; z_i | z_≠i)), estimated from
    # two augmented views per image; SEPIN_y: about the label y, the estimate this study had before
    # (its keys sepin@k stay as they were, so stored results keep their meaning)
    columns = [Column(f"SEPIN_x@{k}", f"sepin_x@{k}", "{:.3f}") for k in ks]
    columns += [Column(f"SEPIN_y@{k}", f"sepin@{k}", "{:.3f}") for k in ks]
    paper = NCL_SEPIN_PAPER if dataset == "imagenet100" and "100" not in dropped else {}
    notes = [
        "SEPIN in 10⁻² nats. SEPIN_x: about the input x, I(x; z_i | z_≠i) as in the NCL paper, our Gaussian "
        f"estimate from two training augmentations of {SEPIN_X_IMAGES} train images (fewer if the split "
        "is smaller); the paper does not give its estimator, so its values (ImageNet-100) agree with "
        "ours in meaning and unit, not necessarily in estimator. SEPIN_y: about the class label y, "
        "another quantity (docs/metrics.md, \"SEPIN@k\")",
    ]
    if dropped:
        notes.append(f"SEPIN@{', @'.join(dropped)} left out: more than D={d} dims")
    measures = [("sepin_x", (SEPIN_X_IMAGES, *ks)), ("sepin", tuple(ks))]
    return Study("ncl-sepin", "NCL paper: disentanglement SEPIN@k", "ncl-sepin", variants, measures,
                 columns, rows_of(variants), paper, notes=notes)  # fmt: skip


FINETUNE_CPU_EPOCHS = 3  # fashion-mnist's fine-tuning budget (a module constant: a test shortens it)


def finetune_params(dataset: str, overrides: list[str]) -> tuple[str, ...]:
    """The ``train.*`` overrides of the study's fine-tuning on top of the authors' protocol
    (:data:`bayesncl.app.finetune.PROTOCOL`): none on the GPU datasets; on fashion-mnist (the CPU
    budget) :data:`FINETUNE_CPU_EPOCHS` epochs, 1 warmup epoch, the pretraining batch."""
    if dataset != "fashion-mnist":
        return ()
    batch = base_config(dataset, "ncl", overrides).train.batch_size
    return (f"train.epochs={FINETUNE_CPU_EPOCHS}", "train.warmup_epochs=1", f"train.batch_size={batch}")


def _ncl_finetune(dataset: str, overrides: list[str]) -> Study:
    variants = [Variant("CL", "cl"), Variant("NCL", "ncl"), Variant("BayesNCL", "bayesncl")]
    columns = [Column("FT@1", "ft_acc1"), Column("FT@5", "ft_acc5")]
    paper = {"CL": {"ft_acc1": 77.3}, "NCL": {"ft_acc1": 79.2}} if dataset == "imagenet100" else {}
    params = finetune_params(dataset, overrides)
    notes = [
        "bayesncl finetune of each run: backbone + linear head end to end on the labelled train split, "
        "test accuracy; the authors' protocol (30 epochs, LARS 0.4, weight decay 1e-4, warmup-cosine)"
        + (f" with {' '.join(params)}" if params else ""),
        "paper (NCL, ImageNet-100): CL 77.3, NCL 79.2; BayesNCL is beyond the paper",
    ]
    return Study("ncl-finetune", "NCL paper: fine-tuning accuracy", "ncl-finetune", variants,
                 [("finetune", params)], columns, rows_of(variants), paper, notes=notes)  # fmt: skip


ABLATIONS = [  # Table 4's and Tables 9/10's variants
    Variant("full", "bayesncl"),
    Variant("soft gate", "bayesncl", ("method.gate=soft",)),
    Variant("no detach", "bayesncl", ("method.detach=false",)),
    Variant("1-layer head", "bayesncl", ("method.gate_depth=1",)),
    Variant("3-layer head", "bayesncl", ("method.gate_depth=3",)),
]


# the tables show a soft gate evaluated both ways (ablation_rows): eval.use_soft_gating is theirs to set
ABLATION_DEFINES = ("method.name", "method.gate", "method.detach", "method.gate_depth",
                    "eval.use_soft_gating")
SOFT_EVAL = "alpha."  # the key prefix of measure soft_eval's metrics: a soft gate's features gated by α
# what a soft gate's evaluation by α leaves as it is: the probes and kNN on h, the gate's open rate and mean α
UNGATED_KEYS = ("lp3_acc1", "lp3_acc5", "knn_acc1", "gate_open_rate", "gate_mean_alpha")
SOFT_ROWS_NOTE = (
    "soft gate: trained with the features gated by α; evaluated with the hard mask 1[α > threshold] (eval: "
    "hard mask, the authors' default, PAPER-NOTES §3) and with the features gated by α (eval: α, "
    "eval.use_soft_gating=true); one trained run, measured both ways; LP, kNN (on h) and the gate's rates "
    "are the same in both rows"
)


def ablation_rows(variants: list[Variant]) -> list[Row]:
    """The ablation tables' rows: one per variant, a soft-gated one (``method.gate=soft``) twice, as
    ``"<name> (eval: hard mask)"`` (its evaluation, metrics.json) and ``"<name> (eval: α)"`` (measure
    ``soft_eval``: keys :data:`SOFT_EVAL` + column key, but :data:`UNGATED_KEYS`)."""
    rows: list[Row] = []
    for v in variants:
        if "method.gate=soft" not in v.overrides:
            rows.append(Row(v.name, v.name))
            continue
        rows += [Row(f"{v.name} (eval: hard mask)", v.name),
                 Row(f"{v.name} (eval: α)", v.name, SOFT_EVAL, shared=UNGATED_KEYS)]  # fmt: skip
    return rows


def _table4(dataset: str, overrides: list[str]) -> Study:
    variants = ABLATIONS
    # the soft gate's: the authors evaluate with the hard mask unless eval.use_soft_gating (main_eval.py)
    values = {"full": (36.14, 70.44), "soft gate (eval: hard mask)": (33.15, 69.87),
              "no detach": (22.29, 67.47), "1-layer head": (40.85, 69.55),
              "3-layer head": (26.37, 68.09)}  # fmt: skip
    paper = {n: {SC.key: s, LP3.key: lp} for n, (s, lp) in values.items()} if dataset == "imagenet100" else {}
    columns = [SC, Column("H_f", "semantic_entropy_freq", "{:.3f}"), LP3, LP5]
    notes = ["LP@1/LP@5: the fast probe on frozen h, mean of 3 probe seeds per run (the paper: 3 seeds)",
             SOFT_ROWS_NOTE]  # fmt: skip
    return Study("4", "Table 4: BayesNCL ablations", "table4", variants, [("probe3", ()), ("soft_eval", ())],
                 columns, ablation_rows(variants), paper, defines=ABLATION_DEFINES, notes=notes)  # fmt: skip


def _tables9_10(dataset: str, overrides: list[str]) -> Study:
    """Appendix H's Tables 9/10: every metric of every Table 4 ablation (the paper's text gives none of
    their values)."""
    from bayesncl.metrics.registry import METRICS, NCL_CODE_METRICS

    k = table2_k(dataset, overrides)
    columns = [Column(m.short, m.key, m.short_fmt.replace(":d", ":.1f")) for m in METRICS
               if m.key not in NCL_CODE_METRICS]  # fmt: skip
    columns += [LP3, LP5, Column("kNN@1", "knn_acc1"), *_retrieval_columns(k), GATE_OPEN_TEST, MEAN_ALPHA]
    notes = [f"the interpretability metrics of Table 1, the fast probe (3 seeds), kNN on h, retrieval on "
             f"the top-{k} dims, and the gate's open rate (share of α > threshold) and mean α on the test "
             "split, for each ablation of Table 4", SOFT_ROWS_NOTE]  # fmt: skip
    measures: list[tuple[str, tuple[object, ...]]] = [
        ("probe3", ()), ("retrieval_sel", (k,)), ("soft_eval", (k,))]
    return Study("9", "Tables 9/10 (Appendix H): every metric of every BayesNCL ablation", "table9-10",
                 ABLATIONS, measures, columns, ablation_rows(ABLATIONS), defines=ABLATION_DEFINES,
                 notes=notes)  # fmt: skip


def _table7(dataset: str, overrides: list[str]) -> Study:
    variants = [Variant("NCL", "ncl"), Variant("BayesNCL", "bayesncl")]
    values = {"cifar100": ((70.95, 1.416), (75.12, 1.419)), "imagenet100": ((193.78, 3.731), (218.53, 3.815))}
    paper = {v.name: {"pretrain_minutes": m, "gflops_per_image": g}
             for v, (m, g) in zip(variants, values.get(dataset, ()), strict=False)}  # fmt: skip
    columns = [Column("minutes", "pretrain_minutes"), Column("GFLOPs/img", "gflops_per_image", "{:.3f}")]
    return Study("7", "Table 7: compute (pretraining minutes, FLOPs per image)", "table7", variants,
                 [("flops", ())], columns, rows_of(variants), paper)  # fmt: skip


def _headline(dataset: str, overrides: list[str]) -> Study:
    """The BayesNCL paper's headline (its abstract, Table 1): BayesNCL's SC above NCL's at the same LP@1,
    measured at the ρ/λ and backbone the user gives (``method.rho``/``method.lam`` reach BayesNCL only:
    NCL reads neither, so its stored runs are reused), with the gate's open rate and mean α beside ρ."""
    cfg = base_config(dataset, "bayesncl", overrides)
    variants = [Variant("NCL", "ncl"), Variant("BayesNCL", "bayesncl")]
    notes = [f"BayesNCL at ρ = {cfg.method.rho:g}, λ = {cfg.method.lam:g}, backbone {cfg.model.backbone}, "
             f"{cfg.train.epochs} epochs; NCL at the same backbone and budget (it reads no ρ/λ)"]
    return Study("headline", "The BayesNCL headline: NCL against BayesNCL at a given ρ/λ and backbone",
                 "headline", variants, [("base", ())],
                 [SC, HSUM, ACT, LP1, GATE_OPEN_TEST, MEAN_ALPHA],
                 rows_of(variants), notes=notes)  # fmt: skip


STUDIES: dict[str, Callable[[str, list[str]], Study]] = {
    "1": _table1, "2": _table2, "3": _table3, "4": _table4, "5": _table5, "7": _table7, "9": _tables9_10,
    "15": _table15, "fig3": _fig3, "fig4a": _fig4a, "fig4b": _fig4b, "ncl-fs": _ncl_fs,
    "ncl-sepin": _ncl_sepin, "ncl-finetune": _ncl_finetune, "convergence": _convergence,
    "headline": _headline,
}  # fmt: skip
"""``bayesncl reproduce ID``: the IDs and their builders."""


# paper.ncl_studies adds its studies to STUDIES when imported; paper.reproduce imports it, so every ID is
# there wherever a study is built.


MECHANISM_IDS = ("6", "mechanism")  # issue 15's tables: bayesncl.paper.mechanism (dispatched by the CLI)


def build(study_id: str, dataset: str, overrides: list[str]) -> Study:
    """The concrete study ``study_id`` on ``dataset`` with the user's ``overrides``.

    Raises ConfigError (one line) for an unknown ID (listing the valid ones), an unknown dataset,
    or a bad override."""
    if study_id not in STUDIES:
        # tables by number, then the rest by name (modules register theirs in import order)
        ids = sorted(STUDIES, key=lambda i: (not i.isdigit(), int(i) if i.isdigit() else 0, i))
        valid = ", ".join([*ids, *MECHANISM_IDS])
        raise ConfigError(f"reproduce {study_id!r}: no such table or figure; expected one of {valid}")
    if dataset not in DATASETS:
        raise ConfigError(f"--dataset {dataset!r}: expected one of {', '.join(DATASETS)}")
    return STUDIES[study_id](dataset, overrides)
