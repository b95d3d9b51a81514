"""Throughput of the real training loop (``bayesncl.app.train.pretrain``), single process or torchrun.

Where ``bayesncl benchmark`` times train steps in isolation, this runs ``pretrain`` itself on the
built-in synthetic 32×32 RGB set (5000 images, nothing downloaded) for a few epochs, without the
final evaluation, and reads the per-epoch wall time that the loop logs (``log.csv``:
``epoch_time_s``, measured from the first batch to the epoch's last host sync, checkpoint writing
excluded). The first epoch (cuDNN autotuning, allocator warm-up, torch.compile) is dropped from the
rate and reported apart: ``first_epoch_s``, and ``warmup_s`` = it minus a steady epoch (the compile).

images/s = global images per epoch / median epoch time, where an image is one two-view pair and
global = ``train.batch_size`` × processes × steps per epoch. The estimated time of 200 CIFAR-100
epochs (50,000 images each) follows from it.

Usage::

    python benchmarks/bench_train.py [--epochs 6] [--run-dir runs/bench-train] [key=value ...]
    torchrun --standalone --nproc_per_node=8 benchmarks/bench_train.py [...]

Defaults: ``method.name=bayesncl``, ``model.backbone=resnet18``, batch 256, CIFAR stem, on CUDA
when available (else CPU, where this takes minutes: pass e.g. ``model.backbone=small_cnn``).
Prints one JSON object (rank 0 only).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

import torch

from bayesncl.config import build_config
from bayesncl.core.distributed import is_main_process
from bayesncl.core.engine import compile_plan

DEFAULTS = [
    "data.name=synthetic",
    "method.name=bayesncl",
    "model.backbone=resnet18",
    "model.cifar_stem=true",
    "train.batch_size=256",
    "train.warmup_epochs=1",
    "train.progress=false",
    "train.checkpoint_every=0",
]
TARGET, AIM = 11_200, 20_000  # pairs/s on one H200: 200 CIFAR-100 epochs in 15 min; the aim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6, help="epochs to run; the first is not timed (default 6)")
    ap.add_argument("--run-dir", default="runs/bench-train", help="run dir, replaced if it exists")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    args = ap.parse_args()
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch is not timed)")
    cfg = build_config(overrides=[*DEFAULTS, f"train.epochs={args.epochs}", *args.overrides])

    from bayesncl.app.train import pretrain

    t0 = time.time()
    pretrain(cfg, Path(args.run_dir), overwrite=True, evaluate=False)
    wall = time.time() - t0
    if not is_main_process():
        return
    rows = list(csv.DictReader((Path(args.run_dir) / "log.csv").open()))
    steps_per_epoch = int(rows[0]["step"])
    times = [float(r["epoch_time_s"]) for r in rows[1:]]
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's; the process group is closed by now
    images = steps_per_epoch * cfg.train.batch_size * world
    steady = statistics.median(times)
    rate = images / steady
    first = float(rows[0]["epoch_time_s"])
    device = "cuda" if cfg.train.device != "cpu" and torch.cuda.is_available() else "cpu"
    print(
        json.dumps(
            {
                "images_per_s": round(rate, 1),
                "epoch_time_s": times,
                "images_per_epoch": images,
                "processes": world,
                "per_process_batch": cfg.train.batch_size,
                "method": cfg.method.name,
                "backbone": cfg.model.backbone,
                "cifar_stem": cfg.model.cifar_stem,
                "precision": cfg.train.precision,
                "channels_last": cfg.train.channels_last,
                "compile": compile_plan(cfg.train.compile, torch.device(device)),
                "compile_mode": cfg.train.compile_mode,
                "first_epoch_s": first,
                "warmup_s": round(first - steady, 1),
                "target_images_per_s": TARGET,
                "aim_images_per_s": AIM,
                "device": device,
                "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                "cifar100_200_epochs_min": round(200 * 50_000 / rate / 60, 1),
                "wall_s": round(wall, 1),
                "date": time.strftime("%Y-%m-%d"),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
