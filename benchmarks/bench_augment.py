"""Two-view augmentation throughput: resident batched (kornia) vs per-sample (PIL + DataLoader).

Synthetic 32x32 RGB data, the paper's augmentation (PAPER-NOTES §2), no model. Two measurements,
each in images/s (one image = one two-view pair):

* ``augment``: the augmentation alone — BatchAugment on uint8 batches indexed from a tensor vs
  the torchvision v2 transform applied image by image to PIL images, in one Python loop;
* ``loader``: the whole model-free pipeline — iterating an epoch of ``build_train_loader`` with
  ``data.resident=true`` vs ``false`` (DataLoader, ``--workers`` workers), tensors on ``--device``.

Usage: ``python benchmarks/bench_augment.py [--n 4096] [--batch-size 256] [--workers 0]
[--device cpu] [--threads 0] [--repeats 3]``. Prints one line per path and the ratio batched / per-sample.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bayesncl.config import DataConfig
from bayesncl.data import BatchAugment, augment_spec, build_train_loader, sample_transform
from bayesncl.data.augment import seeded
from bayesncl.data.images import tensor_pil
from bayesncl.data.sources import load_split


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_rate(fn: Callable[[], int], repeats: int, device: torch.device) -> float:
    """Median images/s over ``repeats`` timed calls of ``fn`` (which returns the images it made)."""
    rates = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        n = fn()
        _sync(device)
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_augment(
    cfg: DataConfig, batch_size: int, device: torch.device, repeats: int
) -> tuple[float, float]:
    spec = augment_spec(cfg)
    images = load_split(cfg, "train").images
    assert images is not None
    n = (len(images) // batch_size) * batch_size
    batched = BatchAugment(spec)
    resident = images.to(device)
    with seeded(0, device):  # warm-up
        batched(resident[:batch_size].float().div(255))

    def run_batched() -> int:
        with seeded(1, device):
            for lo in range(0, n, batch_size):
                x = resident[lo : lo + batch_size].float().div_(255)
                batched(torch.cat([x, x]))  # both views in one call, as the resident loader does
        return n

    tf = sample_transform(spec)
    pils = [tensor_pil(images, i)[0] for i in range(n)]

    def run_sample() -> int:
        with seeded(2):
            for lo in range(0, n, batch_size):
                v1 = torch.stack([tf(p) for p in pils[lo : lo + batch_size]]).to(device)
                v2 = torch.stack([tf(p) for p in pils[lo : lo + batch_size]]).to(device)
                del v1, v2
        return n

    return _median_rate(run_batched, repeats, device), _median_rate(run_sample, repeats, device)


def bench_loader(
    cfg: DataConfig, batch_size: int, device: torch.device, workers: int, repeats: int
) -> tuple[float, float]:
    rates = []
    for resident in ("true", "false"):
        c = DataConfig(**{**cfg.__dict__, "resident": resident, "num_workers": workers})
        loader = build_train_loader(c, batch_size, seed=0, device=device)
        loader.set_epoch(0)
        next(iter(loader))  # warm-up (and worker start-up)

        def run(loader=loader) -> int:
            loader.set_epoch(loader.epoch + 1)
            return sum(len(x1) for x1, _x2, _y in loader)

        rates.append(_median_rate(run, repeats, device))
        del loader
    return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="synthetic training images used")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers of the per-sample path")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave as is)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = DataConfig(name="synthetic", train_subset=args.n)
    print(
        f"synthetic 32x32 RGB, n={min(args.n, 5000)}, batch={args.batch_size}, device={device}, "
        f"torch threads={torch.get_num_threads()}, per-sample workers={args.workers}, "
        f"median of {args.repeats} repeats"
    )
    b, s = bench_augment(cfg, args.batch_size, device, args.repeats)
    print(f"augment  batched kornia : {b:9.0f} images/s (two views each)")
    print(f"augment  per-sample PIL : {s:9.0f} images/s")
    print(f"augment  ratio          : {b / s:9.2f}x")
    b, s = bench_loader(cfg, args.batch_size, device, args.workers, args.repeats)
    print(f"loader   resident       : {b:9.0f} images/s")
    print(f"loader   per-sample     : {s:9.0f} images/s")
    print(f"loader   ratio          : {b / s:9.2f}x")


if __name__ == "__main__":
    main()
