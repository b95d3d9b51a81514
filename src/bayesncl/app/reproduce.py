"""One command per paper table: ``bayesncl reproduce TABLE --dataset DS``.

Each table is a list of variants (a recipe plus overrides). Every variant pretrains into
``RUN_DIR/<variant>`` and is evaluated on the test split; a variant whose ``metrics.json`` already
exists is reused, so an interrupted reproduction continues where it stopped. The table is printed
next to the paper's numbers and written as ``table<N>.md`` / ``table<N>.json``.

Paper numbers: PAPER-NOTES §4 (BayesNCL paper Tables 1, 2, 4, 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bayesncl.app import variants
from bayesncl.app.report import format_table
from bayesncl.config import Config, ConfigError, build_config, refuse_fixed_keys

RECIPES = Path(__file__).parents[1] / "configs"
DATASETS = ("cifar10", "cifar100", "imagenet100", "fashion-mnist")


@dataclass(frozen=True)
class Variant:
    name: str
    method: str
    overrides: tuple[str, ...] = ()


TABLES: dict[str, dict[str, Any]] = {
    "1": {
        "title": "Table 1: interpretability",
        "variants": [
            Variant("CL", "cl"),
            Variant("NCL", "ncl"),
            Variant("NCL+TopK", "ncl-topk"),
            Variant("BayesNCL (GS)", "bayesncl-gs"),
            Variant("BayesNCL (STE)", "bayesncl"),
        ],
        "columns": [
            ("SC %", "semantic_consistency", "{:.2f}"),
            ("H_sum", "semantic_entropy_sum", "{:.3f}"),
            ("Act.", "activation_ratio", "{:.3f}"),
            ("LP@1", "linear_probe_acc1", "{:.2f}"),
        ],
        "paper": {
            "cifar10": {
                "CL": 10.00,
                "NCL": 53.82,
                "NCL+TopK": 51.81,
                "BayesNCL (GS)": 53.68,
                "BayesNCL (STE)": 56.50,
            },
            "cifar100": {
                "CL": 1.00,
                "NCL": 9.91,
                "NCL+TopK": 12.32,
                "BayesNCL (GS)": 20.75,
                "BayesNCL (STE)": 22.02,
            },
            "imagenet100": {
                "CL": 1.00,
                "NCL": 14.93,
                "NCL+TopK": 14.27,
                "BayesNCL (GS)": 11.66,
                "BayesNCL (STE)": 36.14,
            },
        },
        "paper_key": "paper SC %",
    },
    "2": {
        "title": "Table 2: linear probe (fast probe on frozen h, mean of 3 seeds)",
        "variants": [Variant("CL", "cl"), Variant("NCL", "ncl"), Variant("BayesNCL", "bayesncl")],
        "columns": [
            ("LP@1", "linear_probe_acc1", "{:.2f}"),
            ("LP@5", "linear_probe_acc5", "{:.2f}"),
            ("kNN@1", "knn_acc1", "{:.2f}"),
        ],
        "paper": {
            "cifar10": {"CL": 87.88, "NCL": 87.80, "BayesNCL": 88.02},
            "cifar100": {"CL": 59.72, "NCL": 60.67, "BayesNCL": 60.69},
            "imagenet100": {"CL": 68.31, "NCL": 69.63, "BayesNCL": 70.44},
        },
        "paper_key": "paper LP@1",
        "probe_seeds": 3,
    },
    "4": {
        "title": "Table 4: BayesNCL ablations",
        "variants": [
            Variant("full", "bayesncl"),
            Variant("soft gate", "bayesncl", ("method.gate=soft",)),
            Variant("no detach", "bayesncl", ("method.detach=false",)),
            Variant("1-layer head", "bayesncl", ("method.gate_depth=1",)),
            Variant("3-layer head", "bayesncl", ("method.gate_depth=3",)),
        ],
        "columns": [
            ("SC %", "semantic_consistency", "{:.2f}"),
            ("LP@1", "linear_probe_acc1", "{:.2f}"),
        ],
        "paper": {
            "imagenet100": {
                "full": 36.14,
                "soft gate": 33.15,
                "no detach": 22.29,
                "1-layer head": 40.85,
                "3-layer head": 26.37,
            },
        },
        "paper_key": "paper SC %",
    },
    "7": {
        "title": "Table 7: compute (pretraining wall time and FLOPs per image)",
        "variants": [Variant("NCL", "ncl"), Variant("BayesNCL", "bayesncl")],
        "columns": [
            ("minutes", "pretrain_minutes", "{:.2f}"),
            ("GFLOPs/img", "gflops_per_image", "{:.3f}"),
        ],
        "paper": {
            "cifar100": {"NCL": 70.95, "BayesNCL": 75.12},
            "imagenet100": {"NCL": 193.78, "BayesNCL": 218.53},
        },
        "paper_key": "paper minutes",
    },
}


def recipe_for(dataset: str, method: str) -> Path:
    """The shipped recipe for ``dataset`` × ``method`` (fashion-mnist uses the demo budget)."""
    if dataset == "fashion-mnist":
        return RECIPES / "fashion-mnist-demo.yaml"
    return RECIPES / f"{dataset}-{method}.yaml"


def table_configs(table: str, dataset: str, overrides: list[str]) -> dict[str, Config]:
    """Resolve every variant's config up front (so a typo fails before any training)."""
    if table not in TABLES:
        raise ConfigError(f"table {table!r}: expected one of {', '.join(TABLES)}")
    if dataset not in DATASETS:
        raise ConfigError(f"--dataset {dataset!r}: expected one of {', '.join(DATASETS)}")
    defining = {"method.name"} | {o.split("=")[0] for v in TABLES[table]["variants"] for o in v.overrides}
    refuse_fixed_keys(overrides, defining, f"the variants of table {table}")
    return {
        v.name: build_config(
            recipe_for(dataset, v.method), [f"method.name={v.method}", *v.overrides, *overrides]
        )
        for v in TABLES[table]["variants"]
    }


