"""One command per paper table: ``bayesncl reproduce TABLE --dataset DS``.

Each table is a list of variants (a recipe plus overrides). Every variant pretrains into
``RUN_DIR/<variant>`` and is evaluated on the test split; a variant whose ``metrics.json`` already
exists is reused, so an interrupted reproduction continues where it stopped. The table is printed
next to the paper's numbers and written as ``table<N>.md`` / ``table<N>.json``.

Paper numbers: PAPER-NOTES §4 (BayesNCL paper Tables 1, 2, 4, 7).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bayesncl.app.report import format_table, write_results
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


def reproduce(table: str, dataset: str, run_dir: Path | None, overrides: list[str]) -> dict[str, Any]:
    """Run (or reuse) every variant of ``table`` on ``dataset`` and write the table. returns results.

    Raises ConfigError for a bad table, dataset or override and RunDirError for a run dir (or a
    variant's sub-folder to train into) that is a file or cannot be written, before any output."""
    from bayesncl.app.evaluate import evaluate_command
    from bayesncl.app.report.curves import write_training_curves
    from bayesncl.app.train import pretrain
    from bayesncl.runs.rundir import _check_writable, refuse_a_run_in

    configs = table_configs(table, dataset, overrides)
    spec = TABLES[table]
    run_dir = run_dir or Path("runs") / f"table{table}-{dataset}"
    _check_writable(run_dir)  # e.g. a file: refused before the first variant's "== ..." line
    if not any((run_dir / _slug(name)).exists() for name in configs):  # (a table begun goes on)
        refuse_a_run_in(run_dir, f"table {table}")
    for name in configs:
        if not (run_dir / _slug(name) / "metrics.json").exists():  # a variant to train
            _check_writable(run_dir / _slug(name))
    results: dict[str, dict[str, Any]] = {}
    for name, cfg in configs.items():
        sub = run_dir / _slug(name)
        done = sub / "metrics.json"
        if done.exists():
            from bayesncl.config import diff_configs
            from bayesncl.runs.export import load_run_config
            from bayesncl.runs.rundir import RunDirError

            changed = diff_configs(load_run_config(sub), cfg, ignore=("train.progress", "eval."))
            if changed:
                raise RunDirError(
                    f"{sub} holds a finished run with other settings ({', '.join(changed)}); "
                    "use another --run-dir for the new settings"
                )
            print(f"== {name}: reusing {done}")
            m = json.loads(done.read_text())
        else:
            print(f"== {name}: pretraining into {sub}")
            resume = (sub / "last.pt").exists()
            # table 2 evaluates once, below (kNN and more probe seeds), not also at the end of training
            m = pretrain(cfg, sub, resume=resume, evaluate=table != "2")
            if table == "2":
                m = evaluate_command(sub, retrieval_dims=None, knn=True, probe_seeds=spec["probe_seeds"])
            m["pretrain_minutes"] = pretrain_minutes(sub)
            write_results(sub, "metrics", m, format_table({name: m}))
        if table == "2" and "knn_acc1" not in m:  # a finished run from an older version
            full = evaluate_command(sub, retrieval_dims=None, knn=True, probe_seeds=spec["probe_seeds"])
            keys = (
                "linear_probe_acc1",
                "linear_probe_acc5",
                "linear_probe_acc1_std",
                "linear_probe_acc5_std",
                "linear_probe_seeds",
                "linear_probe_protocol",
                "knn_acc1",
            )
            m.update({k: full[k] for k in keys if k in full})
            write_results(sub, "metrics", m, format_table({name: m}))
        if table == "7":  # a variant timed by an older version: no FLOPs, or wall time around pretrain
            from bayesncl.app.benchmark import flops_per_image

            before = dict(m)
            if "gflops_per_image" not in m:  # (builds the model: only where it is missing)
                m["gflops_per_image"] = flops_per_image(cfg) / 1e9
            if (sub / "log.csv").exists():  # (a variant copied in by hand may have no log)
                m["pretrain_minutes"] = pretrain_minutes(sub)
            if m != before:
                write_results(sub, "metrics", m, format_table({name: m}))
        paper = spec["paper"].get(dataset, {}).get(name)
        m[spec["paper_key"]] = paper
        results[name] = m
    columns = [*spec["columns"], (spec["paper_key"], spec["paper_key"], "{:.2f}")]
    md = format_table(results, columns)
    header = f"{spec['title']} on {dataset} (ours vs the paper's reported value)."
    run_dir.mkdir(parents=True, exist_ok=True)
    write_results(run_dir, f"table{table}", results, md, header=header)
    logged = [name for name in configs if (run_dir / _slug(name) / "log.csv").exists()]
    if logged:  # (a variant copied in by hand may have no log)
        write_training_curves([run_dir / _slug(n) for n in logged], run_dir / "curves.png", labels=logged)
    print(header)
    print(md)
    return results
