"""The main job: NCL vs BayesNCL on Fashion-MNIST with the same budget, one side-by-side table.

Budget (2 CPU cores, about 6-7 minutes in all, under the 10-minute cap): ResNet-18 with the
ImageNet stem on 28 px gray images (about 1,000 img/s here; the CIFAR stem would be ~20× slower),
a class-stratified 20,000-image train subset, 3 epochs, batch 256. The choice of ρ and λ for
this scale is explained in docs/decisions.md ("Demo scale").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bayesncl.config import Config, build_config
from bayesncl.report import format_table, write_results

DEMO_CONFIG = Path(__file__).parent / "configs" / "fashion-mnist-demo.yaml"
DEMO_METHODS = ("ncl", "bayesncl")
QUICK_OVERRIDES = [
    "data.train_subset=2000",
    "data.test_subset=1000",
    "train.epochs=1",
    "train.batch_size=128",
]


def demo_configs(overrides: list[str], quick: bool = False) -> dict[str, Config]:
    """One resolved config per method, identical except for ``method.name``'s preset."""
    extra = (QUICK_OVERRIDES if quick else []) + list(overrides)
    return {m: build_config(DEMO_CONFIG, [*extra, f"method.name={m}"]) for m in DEMO_METHODS}


def run_demo(run_dir: Path | None, overrides: list[str], quick: bool = False) -> dict[str, Any]:
    """Pretrain + evaluate each method into ``run_dir/<method>``; write ``table.md``/``table.json``.

    Everything is validated (configs, data, run dir) before the first epoch starts.
    Raises ConfigError / DataError / RunDirError on bad input.
    """
    from bayesncl.checkpoint import RunDirError
    from bayesncl.data import dataset_info
    from bayesncl.train import pretrain

    configs = demo_configs(overrides, quick)
    for cfg in configs.values():
        dataset_info(cfg.data)
    run_dir = run_dir or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise RunDirError(f"run dir {run_dir} already exists and is not empty; choose another --run-dir")
    print(f"run dir: {run_dir}")
    results: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    for name, cfg in configs.items():
        print(f"== {name}: {cfg.model.backbone}, {cfg.train.epochs} epochs on {cfg.data.name} ==")
        t = time.time()
        results[name] = pretrain(cfg, run_dir / name)
        results[name]["pretrain_eval_time_s"] = round(time.time() - t, 1)
    table = format_table(results)
    c = next(iter(configs.values()))
    header = (
        f"NCL vs BayesNCL on {c.data.name} ({c.data.train_subset or 'all'} train images, "
        f"{c.train.epochs} epoch(s), {c.model.backbone}, D={c.model.proj_dim}; "
        f"BayesNCL rho={configs['bayesncl'].method.rho}, lambda={configs['bayesncl'].method.lam}). "
        "Test split; SC in %, entropies in nats, LP@1 = fast linear probe on frozen h."
    )
    write_results(run_dir, "table", results, table, header=header)
    print()
    print(header)
    print(table)
    print(f"\ntotal time {time.time() - t0:.0f} s; table saved to {run_dir / 'table.md'} and table.json")
    return results