def pretrain_minutes(run_dir: Path) -> float:
    """Pretraining time of a finished run, in minutes: the sum of its ``log.csv`` epoch times
    (``epoch_time_s``: the training loop alone, each epoch whole however often the run was resumed;
    not the data loading before it, the export or the evaluation after it). Table 7's "minutes".
    Raises RunDirError if the run has no readable log."""
    from bayesncl.app.report.curves import read_log

    return sum(row["epoch_time_s"] for row in read_log(run_dir)) / 60


def _slug(name: str) -> str:
    """``"BayesNCL (GS)"`` → ``"bayesncl-gs"``."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def _check_run_dir(run_dir: Path, configs: dict[str, Config], table: str) -> None:
    """Raise RunDirError for a run dir (or a variant's sub-folder to train into) that is a file,
    cannot be written, or holds a pretrain run (a table begun there goes on)."""
    from bayesncl.runs.rundir import _check_writable, refuse_a_run_in

    _check_writable(run_dir)  # e.g. a file: refused before the first variant's "== ..." line
    if not any((run_dir / _slug(name)).exists() for name in configs):
        refuse_a_run_in(run_dir, f"table {table}")
    for name in configs:
        if not variants.finished(run_dir / _slug(name)):  # a variant to train
            _check_writable(run_dir / _slug(name))


# what table 2 takes from its own evaluation (kNN, 3 probe seeds) of a variant another table finished
_TABLE2_KEYS = (
    "linear_probe_acc1",
    "linear_probe_acc5",
    "linear_probe_acc1_std",
    "linear_probe_acc5_std",
    "linear_probe_seeds",
    "linear_probe_protocol",
    "knn_acc1",
)


def _variant(table: str, name: str, cfg: Config, sub: Path) -> dict[str, Any]:
    """Train variant ``name`` into ``sub``, or reuse it when finished with the same settings; then
    fill in what ``table`` shows and the variant lacks (saved with it). Returns its metrics."""
    from bayesncl.app.evaluate import evaluate_command
    from bayesncl.app.train import pretrain

    seeds = TABLES[table].get("probe_seeds", 1)
    if variants.finished(sub):
        variants.refuse_other_settings(sub, cfg, "use another --run-dir for the new settings")
        print(f"== {name}: reusing {sub / 'metrics.json'}")
        m = variants.finished_metrics(sub)
    else:
        print(f"== {name}: pretraining into {sub}")
        # table 2 evaluates once, below (kNN and more probe seeds), not also at the end of training
        m = pretrain(cfg, sub, resume=(sub / "last.pt").exists(), evaluate=table != "2")
        if table == "2":
            m = evaluate_command(sub, retrieval_dims=None, knn=True, probe_seeds=seeds)
        m["pretrain_minutes"] = pretrain_minutes(sub)
        variants.save_metrics(sub, name, m)
    before = dict(m)
    if table == "2" and "knn_acc1" not in m:  # finished by another table (no kNN) or an older version
        full = evaluate_command(sub, retrieval_dims=None, knn=True, probe_seeds=seeds)
        m.update({k: full[k] for k in _TABLE2_KEYS if k in full})
    if table == "7":  # FLOPs (new variants too); a variant timed by an older version: re-timed
        from bayesncl.app.benchmark import flops_per_image

        if "gflops_per_image" not in m:  # (builds the model: only where it is missing)
            m["gflops_per_image"] = flops_per_image(cfg) / 1e9
        if (sub / "log.csv").exists():  # (a variant copied in by hand may have no log)
            m["pretrain_minutes"] = pretrain_minutes(sub)
    if m != before:
        variants.save_metrics(sub, name, m)
    return m


def reproduce(table: str, dataset: str, run_dir: Path | None, overrides: list[str]) -> dict[str, Any]:
    """Run (or reuse) every variant of ``table`` on ``dataset``, print and write the table
    (``table<N>.md``/``.json``, ``curves.png``) and return ``{variant: metrics}``; each variant's
    row carries the paper's value (PAPER-NOTES §4) under ``TABLES[table]["paper_key"]``.

    Raises ConfigError for a bad table, dataset or override and RunDirError for a run dir (or a
    variant's sub-folder to train into) that is a file or cannot be written, before any output."""
    configs = table_configs(table, dataset, overrides)
    spec = TABLES[table]
    run_dir = run_dir or Path("runs") / f"table{table}-{dataset}"
    _check_run_dir(run_dir, configs, table)
    results: dict[str, dict[str, Any]] = {}
    for name, cfg in configs.items():
        m = _variant(table, name, cfg, run_dir / _slug(name))
        m[spec["paper_key"]] = spec["paper"].get(dataset, {}).get(name)
        results[name] = m
    columns = [*spec["columns"], (spec["paper_key"], spec["paper_key"], "{:.2f}")]
    md = format_table(results, columns)
    header = f"{spec['title']} on {dataset} (ours vs the paper's reported value)."
    run_dir.mkdir(parents=True, exist_ok=True)
    logged = {n: run_dir / _slug(n) for n in configs if (run_dir / _slug(n) / "log.csv").exists()}
    variants.write_table(run_dir, f"table{table}", results, md, header, logged)  # (a copy by hand: no log)
    print(header)
    print(md)
    return results
